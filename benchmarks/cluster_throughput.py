"""near_dedup's cluster stages on N tasks against datatrove's MinHash cluster stage, on the same edges.

    python benchmarks/cluster_throughput.py [--nodes 1000000] [--tasks 1 4 16] [--workers 2] [--smoke]

A generated duplicate graph (`make_graph`): `--nodes` documents in clusters whose sizes follow a
Zipf law (exponent 2, 2 to 10,000 documents), each cluster a random recursive tree (every member
joined to a random earlier one, as chains of near duplicates of near duplicates make it: depth
~ln(size)) plus 20% more random edges inside it; documents spread over 64 sources in order-key
order. `--giant` adds one component of that many more documents joined as a path (the worst
case for rounds) — off by default.

Each side runs as a run does:
* gristmill: the stages `near_dedup_cluster_edges`, `_round` x `cluster_rounds`, `_rest`,
  `near_dedup_cluster`, each through gristmill's local executor (`--workers` processes, a task
  a process), for `removal: components` and `kept_neighbour`, at each `--tasks`; CPU and peak RSS
  per task from each task's usage file, wall from the first stage's start to the last's end;
* datatrove 0.10's `MinhashDedupCluster` (one in-process task: a dict union-find over (file,
  document) tuples), on the same edges written as its `.dups` files, in a subprocess of its own:
  CPU (getrusage) and peak RSS (VmHWM);
* gristmill's one-task union (`lsh.components`, `lsh.kept_neighbour`, what `near_dedup_cluster`
  was before it was partitioned), in a subprocess: the reference the removals are checked against.

It prints, per side, CPU s, peak RSS and wall, the rounds the graph took, the removed counts
(the same for every task count; datatrove's, a component rule, equal to `components`'), and
parallel efficiency = wall(1 task) / (wall(N tasks) x min(N, workers)).

`--smoke`: 3,000 documents, tasks 1 and 4 (seconds; checks that the benchmark still runs, its
figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SOURCES = 64
SHARDS = 4


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def make_graph(nodes: int, seed: int = 0, giant: int = 0) -> np.ndarray:
    """(E, 2) int64 edges over document indices 0..nodes+giant-1 (see the module docstring)."""
    rng = np.random.default_rng(seed)
    sizes = []
    total = 0
    while total < nodes:
        s = rng.zipf(2.0, 4096)
        s = np.clip(s + 1, 2, 10_000)
        sizes.append(s)
        total += int(s.sum())
    sizes = np.concatenate(sizes)
    sizes = sizes[: int(np.searchsorted(np.cumsum(sizes), nodes)) + 1]
    sizes[-1] -= int(sizes.sum()) - nodes
    sizes = sizes[sizes >= 2] if sizes[-1] >= 2 else np.r_[sizes[:-2], sizes[-2] + sizes[-1]]
    n = int(sizes.sum())
    members = rng.permutation(n)  # a cluster's documents anywhere in the order
    start = np.repeat(np.cumsum(sizes) - sizes, sizes)
    j = np.arange(n) - start  # position inside its cluster
    tree = j > 0
    parent = start[tree] + np.floor(rng.random(int(tree.sum())) * j[tree]).astype(np.int64)
    edges = [np.stack([members[parent], members[tree]], axis=1)]
    big = np.flatnonzero(np.repeat(sizes, sizes) >= 3)
    extra = rng.choice(big, size=int(0.2 * len(big)), replace=False) if len(big) else np.empty(0, np.int64)
    other = start[extra] + np.floor(rng.random(len(extra)) * np.repeat(sizes, sizes)[extra]).astype(np.int64)
    keep = other != extra
    edges.append(np.stack([members[extra[keep]], members[other[keep]]], axis=1))
    if giant:
        path = n + rng.permutation(giant)
        edges.append(np.stack([path[:-1], path[1:]], axis=1))
    return np.concatenate(edges).astype(np.int64)


def _keys(idx: np.ndarray) -> np.ndarray:
    from gristmill.dedup.order import order_key

    return order_key((idx % SOURCES).astype(np.uint64), (idx // SOURCES).astype(np.int64) * 1000)


def write_inputs(edges: np.ndarray, work: Path) -> tuple[Path, Path, Path]:
    """gristmill's verified edge shards and signature source tables, and datatrove's `.dups`."""
    from gristmill.dedup.lsh import shard_of

    sig, verify, dups = work / "sig", work / "verify", work / "dups"
    (sig / "sources").mkdir(parents=True)
    for t in range(SHARDS):  # a source per signature task, as a run reads them
        names = [f"src{s:03d}" for s in range(t, SOURCES, SHARDS)]
        (sig / "sources" / f"task_{t:05d}.json").write_text(json.dumps(names))
    # the tables are ranked by name: rank r is src{r:03d}, so document i's source rank is i % SOURCES
    e = _keys(edges.reshape(-1)).reshape(-1, 2)
    e = np.sort(e, axis=1)
    shard = shard_of(e[:, 0], SHARDS)
    for s in range(SHARDS):
        d = verify / "verified" / f"shard_{s:03d}"
        d.mkdir(parents=True)
        np.save(d / "edges.npy", np.unique(e[shard == s], axis=0))
    dups.mkdir()
    rec = np.empty((len(edges), 4), "<u4")
    rec[:, 0], rec[:, 1] = edges[:, 0] % SOURCES, edges[:, 0] // SOURCES
    rec[:, 2], rec[:, 3] = edges[:, 1] % SOURCES, edges[:, 1] // SOURCES
    for b, part in enumerate(np.array_split(rec, SHARDS)):
        (dups / f"{b:05d}_00.dups").write_bytes(part.tobytes())
    return sig, verify, dups


def _datatrove(dups: str, out: str, conn) -> None:
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupCluster

    step = MinhashDedupCluster(dups, out, config=MinhashConfig(num_buckets=SHARDS))
    base = _rss_mb()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    step.run(None, 0, 1)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    removed = sum(len(p.read_bytes()) // 4 for p in Path(out).glob("*.remove"))
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    conn.send({"cpu_s": cpu, "wall_s": wall, "max_rss_mb": _rss_mb(), "base_rss_mb": base, "removed": removed})


def _one_task(verify: str, removal: str, conn) -> None:
    from gristmill.dedup.lsh import components, kept_neighbour
    from gristmill.dedup.near import _shard_edges

    folder = Path(verify) / "verified"
    base = _rss_mb()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    loaders = [(lambda s=s: _shard_edges(folder, s)) for s in range(SHARDS)]
    nodes, roots = (components if removal == "components" else kept_neighbour)(loaders)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    removed = np.sort(nodes[nodes != roots])
    np.save(Path(verify) / f"removed_{removal}.npy", removed)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    conn.send({"cpu_s": cpu, "wall_s": wall, "max_rss_mb": _rss_mb(), "base_rss_mb": base, "removed": len(removed)})


def _in_subprocess(target, *args) -> dict:
    ctx = mp.get_context("spawn")  # a fresh interpreter: its own peak RSS
    a, b = ctx.Pipe(duplex=False)
    p = ctx.Process(target=target, args=(*args, b))
    p.start()
    out = a.recv()
    p.join()
    return out


def gristmill_cluster(sig: Path, verify: Path, work: Path, tasks: int, workers: int, removal: str) -> dict:
    """The cluster stages through the local executor; per-stage usage summed."""
    from gristmill.core.step import Stage
    from gristmill.dedup.cluster import Rounds, removed_slices
    from gristmill.dedup.near import (
        NearDedup,
        NearDedupCluster,
        NearDedupClusterEdges,
        NearDedupClusterRest,
        NearDedupClusterRound,
        NearDedupPlan,
    )
    from gristmill.dedup.order import load_ranks
    from gristmill.pipeline.execution.executors import make_executor
    from gristmill.pipeline.execution.usage import stage_usage
    from gristmill.pipeline.report.journey import merge_stage

    cfg = NearDedup.Config(removal=removal, cluster_tasks=tasks)
    R = cfg.cluster_rounds
    plan = NearDedupPlan(
        cfg, 14, 9, 1, SHARDS, cluster_tasks=tasks, cluster_rounds=R, signature_folder=sig, verify_folder=verify
    )
    steps = [(NearDedupClusterEdges(plan), "near_dedup_cluster_edges", tasks)]
    steps += [(NearDedupClusterRound(plan, r), "near_dedup_cluster_round", tasks) for r in range(1, R + 1)]
    steps.append((NearDedupClusterRest(plan), "near_dedup_cluster_rest", 1))
    steps.append((NearDedupCluster(plan), "near_dedup_cluster", tasks))
    stages = []
    for i, (step, name, n) in enumerate(steps):
        folder = work / f"{i + 1:02d}_{name}"
        step.stage_folder = folder
        stages.append(Stage(i + 1, name, folder, [step], n, workers, [step.name]))
    plan.cluster_edges_folder = stages[0].folder
    plan.round_folders = [s.folder for s in stages[1 : R + 1]]
    plan.rest_folder, plan.cluster_folder = stages[-2].folder, stages[-1].folder
    t0 = time.monotonic()
    for stage in stages:
        make_executor(stage).run()
        merge_stage(stage.folder)
    wall = time.monotonic() - t0
    usage = [stage_usage(s.folder) for s in stages]
    rounds = Rounds(plan.cluster_edges_folder, plan.round_folders, plan.rest_folder, tasks, removal == "components")
    task_ranks, _ = load_ranks(sig)
    removed = np.sort(np.concatenate([removed_slices(plan.cluster_folder / "removed", t) for t in task_ranks]))
    work_cpu = sum(u.cpu_s for u in usage if u)
    return {
        "cpu_s": work_cpu,
        "wall_s": wall,
        "max_rss_mb": max(u.max_rss_mb for u in usage if u),
        "rounds": rounds.final_round(),
        "removed": removed,
        "round_cpu_s": [round(u.cpu_s, 2) for u in usage[1 : R + 1] if u],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1_000_000, help="documents in clusters")
    ap.add_argument("--giant", type=int, default=0, help="documents of one more component, a path")
    ap.add_argument("--tasks", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=None, help="folder for the inputs and runs (default: a temporary one)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    if a.smoke:
        a.nodes, a.tasks = 3000, [1, 4]
    work = a.work or Path(tempfile.mkdtemp(prefix="cluster_bench_"))
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    t = time.monotonic()
    edges = make_graph(a.nodes, giant=a.giant)
    sig, verify, dups = write_inputs(edges, work)
    n = len(np.unique(edges))
    print(f"graph: {n:,} documents in clusters, {len(edges):,} edges ({time.monotonic() - t:.1f} s to make)")
    try:
        import datatrove  # noqa: F401

        dt = _in_subprocess(_datatrove, str(dups), str(work / "dt_out"))
    except ImportError:
        dt = None
        print("datatrove MinhashDedupCluster: skipped (not installed: pip install -e '.[bench]')")
    results = {}
    for removal in ("components", "kept_neighbour"):
        ref = _in_subprocess(_one_task, str(verify), removal)
        want = np.load(verify / f"removed_{removal}.npy")
        print(
            f"{removal}: one-task union (lsh.{'components' if removal == 'components' else 'kept_neighbour'}): "
            f"{ref['cpu_s']:.2f} CPU s, peak {ref['max_rss_mb']:.0f} MB (base {ref['base_rss_mb']:.0f}), "
            f"removed {ref['removed']:,}"
        )
        for tasks in a.tasks:
            r = gristmill_cluster(sig, verify, work / f"{removal}_{tasks}", tasks, a.workers, removal)
            same = np.array_equal(r["removed"], want)
            results[(removal, tasks)] = r
            print(
                f"{removal}: {tasks:>2} tasks: {r['cpu_s']:.2f} CPU s, wall {r['wall_s']:.2f} s, peak task "
                f"{r['max_rss_mb']:.0f} MB, rounds {r['rounds']} (round CPU s {r['round_cpu_s']}), "
                f"removed {len(r['removed']):,} (same as one task: {same})"
            )
            if not same:
                print(f"MISMATCH: {removal} at {tasks} tasks removes other documents than the one-task union")
                return 1
        one = results[(removal, a.tasks[0])]["wall_s"]
        for tasks in a.tasks[1:]:
            r = results[(removal, tasks)]
            eff = one / (r["wall_s"] * min(tasks, a.workers))
            print(f"{removal}: parallel efficiency at {tasks} tasks on {a.workers} workers: {eff:.2f}")
    if dt is not None:
        comp = results[("components", a.tasks[0])]
        print(
            f"datatrove MinhashDedupCluster (1 task): {dt['cpu_s']:.2f} CPU s, peak {dt['max_rss_mb']:.0f} MB "
            f"(base {dt['base_rss_mb']:.0f}), removed {dt['removed']:,} (components: {len(comp['removed']):,})"
        )
        print(
            f"cluster stages (components, {a.tasks[0]} task), CPU s datatrove / gristmill: "
            f"{dt['cpu_s'] / comp['cpu_s']:.2f}x; peak RSS datatrove / gristmill: "
            f"{dt['max_rss_mb'] / comp['max_rss_mb']:.2f}x"
        )
        if dt["removed"] != len(comp["removed"]):
            print("MISMATCH: datatrove removes another number of documents than components")
            return 1
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
