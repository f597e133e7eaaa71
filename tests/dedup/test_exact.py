"""exact_dedup on the ground-truth corpus: planted duplicates go, nothing else, any task count."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.core.documents import schema_for
from gristmill.dedup.bloom import BloomFilter
from gristmill.dedup.exact import filter_slices
from gristmill.dedup.text import normalize
from gristmill.pipeline.planning.on_parquet import plan_on_parquet, run_on_parquet
from tests.cli_process import pipeline


def _table(folder):
    t = pq.read_table(folder).to_pydict()
    return sorted(zip(t["id"], t["text"]))


def test_planted_exact_duplicates_all_removed_and_nothing_else(dedup_corpus, corpus_ids, tmp_path):
    stages = run_on_parquet(
        "exact_dedup", {"capacity": 100_000, "fp_rate": 1e-6}, dedup_corpus / "docs", tmp_path / "r", tasks=2
    )
    kept = {i for i, _ in _table(stages[-1].output)}
    removed = set(corpus_ids) - kept
    truth = pq.read_table(dedup_corpus / "truth.parquet").to_pydict()
    docs = pq.read_table(dedup_corpus / "docs", columns=["id", "text"]).to_pydict()
    first: dict[str, str] = {}  # normalised text -> first id in corpus order (files, then rows)
    expected = set()
    for i, text in zip(docs["id"], docs["text"]):
        key = normalize(text)
        if key in first:
            expected.add(i)
        else:
            first[key] = i
    planted = [(d, o) for d, o, k in zip(truth["id"], truth["original"], truth["kind"]) if k == "exact"]
    assert len(planted) == 300
    groups: dict[str, set[str]] = {}
    for d, o in planted:
        groups.setdefault(o, {o}).add(d)
    position = {i: n for n, i in enumerate(corpus_ids)}
    for g in groups.values():  # every planted copy but the group's first is removed
        later = sorted(g, key=position.__getitem__)[1:]
        assert set(later) <= removed
    assert removed == expected
    stats = json.loads((stages[1].folder / "stats.json").read_text())
    assert stats[0]["counters"]["duplicates"] == len(expected)


def test_same_output_for_1_and_4_tasks(dedup_corpus, tmp_path):
    params = {"granularity": "paragraph", "capacity": 200_000, "fp_rate": 1e-3, "min_doc_words": 50}
    out = [
        _table(run_on_parquet("exact_dedup", params, dedup_corpus / "docs", tmp_path / f"r{t}", tasks=t)[-1].output)
        for t in (1, 4)
    ]
    assert out[0] == out[1]
    assert 0 < len(out[0]) < 5000


def _write(folder, rows, source):
    folder.mkdir(parents=True)
    cols = {f.name: [None] * len(rows) for f in schema_for({})}
    cols.update(
        id=[r[0] for r in rows], text=[r[1] for r in rows], source=[source] * len(rows), offset=list(range(len(rows)))
    )
    pq.write_table(pa.table(cols, schema=schema_for({})), folder / "00000.parquet")


def test_paragraph_mode_removes_repeated_lines_then_short_documents(tmp_path):
    rows = [
        ("a", "The first paragraph here.\nShared boilerplate line, cookies!\nUnique A text"),
        ("b", "shared   BOILERPLATE line cookies\nUnique B text that is long enough to stay"),
        ("c", "Unique A text\nshared boilerplate line cookies"),
    ]
    _write(tmp_path / "in", rows, "s")
    st = run_on_parquet(
        "exact_dedup",
        {"granularity": "paragraph", "capacity": 1000, "min_doc_words": 3},
        tmp_path / "in",
        tmp_path / "r",
        tasks=2,
    )
    assert dict(_table(st[-1].output)) == {"a": rows[0][1], "b": "Unique B text that is long enough to stay"}


def test_saved_filter_dedups_a_second_crawl(dedup_corpus, tmp_path):
    docs = pq.read_table(dedup_corpus / "docs", columns=["id", "text"]).to_pydict()
    first = list(zip(docs["id"], docs["text"]))[:1000]
    _write(tmp_path / "crawl1", first, "crawl1")
    st1 = run_on_parquet("exact_dedup", {"capacity": 50_000}, tmp_path / "crawl1", tmp_path / "r1", tasks=2)
    kept1 = {i for i, _ in _table(st1[-1].output)}
    # crawl 2: 200 documents seen in crawl 1 (re-crawled with changed spacing and punctuation)
    # + 300 new ones (str.upper is not used: "İ".casefold() is not "i", so it changes the text)
    again = [(f"again-{i}", "  " + t.replace(" ", "  ").replace("\n", " !\n")) for i, t in first[:200]]
    new = list(zip(docs["id"], docs["text"]))[2000:2300]
    _write(tmp_path / "crawl2", again + new, "crawl2")
    st2 = run_on_parquet(
        "exact_dedup",
        {"capacity": 50_000, "filter_from": str(st1[1].folder / "filter")},
        tmp_path / "crawl2",
        tmp_path / "r2",
        tasks=3,
    )
    kept2 = {i for i, _ in _table(st2[-1].output)}
    assert not any(k.startswith("again-") for k in kept2)
    seen = {normalize(x) for _, x in first}
    new_unique = set()
    for i, t in new:  # new documents not in crawl 1 and not repeated earlier in crawl 2
        if normalize(t) not in seen:
            seen.add(normalize(t))
            new_unique.add(i)
    assert new_unique <= kept2 and len(kept1) > 900


@pytest.fixture(scope="module")
def earlier_run_filter(tmp_path_factory):
    """An earlier run's filter/ folder of 3 slices, made once for the tests below: each damages
    a copy of it (`_earlier_filter`)."""
    tmp = tmp_path_factory.mktemp("earlier")
    rows = [(f"d{i}", f"document number {i} with some text") for i in range(60)]
    _write(tmp / "crawl1", rows, "crawl1")
    st = run_on_parquet("exact_dedup", {"capacity": 50_000}, tmp / "crawl1", tmp / "r1", tasks=3)
    return st[1].folder / "filter"


def _earlier_filter(earlier_run_filter, tmp_path):
    """The earlier run's filter/ folder, copied where a user would keep it."""
    saved = tmp_path / "saved_filter"
    shutil.copytree(earlier_run_filter, saved)
    return saved


def test_partial_filter_from_is_refused_when_planned_naming_the_missing_slice(earlier_run_filter, tmp_path):
    saved = _earlier_filter(earlier_run_filter, tmp_path)
    (saved / "slice_00001.bloom").unlink()
    (saved / "slice_00001.bloom.json").unlink()
    _write(tmp_path / "crawl2", [("x", "a new document")], "crawl2")
    with pytest.raises(ValueError) as e:
        plan_on_parquet("exact_dedup", {"filter_from": str(saved)}, tmp_path / "crawl2", tmp_path / "r2", tasks=2)
    msg = str(e.value)
    assert f"exact_dedup.filter_from: {saved}: incomplete" in msg, msg
    assert "slice_00001.bloom" in msg and "missing" in msg, msg
    meta = json.loads((saved / "slice_00000.bloom.json").read_text())
    gap = json.loads((saved / "slice_00002.bloom.json").read_text())["block_lo"]
    assert f"blocks {meta['block_hi']}..{gap} " in msg, msg
    assert "\n" not in msg
    assert not (tmp_path / "r2").exists()  # refused before any stage folder was made


def test_bit_file_without_its_metadata_is_refused(earlier_run_filter, tmp_path):
    saved = _earlier_filter(earlier_run_filter, tmp_path)
    (saved / "slice_00002.bloom.json").unlink()
    with pytest.raises(ValueError, match=r"slice_00002.bloom without its .bloom.json"):
        filter_slices(saved)


def test_truncated_slice_is_refused_naming_file_and_sizes(earlier_run_filter, tmp_path):
    saved = _earlier_filter(earlier_run_filter, tmp_path)
    bits = saved / "slice_00002.bloom"
    expected = bits.stat().st_size
    with open(bits, "r+b") as f:  # a copy cut short, as by a full disk or an interrupted rsync
        f.truncate(expected - 100)
    with pytest.raises(ValueError) as e:
        filter_slices(saved)
    assert str(e.value).startswith(f"{bits}: {expected - 100} bytes, expected {expected}"), e.value
    with pytest.raises(ValueError, match=f"{bits}: {expected - 100} bytes, expected {expected}"):
        BloomFilter.open(bits)  # never numpy's "mmap length is greater than file size"


def test_partial_filter_from_stops_pipeline_run_before_any_stage(earlier_run_filter, tmp_path, wet_files):
    saved = _earlier_filter(earlier_run_filter, tmp_path)
    (saved / "slice_00000.bloom").unlink()  # the bits gone, the metadata left
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "executor": {"type": "local", "tasks": 1, "workers": 1},
        "input": {"paths": [str(wet_files[1])]},
        "steps": [{"exact_dedup": {"filter_from": str(saved)}}],
    }
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    res = pipeline("run", str(tmp_path / "c.yaml"), timeout=300)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert lines == [
        f"error: {saved / 'slice_00000.bloom'}: missing (its metadata slice_00000.bloom.json says it "
        f"holds blocks 0..{json.loads((saved / 'slice_00000.bloom.json').read_text())['block_hi']})"
    ], res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "run").exists()
