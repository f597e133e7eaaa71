"""near_dedup's clustering on N tasks (`gristmill.dedup.cluster`): the same clusters and removals
as the one-task union (`lsh.components`, `lsh.kept_neighbour`) on the planted corpus's verified
edges for 1, 4 and 16 tasks; a giant component in bounded memory per task; a chain longer than
the planned rounds; a missing or truncated edge file; a round killed midway and run again."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from gristmill.dedup.cluster import Rounds, read_clusters, removed_slices
from gristmill.dedup.lsh import components, kept_neighbour
from gristmill.dedup.near import (
    NearDedup,
    NearDedupCluster,
    NearDedupClusterEdges,
    NearDedupClusterRest,
    NearDedupClusterRound,
    NearDedupPlan,
    _shard_edges,
)
from gristmill.dedup.order import load_ranks, order_key


def _plan(
    verify: Path, sig: Path, shards: int, tasks: int, removal: str, rounds: int = 8, max_rounds: int = 128
) -> NearDedupPlan:
    cfg = NearDedup.Config(removal=removal, cluster_tasks=tasks, cluster_rounds=rounds, cluster_max_rounds=max_rounds)
    return NearDedupPlan(
        cfg, 14, 9, 1, shards, cluster_tasks=tasks, cluster_rounds=rounds, signature_folder=sig, verify_folder=verify
    )


def _phases(plan: NearDedupPlan, out: Path, small: int | None = None) -> list[tuple[object, int]]:
    """The cluster stages' phases, their folders set as `NearDedup.stages` sets them."""
    c, R = plan.cluster_tasks, plan.cluster_rounds
    steps = [(NearDedupClusterEdges(plan), "near_dedup_cluster_edges", c)]
    steps += [(NearDedupClusterRound(plan, r), "near_dedup_cluster_round", c) for r in range(1, R + 1)]
    steps += [
        (NearDedupClusterRest(plan), "near_dedup_cluster_rest", 1),
        (NearDedupCluster(plan), "near_dedup_cluster", c),
    ]
    for i, (step, name, _) in enumerate(steps):
        step.stage_folder = out / f"{i:02d}_{name}"
        if small:
            step.cluster_chunk = step.cluster_spill = small
    plan.cluster_edges_folder = steps[0][0].stage_folder
    plan.round_folders = [s.stage_folder for s, _, _ in steps[1 : R + 1]]
    plan.rest_folder, plan.cluster_folder = steps[-2][0].stage_folder, steps[-1][0].stage_folder
    return [(s, t) for s, _, t in steps]


def _run(step, tasks: int) -> None:
    for rank in range(tasks):
        list(step.run(None, rank, tasks))


def _cluster(plan: NearDedupPlan, out: Path, small: int | None = None):
    for step, tasks in _phases(plan, out, small):
        _run(step, tasks)
    nodes, roots = read_clusters(plan.cluster_folder)
    task_ranks, _ = load_ranks(plan.signature_folder)
    removed = np.concatenate([removed_slices(plan.cluster_folder / "removed", t) for t in task_ranks])
    return nodes, roots, removed


def _one_task(plan: NearDedupPlan):
    loaders = [(lambda s=s: _shard_edges(plan.cluster_edges, s)) for s in range(plan.shards)]
    nodes, roots = (components if plan.config.removal == "components" else kept_neighbour)(loaders)
    return nodes, roots


@pytest.mark.parametrize("removal", ["kept_neighbour", "components"])
def test_same_clusters_and_removals_as_one_task_for_1_4_and_16_tasks(near_dedup_run, removal, tmp_path):
    verify = next(s for s in near_dedup_run if s.name == "near_dedup_verify").folder
    sig = next(s for s in near_dedup_run if s.name == "near_dedup_signature").folder
    want_nodes, want_roots = _one_task(_plan(verify, sig, 2, 1, removal))
    want_removed = np.sort(want_nodes[want_nodes != want_roots])
    assert len(want_removed) > 100
    for tasks in (1, 4, 16):
        plan = _plan(verify, sig, 2, tasks, removal)
        nodes, roots, removed = _cluster(plan, tmp_path / f"t{tasks}")
        assert np.array_equal(nodes, want_nodes) and np.array_equal(roots, want_roots), tasks
        assert np.array_equal(np.sort(removed), want_removed), tasks
        # each filter task gets only the removals of the sources it read
        task_ranks, _ = load_ranks(sig)
        for t, ranks in task_ranks.items():
            mine = removed_slices(plan.cluster_folder / "removed", t)
            assert np.isin((mine >> np.uint64(40)).astype(np.int64), ranks.astype(np.int64)).all()
        sizes = {}
        for f in (plan.cluster_folder / "dups").glob("sizes_*.json"):
            for k, v in json.loads(f.read_text())["sizes"].items():
                sizes[int(k)] = sizes.get(int(k), 0) + v
        per_root = np.unique(want_roots, return_counts=True)[1]
        assert sizes == {int(k): int(v) for k, v in zip(*np.unique(per_root[per_root >= 2], return_counts=True))}
    # the pipeline's own run (2 tasks, kept_neighbour) clustered the same
    if removal == "kept_neighbour":
        got = read_clusters(next(s for s in near_dedup_run if s.name == "near_dedup_cluster").folder)
        assert np.array_equal(got[0], want_nodes) and np.array_equal(got[1], want_roots)


def _synthetic(tmp_path: Path, edges: np.ndarray, shards: int = 2) -> tuple[Path, Path]:
    """A verify folder holding `edges` (node indices, mapped in order to order keys over 4 sources
    of 2 signature tasks) split into `shards` shards, and the signature folder's source tables."""
    sig = tmp_path / "sig"
    (sig / "sources").mkdir(parents=True)
    for t in range(2):
        (sig / "sources" / f"task_{t:05d}.json").write_text(json.dumps([f"s{t}a", f"s{t}b"]))
    n = int(edges.max()) + 1
    idx = np.arange(n, dtype=np.int64)
    keys = order_key((idx * 4 // n).astype(np.uint64), idx * 1000)  # index order is order-key order
    e = keys[edges]
    verify = tmp_path / "verify"
    for s in range(shards):
        d = verify / "verified" / f"shard_{s:03d}"
        d.mkdir(parents=True)
        np.save(d / "edges.npy", e[s::shards])
    return verify, sig


@pytest.mark.parametrize("removal", ["kept_neighbour", "components"])
def test_same_as_one_task_on_generated_clusters_with_chains(removal, tmp_path):
    """Zipf-sized clusters, each a random tree (benchmarks/cluster_throughput.py's graph): chains
    where a document is decided after a later kept neighbour of it was (kept_neighbour keeps the
    one it was removed for), paths that need pointer jumping (components)."""
    from cluster_throughput import make_graph

    verify, sig = _synthetic(tmp_path, make_graph(1000, seed=1))
    want = _one_task(_plan(verify, sig, 2, 1, removal))
    for tasks in (1, 4):
        nodes, roots, _ = _cluster(_plan(verify, sig, 2, tasks, removal), tmp_path / f"t{tasks}")
        assert np.array_equal(nodes, want[0]) and np.array_equal(roots, want[1]), tasks


def test_a_path_takes_logarithmic_rounds_with_pointer_jumping(tmp_path):
    n = 200  # a path in order key: propagation alone takes 200 rounds
    verify, sig = _synthetic(tmp_path, np.stack([np.arange(n - 1), np.arange(1, n)], axis=1))
    plan = _plan(verify, sig, 2, 2, "components", rounds=2)
    nodes, roots, _ = _cluster(plan, tmp_path / "c")
    assert (roots == nodes[0]).all()
    rounds = Rounds(plan.cluster_edges_folder, plan.round_folders, plan.rest_folder, 2, True).final_round()
    assert rounds <= 2 * np.log2(n) + 2, rounds  # 15 measured


def test_one_giant_component_in_bounded_memory_per_task(tmp_path):
    warm = _synthetic(tmp_path / "warm", np.array([[0, 1], [1, 2]]))  # what the first call imports and caches
    _cluster(_plan(*warm, 2, 4, "components"), tmp_path / "warm")
    n = 400  # every document near every other: 79,800 edges, one component
    i, j = np.triu_indices(n, 1)
    verify, sig = _synthetic(tmp_path, np.stack([i, j], axis=1).astype(np.int64))
    for removal in ("components", "kept_neighbour"):
        plan = _plan(verify, sig, 2, 4, removal)
        steps = _phases(plan, tmp_path / removal, small=2000)
        peaks = []
        for step, tasks in steps:
            for rank in range(tasks):
                tracemalloc.start()
                list(step.run(None, rank, tasks))
                peaks.append(tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
        nodes, roots = read_clusters(plan.cluster_folder)
        want = _one_task(plan)
        assert np.array_equal(nodes, want[0]) and np.array_equal(roots, want[1])
        assert len(np.unique(roots)) == 1 and len(nodes) == n  # one kept, 399 removed for it
        # a task's entries alone are 2 x 79,800 / 4 x 16 bytes = 639 KB: no task held them
        assert max(peaks) < 400_000, peaks
        summaries = [json.loads(f.read_text()) for f in sorted(plan.round_folders[-1].glob("dups/summary_*.json"))]
        assert len(summaries) == 4 and all(s["sent"] == 0 for s in summaries)  # done within the rounds


def test_a_chain_longer_than_the_planned_rounds_finishes_in_the_rest_stage(tmp_path):
    n = 30
    for removal, perm in (
        ("components", np.random.default_rng(3).permutation(n)),  # a path in no order: labels travel it
        ("kept_neighbour", np.arange(n)),  # 0~1~...~29 in order: keeps every other one, a round per link
    ):
        verify, sig = _synthetic(tmp_path / removal, np.stack([perm[:-1], perm[1:]], axis=1))
        plan = _plan(verify, sig, 2, 4, removal, rounds=3)
        nodes, roots, removed = _cluster(plan, tmp_path / removal)
        want = _one_task(plan)
        assert np.array_equal(nodes, want[0]) and np.array_equal(roots, want[1])
        rest = sorted((plan.rest_folder / "dups").glob("round_*"))
        assert len(rest) >= 2  # rounds beyond the planned 3 ran in the rest stage
        if removal == "kept_neighbour":
            assert len(removed) == n // 2 and 3 + len(rest) == n + 1  # a link decided a round, then a silent one


def test_a_graph_past_cluster_max_rounds_fails_with_one_line_naming_the_setting(tmp_path):
    n = 30  # 0~1~...~29 in order under kept_neighbour: n + 1 rounds
    verify, sig = _synthetic(tmp_path / "a", np.stack([np.arange(n - 1), np.arange(1, n)], axis=1))
    plan = _plan(verify, sig, 2, 4, "kept_neighbour", rounds=3, max_rounds=10)
    with pytest.raises(RuntimeError) as e:
        _cluster(plan, tmp_path / "a")
    msg = str(e.value)
    assert "\n" not in msg and "near_dedup.cluster_max_rounds = 10" in msg
    assert "raise near_dedup.cluster_max_rounds" in msg
    assert len(sorted((plan.rest_folder / "dups").glob("round_*"))) == 10 - 3  # it stopped at the cap
    # raised, the same run finishes where it stopped, with the one-task union's removals
    plan2 = _plan(verify, sig, 2, 4, "kept_neighbour", rounds=3, max_rounds=64)
    nodes, roots, removed = _cluster(plan2, tmp_path / "a")
    assert np.array_equal(roots, _one_task(plan2)[1]) and len(removed) == n // 2
    with pytest.raises(ValueError, match="cluster_max_rounds"):
        NearDedup.Config(cluster_rounds=20, cluster_max_rounds=10)


def test_missing_or_truncated_edge_file_is_one_clear_error(tmp_path):
    i, j = np.triu_indices(50, 1)
    verify, sig = _synthetic(tmp_path, np.stack([i, j], axis=1).astype(np.int64))
    plan = _plan(verify, sig, 2, 4, "components")
    edges = _phases(plan, tmp_path / "a")[0][0]
    f = verify / "verified" / "shard_001" / "edges.npy"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"shard_001/edges.npy: edge file unreadable .*--force") as e:
        _run(edges, 4)
    assert "\n" not in str(e.value)
    f.unlink()
    with pytest.raises(ValueError, match=r"shard_001: 0 edge files of the 1 near_dedup_verify writes") as e:
        _run(edges, 4)
    f.write_bytes(data)
    # a round's message part truncated: the next round names it
    steps = _phases(plan, tmp_path / "b")
    for step, tasks in steps[:2]:
        _run(step, tasks)
    part = sorted((plan.round_folders[0] / "edges").glob("task_00002.part*.rec.npy"))[0]
    part.write_bytes(part.read_bytes()[:-40])
    with pytest.raises(ValueError, match=r"task_00002.part00000.rec.npy: (unreadable|\d+ records)") as e:
        _run(steps[2][0], 4)
    assert "\n" not in str(e.value)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_round_killed_midway_resumes_byte_identical(tmp_path):
    n = 400
    i, j = np.triu_indices(n, 1)
    verify, sig = _synthetic(tmp_path, np.stack([i, j], axis=1).astype(np.int64))
    results = []
    for name, kill in (("whole", False), ("killed", True)):
        plan = _plan(verify, sig, 2, 4, "components")  # round 1: every entry sends a message
        steps = _phases(plan, tmp_path / name, small=500)
        _run(steps[0][0], 4)
        if kill:  # round 1's task 0 killed once it has written a few of its parts
            ctx = multiprocessing.get_context("fork")
            child = ctx.Process(target=_run_one, args=(steps[1][0], 0, 4))
            child.start()
            msgs = plan.round_folders[0] / "edges"
            while child.is_alive() and len(list(msgs.glob("task_00000.part*.rec.npy"))) < 3:
                time.sleep(0.001)
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            assert child.exitcode == -signal.SIGKILL
            assert not (plan.round_folders[0] / "dups" / "summary_00000.json").exists()  # killed midway
        for step, tasks in steps[1:]:
            _run(step, tasks)
        results.append({k: v for k, v in _files(tmp_path / name).items()})
    assert not [k for k in results[1] if k.endswith(".tmp")]
    assert results[0] == results[1]
    assert len(results[0]) > 20


def _run_one(step, rank: int, tasks: int) -> None:
    list(step.run(None, rank, tasks))


def test_rounds_layout_names_the_stage_folders(tmp_path):
    r = Rounds(tmp_path / "e", [tmp_path / "r1", tmp_path / "r2"], tmp_path / "rest", 4, True)
    assert r.state_dir(2) == tmp_path / "r2" / "dups"
    assert r.msg_dir(3) == tmp_path / "rest" / "edges" / "round_00003"
    with pytest.raises(ValueError, match="round 1 of near_dedup's clustering did not finish"):
        r.converged(1)


def test_planned_rounds_follow_the_measured_rounds_and_grow_with_the_graph():
    from gristmill.dedup.near import MIN_PLANNED_ROUNDS, ROUNDS_MEASURED, planned_rounds

    for removal, points in ROUNDS_MEASURED.items():
        assert planned_rounds(removal, 500) == MIN_PLANNED_ROUNDS  # a demo run's graph: 8 stages
        for log_nodes, rounds in points[1:]:
            assert planned_rounds(removal, 10**log_nodes) >= rounds + 2  # what that graph took, and a margin
        sizes = [1e4, 1e6, 1e7, 1e8, 1e9, 1e10]
        got = [planned_rounds(removal, n) for n in sizes]
        assert got == sorted(got) and got[-1] > got[2]  # grows past the largest graph measured
    assert planned_rounds("components", 1e9) > planned_rounds("kept_neighbour", 1e9)
    cfg = NearDedup.Config()
    assert cfg.cluster_rounds is None and cfg.cluster_max_rounds >= planned_rounds("components", 1e12)
