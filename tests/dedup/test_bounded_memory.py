"""Dedup stages hold a bounded part of their input: a signature/hash task writes sorted parts,
an exact find task reads its slice one key range at a time, a shingles task spills per shard.
Forced to tiny bounds, every path must give exactly the documents of one big part."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from gristmill.pipeline.execution.executors import make_executor
from gristmill.pipeline.planning.on_parquet import plan_on_parquet
from gristmill.pipeline.report.journey import merge_stage


def _run(stages, shrink: bool) -> list[tuple[str, str]]:
    for stage in stages:
        for step in stage.pipeline:
            if shrink:  # instance attributes: pickled with the step into each task's process
                for attr, value in (
                    ("spill_records", 3000),
                    ("chunk_bytes", 100_000),
                    ("spill_docs", 300),
                    ("spill_shingles", 20_000),
                    ("cluster_chunk", 500),
                    ("cluster_spill", 500),
                ):
                    if hasattr(step, attr):
                        setattr(step, attr, value)
        make_executor(stage).run()
        merge_stage(stage.folder)
    return _table(stages[-1].output)


def _table(folder) -> list[tuple[str, str]]:
    t = pq.read_table(folder, columns=["id", "text"]).to_pydict()
    return sorted(zip(t["id"], t["text"]))


def _parts(folder, pattern) -> int:
    return len(list(folder.rglob(pattern)))


def test_exact_dedup_in_parts_and_key_ranges_matches_one_part(dedup_corpus, tmp_path):
    params = {"granularity": "paragraph", "capacity": 200_000, "fp_rate": 1e-3, "min_doc_words": 50}
    big = _run(plan_on_parquet("exact_dedup", params, dedup_corpus / "docs", tmp_path / "big", tasks=2), False)
    stages = plan_on_parquet("exact_dedup", params, dedup_corpus / "docs", tmp_path / "small", tasks=2)
    small = _run(stages, True)
    assert _parts(stages[0].folder / "hashes", "task_00000.part00001.npy") >= 1  # several parts were written
    counters = json.loads((stages[1].folder / "stats.json").read_text())[0]["counters"]
    assert counters["key_ranges"] > 2 * 2  # more than one range per find task
    assert small == big
    assert 0 < len(big) < 5000


def test_near_dedup_in_parts_matches_one_part(dedup_corpus, near_dedup_run, tmp_path):
    params = {"threshold": 0.8}
    big = _table(near_dedup_run[-1].output)  # the same parameters and tasks, in one part (conftest)
    stages = plan_on_parquet("near_dedup", params, dedup_corpus / "docs", tmp_path / "small", tasks=2)
    small = _run(stages, True)
    assert _parts(stages[0].folder / "bands" / "band_000", "task_00000.part*.npy") > 2
    assert _parts(stages[2].folder / "shingles", "task_00000.part00001.keys.npy") >= 1
    assert small == big
    assert 0 < len(big)
