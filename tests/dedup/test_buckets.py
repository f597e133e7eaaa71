"""near_dedup_buckets split by (band, key range): the edges, clusters and removals are those of
one task per whole band, for any number of signature tasks, key ranges and bucket tasks; a
task holds only its range's records. Inputs: the real WET sample and the planted-duplicate
corpus (conftest `dedup_corpus`)."""

from __future__ import annotations

import re
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.core.documents import documents_to_table, schema_for
from gristmill.dedup.lsh import components, key_range_bounds, shard_of, sort_records, sorted_band_edges
from gristmill.dedup.near import BUCKET_BYTES_PER_RECORD, NearDedup, NearDedupBuckets, NearDedupPlan, bucket_tasks
from gristmill.dedup.order import load_ranks, order_key
from gristmill.input.wet import WetReader
from gristmill.pipeline.execution.executors import TaskFailed, make_executor
from gristmill.pipeline.planning.on_parquet import plan_on_parquet


def _reference_edges(keys: np.ndarray, nodes: np.ndarray) -> list[list[int]]:
    """Star edges in plain Python: per key, (smallest node, each other node), by (key, node)."""
    groups: dict[int, list[int]] = {}
    for k, v in zip(keys.tolist(), nodes.tolist()):
        groups.setdefault(k, []).append(v)
    out = []
    for k in sorted(groups):
        vs = sorted(groups[k])
        out += [[vs[0], v] for v in vs[1:] if v != vs[0]]
    return out


def _band_edges(keys: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """A band's edges as a buckets task finds them: sorted in place, then the runs of equal keys."""
    keys, nodes = keys.copy(), nodes.copy()
    sort_records(keys, nodes)
    return sorted_band_edges(keys, nodes)


def test_edges_of_key_ranges_concatenate_to_the_band_edges():
    rng = np.random.default_rng(4)
    keys = rng.integers(0, 2**64 - 1, size=3000, dtype=np.uint64, endpoint=True)
    keys[:1000] = keys[rng.integers(0, 150, size=1000)]  # runs of 2+ equal keys
    keys[1000:1004] = [0, 0, 2**64 - 1, 2**64 - 1]  # both ends of the key space
    nodes = rng.permutation(10**6)[: len(keys)].astype(np.uint64)
    nodes[1005] = nodes[1004] = nodes[1003]  # one document twice under one key is no edge
    keys[1005] = keys[1004]
    want = _reference_edges(keys, nodes)
    assert len(want) > 800
    assert _band_edges(keys, nodes).tolist() == want
    for ranges in (1, 2, 7, 64):
        b = key_range_bounds(ranges)
        assert b[0] == 0 and b[-1] == 2**64 and all(x < y for x, y in zip(b, b[1:]))
        g = np.searchsorted(np.array(b[1:-1], dtype=np.uint64), keys, side="right")  # each key's range
        assert all(b[i] <= k < b[i + 1] for k, i in zip(keys.tolist(), g.tolist()))
        got = [_band_edges(keys[g == i], nodes[g == i]) for i in range(ranges)]
        assert np.concatenate(got).tolist() == want  # same edges, same order
    assert sorted_band_edges(np.array([5, 5], np.uint64), np.array([3, 3], np.uint64)).shape == (0, 2)


def test_bucket_tasks_one_pair_per_task_whole_bands_or_more_ranges_to_fit():
    config = NearDedup.Config(bands=14, rows=9)
    asked = []

    def roomy(tasks: int) -> int:  # bytes a task of a stage of `tasks` tasks may hold for its pair
        asked.append(tasks)
        return 1 << 40

    # key_ranges set: that many ranges, one (band, range) pair per task, whatever the tasks or memory
    keyed = NearDedup.Config(bands=14, rows=9, key_ranges=3)
    assert bucket_tasks(keyed, 2, 1e12, lambda n: 1) == (3, 42)
    assert bucket_tasks(keyed, 100, 1e3, roomy) == (3, 42)
    assert asked == []  # memory is not asked for: a pair too large is refused later, naming key_ranges
    # tasks >= bands: the fewest ranges that give each task a pair
    assert bucket_tasks(config, 14, 1e6, roomy) == (1, 14)
    assert bucket_tasks(config, 16, 1e6, roomy) == (2, 28)
    assert bucket_tasks(config, 29, 1e6, roomy) == (3, 42)
    assert asked == [14, 28, 42]  # the budget of a task of the stage as planned
    # tasks < bands, no key_ranges: `tasks` tasks of whole bands, one range
    assert bucket_tasks(config, 2, 1e6, roomy) == (1, 2)
    assert bucket_tasks(config, 13, 1e6, roomy) == (1, 13)
    # memory: a pair of 1e8 documents (36 bytes each) in 100 MB needs 36 ranges, one pair per task,
    # also when there were fewer tasks than bands
    budget = 100_000_000
    assert -(-BUCKET_BYTES_PER_RECORD * 10**8 // budget) == 36
    assert bucket_tasks(config, 16, 1e8, lambda n: budget) == (36, 14 * 36)
    assert bucket_tasks(config, 2, 1e8, lambda n: budget) == (36, 14 * 36)
    # ... and not when the default ranges already fit (36 needed, 50 given by 700 tasks)
    assert bucket_tasks(config, 700, 1e8, lambda n: budget) == (50, 700)
    # a budget at or below nothing counts as 1 MiB, not as a division by zero
    assert bucket_tasks(config, 2, 1e6, lambda n: -5) == (35, 14 * 35)


def _wet_docs(wet_files, folder: Path) -> Path:
    folder.mkdir(parents=True)
    for i, wet in enumerate(wet_files):  # one file per source: each signature task its own sources
        pq.write_table(
            documents_to_table(list(WetReader([str(wet)]).run()), schema_for({})), folder / f"{i:05d}.parquet"
        )
    return folder


def _signature(docs: Path, run_dir: Path, tasks: int, params: dict):
    stages = plan_on_parquet("near_dedup", params, docs, run_dir, tasks=tasks)
    make_executor(stages[0]).run()
    return stages


def _today(sig: Path, bands: int, shards: int) -> list[np.ndarray]:
    """Edges per shard as one task per whole band finds them: every record of the band, then
    its edges, bands in order."""
    task_ranks, _ = load_ranks(sig)
    out = [[] for _ in range(shards)]
    for b in range(bands):
        keys, ords = [], []
        for f in sorted((sig / "bands" / f"band_{b:03d}").glob("task_*.npy")):
            r = np.load(f)
            keys.append(r["key"])
            ords.append(order_key(task_ranks[int(f.name.split(".")[0].split("_")[1])][r["src"]], r["offset"]))
        e = _band_edges(np.concatenate(keys), np.concatenate(ords))
        for s in range(shards):
            out[s].append(e[shard_of(e[:, 0], shards) == s])
    return [np.concatenate(x) for x in out]


def _buckets(plan: NearDedupPlan, folder: Path, ranges: int, world_size: int) -> list[np.ndarray]:
    step = NearDedupBuckets(replace(plan, ranges=ranges))
    step.stage_folder = folder
    shards = plan.shards
    for rank in range(world_size):
        list(step.run(rank=rank, world_size=world_size))
    return [
        np.concatenate([np.load(f) for f in sorted((folder / "edges" / f"shard_{s:03d}").glob("*.npy"))])
        for s in range(shards)
    ]


def _removed(shards: list[np.ndarray]) -> tuple[list, list]:
    nodes, roots = components([lambda e=e: np.unique(e, axis=0) if len(e) else e for e in shards])
    return nodes.tolist(), nodes[nodes != roots].tolist()


@pytest.mark.parametrize("corpus", ["wet_sample", "planted"])
def test_edges_and_removals_identical_for_any_tasks_and_key_ranges(corpus, request, tmp_path):
    if corpus == "wet_sample":
        docs, params = _wet_docs(request.getfixturevalue("wet_files"), tmp_path / "docs"), {"threshold": 0.5}
    else:
        docs, params = request.getfixturevalue("dedup_corpus") / "docs", {}
    reference = None
    # (signature tasks, [(key ranges, bucket tasks)]); None: one task per (band, range) pair.
    # 16 signature tasks > bands (14 at 0.8): more tasks than bands, some of them reading nothing
    for tasks, combos in ((1, [(1, 1), (3, 2)]), (16, [(2, None), (5, 3), (1, None)])):
        stages = _signature(docs, tmp_path / f"t{tasks}", tasks, params)
        bucket = stages[1]
        plan = bucket.pipeline[0].params
        bands = plan.bands
        sig = bucket.pipeline[0].run_folder.path(plan.signature_folder)
        assert sig == stages[0].folder and plan.shards == tasks
        plan = replace(plan, signature_folder=sig)  # for the phases run alone below
        today = _today(plan.signature_folder, bands, tasks)
        assert sum(len(e) for e in today) > 50
        for ranges, world in combos:
            got = _buckets(plan, tmp_path / f"t{tasks}_r{ranges}_w{world}", ranges, world or bands * ranges)
            assert all(np.array_equal(g, t) for g, t in zip(got, today)), (tasks, ranges, world)
        # clusters and removals are the same whatever the number of signature tasks
        result = _removed(today)
        reference = reference or result
        assert result == reference and len(result[1]) > 10
    # the default plan for 16 tasks: ceil(16 / bands) ranges, one (band, range) pair per task
    # (at 0.8: 14 bands, 2 ranges, 28 tasks); with more bands than tasks (0.5: 32), 16 tasks of whole bands
    ranges = -(-16 // bands)
    want = (bands * ranges, ranges) if bands <= 16 else (16, 1)
    assert (bucket.tasks, bucket.pipeline[0].params.ranges) == want
    assert bands == (14 if corpus == "planted" else 32)


def _synthetic_signature(folder: Path, tasks: int, per_task: int) -> int:
    """Band 0 of `tasks` signature tasks, `per_task` records each, written as the signature stage
    writes them (sorted by key). Keys are uniform 64-bit values, as `band_keys` makes them."""
    import json

    from gristmill.dedup.near import BAND_REC

    rng = np.random.default_rng(5)
    for t in range(tasks):
        r = np.empty(per_task, dtype=BAND_REC)
        r["key"] = np.sort(rng.integers(0, 2**64 - 1, size=per_task, dtype=np.uint64, endpoint=True))
        # distinct offsets (choice without replacement: not a 10**8-element permutation, ~6 s each)
        r["src"], r["offset"] = 0, rng.choice(10**8, size=per_task, replace=False)
        (folder / "bands" / "band_000").mkdir(parents=True, exist_ok=True)
        np.save(folder / "bands" / "band_000" / f"task_{t:05d}.npy", r)
        (folder / "sources").mkdir(exist_ok=True)
        (folder / "sources" / f"task_{t:05d}.json").write_text(json.dumps([f"file-{t}"]))
    (folder / "lsh.json").write_text(json.dumps({"bands": 1, "sorted_by_key": True}))
    return tasks * per_task


def test_a_task_holds_only_its_ranges_records(tmp_path):
    n = _synthetic_signature(tmp_path / "sig", 3, 300_000)
    held, records = {}, {}
    for ranges in (1, 4):
        peaks, counts = [], []
        for pair in range(ranges):
            plan = NearDedupPlan(
                NearDedup.Config(), bands=1, rows=1, ranges=ranges, shards=2, signature_folder=tmp_path / "sig"
            )
            step = NearDedupBuckets(plan)
            step.stage_folder = tmp_path / f"b{ranges}"
            tracemalloc.start()
            list(step.run(rank=pair, world_size=ranges))
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            counts.append(step.stats["records"].total)
        held[ranges], records[ranges] = max(peaks), counts
    assert records[1] == [n] and sum(records[4]) == n
    assert max(records[4]) < 1.05 * n / 4  # hashed keys: the ranges are even
    # 32 bytes per record held (keys, order keys, sort order, one temporary) plus small fixed costs
    assert 30 * n < held[1] < 36 * n, held[1] / n
    assert held[4] < 36 * max(records[4]) and held[4] < 0.3 * held[1], held


def test_documents_of_two_tasks_sharing_source_and_offset_are_refused(wet_files, tmp_path):
    docs = _wet_docs(wet_files[:1], tmp_path / "docs")
    table = pq.read_table(docs / "00000.parquet")
    texts = ["Another text, " + t for t in table["text"].to_pylist()]  # other band keys, same (source, offset)
    pq.write_table(table.set_column(0, "text", pa.array(texts, pa.large_string())), docs / "00001.parquet")
    stages = plan_on_parquet("near_dedup", {"key_ranges": 3}, docs, tmp_path / "r", tasks=2)
    make_executor(stages[0]).run()  # each task read one file: no repeat within a task
    source = table["source"][0].as_py()
    with pytest.raises(TaskFailed) as failed:
        make_executor(stages[1]).run()
    # the whole line, naming the YAML step; the offset is the first shared one of the failing task's part
    shared = re.fullmatch(
        re.escape(f"failed: ValueError: near_dedup: several documents have (source, offset) = ({source!r}, ")
        + r"(\d+)"
        + re.escape(
            "); dedup names a document by its source and offset, so they must be unique "
            "(read the WET files again with this version)"
        ),
        failed.value.cause,
    )
    assert shared, failed.value.cause
    assert int(shared[1]) in table["offset"].to_pylist()
