"""Document identity in dedup: the order key (source, offset), whatever the input's gzip layout,
and what the stages do when it is not unique or the input changes between them.

Inputs are the real 2014 WET sample with planted exact copies, read by the real reader.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.core.documents import documents_to_table, schema_for
from gristmill.input.wet import WetReader
from gristmill.pipeline.execution.executors import TaskFailed, make_executor
from gristmill.pipeline.planning.on_parquet import plan_on_parquet, run_on_parquet
from gristmill.pipeline.report.journey import merge_stage

COPIES = {10: 200, 20: 300, 30: 400}  # record i of the file is planted again before record j


def _members(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        d = zlib.decompressobj(31)
        out.append(d.decompress(data[pos:]))
        pos = len(data) - len(d.unused_data)
    return out


def _record_id(plain: bytes) -> str:
    return re.search(rb"WARC-Record-ID: (\S+)", plain).group(1).decode()


@pytest.fixture(scope="module")
def planted(wet_files) -> tuple[list[bytes], dict[str, str]]:
    """The 2014 file's records with three exact copies planted: (records, {copy id: original id})."""
    plains = _members(wet_files[0].read_bytes())
    assert len(plains) == 567
    copies, out = {}, list(plains)
    for n, (i, j) in enumerate(sorted(COPIES.items(), key=lambda x: -x[1])):
        new_id = f"<urn:uuid:00000000-0000-0000-0000-{n:012d}>"
        out.insert(j, plains[i].replace(_record_id(plains[i]).encode(), new_id.encode()))
        copies[new_id] = _record_id(plains[i])
    return out, copies


def _layouts(folder: Path, plains: list[bytes]) -> dict[str, Path]:
    folder.mkdir(parents=True)
    whole = b"".join(plains)
    files = {
        "per_record": b"".join(gzip.compress(p) for p in plains),
        "one_member": gzip.compress(whole),
        "uncompressed": whole,
    }
    for name, data in files.items():
        (folder / name).mkdir()
        (folder / name / "x.warc.wet").write_bytes(data)
    return {name: folder / name / "x.warc.wet" for name in files}


def _to_parquet(wet: Path, folder: Path) -> Path:
    docs = list(WetReader([str(wet)]).run())
    folder.mkdir(parents=True)
    pq.write_table(documents_to_table(docs, schema_for({})), folder / "00000.parquet")
    return folder


def _kept(stages) -> set[str]:
    return set(pq.read_table(stages[-1].output, columns=["id"]).column("id").to_pylist())


def test_dedup_keeps_the_same_documents_whatever_the_gzip_layout(tmp_path, planted):
    plains, copies = planted
    results = {}
    for name, wet in _layouts(tmp_path / "wet", plains).items():
        docs = _to_parquet(wet, tmp_path / name / "docs")
        t = pq.read_table(docs, columns=["id", "offset"]).to_pydict()
        exact = run_on_parquet("exact_dedup", {"capacity": 10_000}, docs, tmp_path / name / "exact")
        near = run_on_parquet("near_dedup", {"threshold": 0.8}, docs, tmp_path / name / "near")
        results[name] = (list(zip(t["id"], t["offset"])), _kept(exact), _kept(near))
    assert results["per_record"] == results["one_member"] == results["uncompressed"]
    ids, exact, near = results["one_member"]
    assert len(ids) == 569 and len({o for _, o in ids}) == 569
    for copy, original in copies.items():  # the later copy goes, the first stays
        assert copy not in exact and copy not in near
        assert original in exact and original in near


def _run(stages):
    for stage in stages:
        make_executor(stage).run()
        merge_stage(stage.folder)


def _texts(stage) -> dict[str, str]:
    t = pq.read_table(stage.output, columns=["id", "text"]).to_pydict()
    return dict(zip(t["id"], t["text"]))


PARAMS = {"granularity": "paragraph", "capacity": 100_000, "min_doc_words": 20}


@pytest.fixture
def docs(tmp_path, planted) -> Path:
    plains, _ = planted
    wet = tmp_path / "x.warc.wet"
    wet.write_bytes(b"".join(plains))
    return _to_parquet(wet, tmp_path / "docs")


def test_a_row_removed_between_hash_and_filter_stops_the_filter(tmp_path, docs, planted):
    _, copies = planted
    want = _texts(run_on_parquet("exact_dedup", PARAMS, docs, tmp_path / "reference")[-1])
    assert not set(copies) & set(want)  # the planted copies lost every paragraph
    stages = plan_on_parquet("exact_dedup", PARAMS, docs, tmp_path / "r")
    _run(stages[:2])  # hash, find
    path = docs / "00000.parquet"
    table = pq.read_table(path)
    gone = table["id"][5].as_py()  # early: every later document moves up one position
    pq.write_table(pa.concat_tables([table.slice(0, 5), table.slice(6)]), path)
    with pytest.raises(
        TaskFailed,
        match=re.escape(f"{path}: 568 documents, exact_dedup_hash read 569; the input changed between stages"),
    ):
        _run(stages[2:])
    assert not list(stages[2].output.rglob("*.parquet"))  # nothing written

    # and below that check, documents are found by (source, offset), not by position: on the
    # changed input, the same paragraphs are removed from the same documents
    exact_filter = stages[2].pipeline[1]
    exact_filter.params = replace(exact_filter.params, documents=None)
    _run(stages[2:])
    want.pop(gone, None)
    assert _texts(stages[2]) == want


def test_a_text_changed_in_place_between_hash_and_filter_stops_the_filter(tmp_path, docs, planted):
    _, copies = planted
    stages = plan_on_parquet("exact_dedup", PARAMS, docs, tmp_path / "r")
    _run(stages[:2])
    path = docs / "00000.parquet"
    table = pq.read_table(path)
    i = table["id"].to_pylist().index(next(iter(copies)))
    texts = table["text"].to_pylist()
    texts[i] = "A different first line\n" + texts[i]  # same rows, same (source, offset)
    pq.write_table(table.set_column(0, "text", pa.array(texts, pa.large_string())), path)
    with pytest.raises(TaskFailed, match=r"@ \d+: document <urn:uuid:[0-]+> is not the text exact_dedup_hash read"):
        _run(stages[2:])


def test_documents_sharing_source_and_offset_are_refused(tmp_path, docs):
    # what an older reader wrote for a WET file gzipped as one member: one offset for all records
    path = docs / "00000.parquet"
    table = pq.read_table(path)
    pq.write_table(
        table.set_column(table.schema.get_field_index("offset"), "offset", pa.array([1000] * len(table), pa.int64())),
        path,
    )
    source = table["source"][0].as_py()
    for step in ("exact_dedup", "near_dedup"):
        with pytest.raises(TaskFailed) as failed:
            _run(plan_on_parquet(step, {}, docs, tmp_path / step)[:1])
        assert failed.value.cause == (
            f"failed: ValueError: {step}: several documents have (source, offset) = ({source!r}, 1000); "
            "dedup names a document by its source and offset, so they must be unique "
            "(read the WET files again with this version)"
        )
