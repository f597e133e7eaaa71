"""Per-language views of a run: every filter's kept and dropped documents by language, followed
along the funnel, in `pipeline stats`, the HTML report and `gristmill.stats`, on the real WET
sample with every language kept."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from gristmill.config import from_dict
from gristmill.core.scores import LENGTH_BINS, MAX_LANGUAGES, OTHER_LANGUAGES, ScoreRecorder, merge
from gristmill.pipeline.report.journey import (
    as_json,
    funnel,
    journey,
    language_funnel,
    language_journey,
    language_summary,
    merge_run,
)
from gristmill.pipeline.report.page import write
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline

from .test_report import _chromium
from .test_run import config

LANG = "zh"  # the 2017 sample has Chinese pages; kept by langid here, then mostly dropped by the rules


def multilingual(run_dir, wet_files, lid_model, steps: list[dict] | None = None, **extra) -> dict:
    cfg = config(run_dir, wet_files, lid_model, **extra)
    cfg["steps"][0]["langid"]["languages"] = None  # keep every language
    if steps is not None:
        cfg["steps"] = steps
    return cfg


@pytest.fixture(scope="module")
def lang_run(tmp_path_factory, wet_files, lid_model):
    """langid (every language) → the heuristic filters → paragraph exact dedup (its own stages)."""
    run_dir = tmp_path_factory.mktemp("langs") / "crawl"
    cfg = multilingual(run_dir, wet_files, lid_model)
    cfg["steps"].append({"exact_dedup": {"granularity": "paragraph", "capacity": 100_000, "min_doc_words": 50}})
    merged = run(from_dict(cfg))
    return run_dir, merged


def _dropped(run_dir) -> dict[tuple[str, str, str], int]:
    """(step, reason, language) → documents, read from every stage's dropped/ Parquet (a sample
    of 1.0: every dropped document)."""
    out: Counter = Counter()
    for folder in sorted(run_dir.glob("*/dropped/*")):
        t = pq.read_table(folder, columns=["language", "drop_reason"])
        for lang, reason in zip(t.column("language").to_pylist(), t.column("drop_reason").to_pylist()):
            out[(folder.name, reason, lang or "unknown")] += 1
    return out


def _final_output(run_dir):
    return pq.read_table(sorted(run_dir.glob("*_exact_dedup_filter"))[-1] / "output")


def test_languages_add_up_to_every_row_of_the_funnel(lang_run):
    run_dir, merged = lang_run
    rows = funnel(merged)
    by_lang = language_funnel(merged)
    assert {"en", "zh", "ru", "ja", "fa"} <= set(by_lang)
    assert "unknown" not in by_lang  # langid is the first step: every document read got its label
    for i, row in enumerate(rows):
        cells = [lrows[i] for lrows in by_lang.values()]
        assert all((c.stage, c.step, c.kind) == (row.stage, row.step, row.kind) for c in cells)
        for key in ("docs_in", "docs_out", "bytes_in", "bytes_out"):
            assert sum(getattr(c, key) for c in cells) == getattr(row, key), (row.stage, row.step, key)
        drops: Counter = Counter()
        for c in cells:
            drops.update(c.drops)
        assert dict(drops) == {k: v for k, v in row.drops.items() if v}, (row.stage, row.step)
    # the dedup filter's row is counted by the filter itself, not spread from the rows before it
    dedup = next(i for i, r in enumerate(rows) if r.stage.endswith("exact_dedup_filter") and r.kind == "filter")
    assert rows[dedup].docs_in > rows[dedup].docs_out  # it dropped documents here
    assert any(lrows[dedup].drops for lrows in by_lang.values())


def test_the_journey_per_language_adds_up_and_ends_at_the_output(lang_run):
    """One row per step (exact dedup's three stages are one), per language summing to the
    journey's own, the last row's kept documents those of the final output."""
    run_dir, merged = lang_run
    rows = journey(merged)
    assert [r.step for r in rows] == [
        "read_wet",
        "00_langid",
        "01_gopher_quality",
        "02_gopher_repetition",
        "03_c4_lines",
        "04_exact_dedup",
    ]
    by_lang = language_journey(merged)
    assert set(by_lang) == set(language_funnel(merged))
    for i, row in enumerate(rows):
        cells = [lrows[i] for lrows in by_lang.values()]
        for key in ("docs_in", "docs_out", "bytes_in", "bytes_out"):
            assert sum(getattr(c, key) for c in cells) == getattr(row, key), (row.step, key)
        drops: Counter = Counter()
        for c in cells:
            drops.update(c.drops)
        assert dict(drops) == row.drops, row.step
    assert rows[-1].dropped > 0  # paragraph dedup left some documents too short
    out = _final_output(run_dir).column("language").to_pylist()
    for lang in (LANG, "es", "en"):
        assert by_lang[lang][-1].docs_out == out.count(lang), lang
        # each filter's drops of the language are the per-stage funnel's, one row per step
        per_stage = {r.step: r.drops for r in language_funnel(merged)[lang] if r.kind == "filter"}
        assert {r.step: r.drops for r in by_lang[lang][1:]} == per_stage, lang


@pytest.mark.parametrize("lang", [LANG, "es", "en"])  # all dropped; 2 of 10 kept; the majority
def test_a_language_matches_the_output_and_the_dropped_documents(lang_run, lang):
    run_dir, merged = lang_run
    rows = language_funnel(merged)[lang]
    dropped = _dropped(run_dir)
    out = _final_output(run_dir)
    kept = [t for t, la in zip(out.column("text").to_pylist(), out.column("language").to_pylist()) if la == lang]
    # read = kept at the end + dropped anywhere (every document read was either)
    dropped_here = sum(n for (_, _, la), n in dropped.items() if la == lang)
    assert rows[0].step == "read_wet" and rows[0].docs_in == rows[0].docs_out == len(kept) + dropped_here
    assert dropped_here > 0
    # every filter's drops of the language, by reason, equal the dropped documents of it it wrote
    steps = 0
    for r in rows:
        if r.kind == "filter":
            assert r.drops == {reason: n for (step, reason, la), n in dropped.items() if step == r.step and la == lang}
            steps += bool(r.drops)
    assert steps >= 2
    assert rows[-1].kind == "writer" and rows[-1].docs_out == len(kept)
    assert rows[-1].bytes_out == sum(len(t.encode()) for t in kept)
    # in the first stage's output too (before dedup)
    curate = pq.read_table(run_dir / "01_curate" / "output", columns=["language"]).column("language").to_pylist()
    writer = next(r for r in rows if r.stage == "01_curate" and r.kind == "writer")
    assert writer.docs_out == curate.count(lang)
    line = next(x for x in language_summary(language_funnel(merged)) if x["language"] == lang)
    assert (line["read"], line["kept"], line["bytes_kept"]) == (rows[0].docs_in, len(kept), rows[-1].bytes_out)
    assert sum(line["drops_by_step"].values()) == dropped_here


def test_steps_before_langid_take_its_labels(tmp_path, wet_files, lid_model):
    """A filter before langid: the reader's documents are counted by the language langid later
    gave them; the ones that filter dropped never got a label and count as "unknown"."""
    steps = [{"gopher_repetition": {}}, {"langid": {"model": str(lid_model), "languages": None, "min_score": 0.65}}]
    merged = run(
        from_dict(
            multilingual(
                tmp_path / "pre",
                wet_files,
                lid_model,
                steps=steps,
                executor={"type": "local", "tasks": 1, "workers": 1},
            )
        )
    )
    rows = funnel(merged)
    assert [r.step for r in rows] == ["read_wet", "00_gopher_repetition", "01_langid", "write_parquet"]
    by_lang = language_funnel(merged)
    rep_drops = rows[1].docs_in - rows[1].docs_out
    assert rep_drops > 0
    assert by_lang["unknown"][0].docs_out == by_lang["unknown"][1].docs_in == rep_drops
    assert by_lang["unknown"][1].drops == rows[1].drops and by_lang["unknown"][1].docs_out == 0
    for lang, lrows in by_lang.items():
        if lang != "unknown":
            assert lrows[0].docs_out == lrows[1].docs_in == lrows[1].docs_out == lrows[2].docs_in, lang
            assert lrows[0].bytes_out == lrows[2].bytes_in, lang
            assert not lrows[1].drops
    for i, row in enumerate(rows):
        assert sum(lr[i].docs_in for lr in by_lang.values()) == row.docs_in
        assert sum(lr[i].bytes_in for lr in by_lang.values()) == row.bytes_in
    # independently: langid's dropped documents of zh + its kept ones = what was read of zh
    t = pq.read_table(tmp_path / "pre" / "01_curate" / "dropped" / "01_langid", columns=["language"])
    out = pq.read_table(tmp_path / "pre" / "01_curate" / "output", columns=["language"])
    zh = t.column("language").to_pylist().count(LANG) + out.column("language").to_pylist().count(LANG)
    assert by_lang[LANG][0].docs_in == zh > 0


def test_run_without_language_records_is_all_unknown(lang_run, tmp_path):
    """A run directory written before languages were counted: one "unknown" language whose
    funnel is the whole funnel."""
    src, merged = lang_run
    run_dir = tmp_path / "old"
    shutil.copytree(src, run_dir)
    for part in run_dir.glob("*/scores/*/*.json"):
        rec = json.loads(part.read_text())
        del rec["languages"]
        part.write_text(json.dumps(rec))
    old = merge_run(run_dir)
    by_lang = language_funnel(old)
    assert list(by_lang) == ["unknown"]
    assert [
        (r.docs_in, r.docs_out, r.bytes_in, r.bytes_out, {k: v for k, v in r.drops.items() if v}) for r in funnel(old)
    ] == [(r.docs_in, r.docs_out, r.bytes_in, r.bytes_out, r.drops) for r in by_lang["unknown"]]


def test_stats_cli_per_language(lang_run):
    run_dir, merged = lang_run
    table = pipeline("stats", run_dir, check=True).stdout
    assert "per language" in table and "00_langid" in table
    zh = language_funnel(merged)[LANG]
    one = pipeline("stats", run_dir, "--language", LANG, check=True).stdout
    assert f"funnel of language {LANG}" in one and f"drops by reason, language {LANG}" in one
    read_line = next(ln for ln in one.splitlines() if "read_wet" in ln)
    assert f" {zh[0].docs_in:,} " in read_line
    for r in zh:
        for reason in r.drops:
            assert reason in one
    data = json.loads(pipeline("stats", run_dir, "--language", LANG, "--json", check=True).stdout)
    assert data == json.loads(json.dumps(as_json(merged, LANG)))
    assert data["funnel"][0]["docs_in"] == zh[0].docs_in
    full = json.loads(pipeline("stats", run_dir, "--json", check=True).stdout)
    assert full["by_language"][LANG]["read"] == zh[0].docs_in
    assert sum(v["read"] for v in full["by_language"].values()) == full["funnel"][0]["docs_in"]
    bad = pipeline("stats", run_dir, "--language", "xx")
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "'xx'" in bad.stderr and "zh" in bad.stderr


def test_report_has_a_per_language_section_in_chromium(lang_run, tmp_path):
    run_dir, merged = lang_run
    report = write(run_dir, tmp_path / "report.html")
    res = _chromium(["--dump-dom", report.as_uri()], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    assert 'data-ok="1"' in dom
    section = dom[dom.index('<section id="by-language">') :]
    section = section[: section.index("</section>")]
    zh = language_funnel(merged)[LANG]
    assert f'data-language="{LANG}"' in section
    detail = section[section.index(f'data-language="{LANG}"') :]
    detail = detail[: detail.index("</details>")]
    assert f"{LANG}: {zh[0].docs_in:,} read, {zh[-1].docs_out:,} kept" in detail
    for r in zh:
        for reason in r.drops:
            assert reason in detail
    assert "dropped by 00_langid" in section and "documents kept per language" in section


def test_notebook_api_per_language(lang_run):
    from gristmill import stats

    run_dir, merged = lang_run
    s = stats.load(run_dir)
    rows = funnel(merged)
    sums = s.by_language.groupby(["stage", "step"], sort=False)[["docs_in", "docs_out", "bytes_out"]].sum()
    for r in rows:
        assert tuple(sums.loc[(r.stage, r.step)]) == (r.docs_in, r.docs_out, r.bytes_out)
    zh = s.funnel_for(LANG)
    assert list(zh["docs_in"]) == [r.docs_in for r in language_funnel(merged)[LANG]]
    assert len(zh) == len(rows)
    by_reason = s.reasons_by_language.groupby(["stage", "step", "reason"])["documents"].sum().to_dict()
    assert by_reason == {(r.stage, r.step, k): v for r in rows for k, v in r.drops.items() if v}
    assert s.language_summary.set_index("language").loc[LANG, "read"] == zh["docs_in"].iloc[0]
    assert s.plot_language_kept()._repr_svg_().startswith("<svg")
    with pytest.raises(KeyError, match="xx"):
        s.funnel_for("xx")


def test_languages_past_the_bound_fold_into_other(wet_files):
    """A hostile `language` column (every document a new label) cannot grow the record without
    bound: past MAX_LANGUAGES the rest count as "other", and nothing is lost."""
    rec = ScoreRecorder("s", None, LENGTH_BINS)
    n = MAX_LANGUAGES + 300
    for i in range(n):
        doc = Document(text=f"document {i}", id=str(i), metadata={"language": f"x{i}"})
        rec.add(doc, len(doc.text), i % 2 == 0, None if i % 2 == 0 else "odd", len(doc.text), len(doc.text))
    langs = rec.as_dict()["languages"]
    assert len(langs) == MAX_LANGUAGES + 1 and langs[OTHER_LANGUAGES]["in"] == 300
    assert sum(v["in"] for v in langs.values()) == n
    assert sum(v["kept"] for v in langs.values()) == (n + 1) // 2
    assert sum(v["dropped"].get("odd", 0) for v in langs.values()) == n // 2
    both = merge([rec.as_dict(), rec.as_dict()])["languages"]
    assert both[OTHER_LANGUAGES]["in"] == 600 and sum(v["bytes_in"] for v in both.values()) == 2 * sum(
        v["bytes_in"] for v in langs.values()
    )
