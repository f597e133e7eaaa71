"""near_dedup's cluster stages on N tasks against datatrove's MinHash cluster stage, on the same edges.

    python benchmarks/cluster_throughput.py [--nodes 1000000] [--tasks 1 4 16] [--workers 2] [--smoke]

A generated duplicate graph (`make_graph`): `--nodes` documents in clusters whose sizes follow a
Zipf law (exponent 2, 2 to 10,000 documents), each cluster a random recursive tree (every member
joined to a random earlier one, as chains of near duplicates of near duplicates make it: depth
~ln(size)) plus 20% more random edges inside it; documents spread over 64 sources in order-key
order. `--giant` adds one component of that many more documents joined as a path (the worst
case for rounds) — off by default. `--edges RUN_DIR` takes a finished run's verified edges
instead (its near_dedup_signature and near_dedup_verify stages, read as they are: a real
corpus's graph).

Each side runs as a run does:
* gristmill: the stages `near_dedup_cluster_edges`, `_round` x the rounds a run plans for the
  graph (`near.planned_rounds`), `_rest`,
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

`--calibrate [--nodes 10000000 --partitions 16 --pair-nodes 1000000 --pair-partitions 16 128]
[--write-calibration]`: the unit costs `pipeline plan` projects the cluster stages from. The
real round code in this process, partition after partition, every round until no message is
sent, on graphs of `--nodes` documents at two densities (20% and 150% more edges), for each
`--removal` rule: CPU (`time.process_time`, tracemalloc off) and rounds, then each partition's
tracemalloc peak in a second pass (`--no-memory`: not), and the same `--pair-nodes` graph on
both `--pair-partitions` counts (what a round's P^2 part reads cost). Fitted per stage by
`projection.cluster_unit_costs`; docs/scale.md has the figures.

`--smoke`: 3,000 documents, tasks 1 and 4 (seconds; checks that the benchmark still runs, its
figures mean nothing); with `--calibrate`, the same on 3,000 documents and 4 partitions.
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


def make_graph(nodes: int, seed: int = 0, giant: int = 0, extra: float = 0.2) -> np.ndarray:
    """(E, 2) int64 edges over document indices 0..nodes+giant-1 (see the module docstring);
    `extra`: random edges inside clusters of 3 or more, per such document (0.2: 20% more)."""
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
    more = int(extra * len(big))
    if more <= len(big):
        pick = rng.choice(big, size=more, replace=False) if len(big) else np.empty(0, np.int64)
    else:  # denser than one more edge per document: with replacement
        pick = rng.choice(big, size=more, replace=True)
    other = start[pick] + np.floor(rng.random(len(pick)) * np.repeat(sizes, sizes)[pick]).astype(np.int64)
    keep = other != pick
    edges.append(np.stack([members[pick[keep]], members[other[keep]]], axis=1))
    if giant:
        path = n + rng.permutation(giant)
        edges.append(np.stack([path[:-1], path[1:]], axis=1))
    return np.concatenate(edges).astype(np.int64)


def _keys(idx: np.ndarray) -> np.ndarray:
    from gristmill.dedup.order import order_key

    return order_key((idx % SOURCES).astype(np.uint64), (idx // SOURCES).astype(np.int64) * 1000)


def write_inputs(edges: np.ndarray, work: Path, with_dups: bool = True) -> tuple[Path, Path, Path]:
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
    if not with_dups:
        return sig, verify, dups
    dups.mkdir()
    rec = np.empty((len(edges), 4), "<u4")
    rec[:, 0], rec[:, 1] = edges[:, 0] % SOURCES, edges[:, 0] // SOURCES
    rec[:, 2], rec[:, 3] = edges[:, 1] % SOURCES, edges[:, 1] // SOURCES
    for b, part in enumerate(np.array_split(rec, SHARDS)):
        (dups / f"{b:05d}_00.dups").write_bytes(part.tobytes())
    return sig, verify, dups


def _datatrove(dups: str, out: str, conn) -> None:
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupCluster

    step = MinhashDedupCluster(dups, out, config=MinhashConfig(num_buckets=len(list(Path(dups).glob("*.dups")))))
    base = _rss_mb()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    step.run(None, 0, 1)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    removed = sum(len(p.read_bytes()) // 4 for p in Path(out).glob("*.remove"))
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    conn.send({"cpu_s": cpu, "wall_s": wall, "max_rss_mb": _rss_mb(), "base_rss_mb": base, "removed": removed})


def _one_task(verify: str, removal: str, shards: int, out: str, conn) -> None:
    from gristmill.dedup.lsh import components, kept_neighbour
    from gristmill.dedup.near import _shard_edges

    folder = Path(verify) / "verified"
    base = _rss_mb()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    loaders = [(lambda s=s: _shard_edges(folder, s)) for s in range(shards)]
    nodes, roots = (components if removal == "components" else kept_neighbour)(loaders)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    removed = np.sort(nodes[nodes != roots])
    np.save(out, removed)
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


def gristmill_cluster(
    sig: Path, verify: Path, work: Path, tasks: int, workers: int, removal: str, nodes: int, shards: int = SHARDS
) -> dict:
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
        planned_rounds,
    )
    from gristmill.dedup.order import load_ranks
    from gristmill.pipeline.execution.executors import make_executor
    from gristmill.pipeline.execution.usage import stage_usage
    from gristmill.pipeline.report.journey import merge_stage

    cfg = NearDedup.Config(removal=removal, cluster_tasks=tasks)
    R = planned_rounds(removal, nodes)  # what a run plans for this many documents in clusters
    plan = NearDedupPlan(
        cfg, 14, 9, 1, shards, cluster_tasks=tasks, cluster_rounds=R, signature_folder=sig, verify_folder=verify
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


def run_edges(run_dir: Path, work: Path) -> tuple[Path, Path, Path, int, int]:
    """A finished run's near-dedup inputs as they are (its signature stage's source tables, its
    verify stage's edge shards), and the same edges as datatrove's `.dups` (a document's file
    the order key's source rank, its index the rank of its offset within the source). Returns
    (signature folder, verify folder, dups folder, documents in clusters, edge shards)."""
    from gristmill.dedup.near import _shard_edges
    from gristmill.dedup.order import OFFSET_BITS

    (sig,) = [p for p in run_dir.iterdir() if p.name.endswith("_near_dedup_signature")]
    (verify,) = [p for p in run_dir.iterdir() if p.name.endswith("_near_dedup_verify")]
    shards = len(list((verify / "verified").glob("shard_*")))
    edges = np.concatenate([_shard_edges(verify / "verified", s) for s in range(shards)]).astype(np.uint64)
    keys, idx = np.unique(edges.reshape(-1), return_inverse=True)
    source = (keys >> np.uint64(OFFSET_BITS)).astype(np.int64)
    first = np.searchsorted(source, source, side="left")  # keys sort by source, then offset
    doc = np.arange(len(keys)) - first
    dups = work / "dups"
    dups.mkdir(parents=True)
    pairs = idx.reshape(-1, 2)
    rec = np.empty((len(pairs), 4), "<u4")
    rec[:, 0], rec[:, 1] = source[pairs[:, 0]], doc[pairs[:, 0]]
    rec[:, 2], rec[:, 3] = source[pairs[:, 1]], doc[pairs[:, 1]]
    for b, part in enumerate(np.array_split(rec, shards)):
        (dups / f"{b:05d}_00.dups").write_bytes(part.tobytes())
    return sig, verify, dups, len(keys), shards


def _timed(fn, *args):
    """fn(*args) with its CPU seconds (`time.process_time`) and tracemalloc peak bytes (0 when
    tracemalloc is off: it slows the many small allocations of reading files' headers)."""
    import tracemalloc

    on = tracemalloc.is_tracing()
    if on:
        tracemalloc.reset_peak()
    c0 = time.process_time()
    out = fn(*args)
    cpu = time.process_time() - c0
    return out, cpu, tracemalloc.get_traced_memory()[1] if on else 0


def calibrate_graph(
    edges: np.ndarray, work: Path, parts: int, removal: str, max_rounds: int = 256, memory: bool = True
) -> dict:
    """The real cluster code on `edges`, in this process, one partition after the other:
    `near_dedup_cluster_edges`' task per edge shard, every round until no message is sent
    (`Rounds.run`, each round its own folder as a planned round stage is), `Rounds.finish`.
    Per stage: CPU seconds (sum over partitions) and the largest partition's tracemalloc peak."""
    import tracemalloc

    from gristmill.dedup.cluster import Rounds
    from gristmill.dedup.near import NearDedup, NearDedupClusterEdges, NearDedupPlan
    from gristmill.dedup.order import load_ranks

    sig, verify, _ = write_inputs(edges, work, with_dups=False)
    cfg = NearDedup.Config(removal=removal, cluster_tasks=parts)
    plan = NearDedupPlan(cfg, 14, 9, 1, SHARDS, cluster_tasks=parts, cluster_rounds=max_rounds)
    plan.signature_folder, plan.verify_folder = sig, verify
    plan.cluster_edges_folder = work / "edges"
    plan.round_folders = [work / f"round_{r:03d}" for r in range(1, max_rounds + 1)]
    plan.rest_folder, plan.cluster_folder = work / "rest", work / "cluster"
    nodes = len(np.unique(edges))
    if memory:
        tracemalloc.start()
    try:
        step = NearDedupClusterEdges(plan)
        step.stage_folder = plan.cluster_edges_folder
        cpu = peak = 0.0
        for rank in range(parts):  # the edges stage runs a task per partition, as planned
            _, c, m = _timed(lambda r=rank: list(step.run(None, r, parts)))
            cpu, peak = cpu + c, max(peak, m)
        out = {"stages": {"edges": {"cpu_s": round(cpu, 3), "peak_mb": round(peak / 1e6, 1)}}, "rounds": []}
        rounds = Rounds(plan.cluster_edges_folder, plan.round_folders, plan.rest_folder, parts, removal == "components")
        r = 0
        while r == 0 or not rounds.converged(r):
            r += 1
            if r > max_rounds:
                raise RuntimeError(f"the graph did not converge in {max_rounds} rounds")
            cpu = peak = 0.0
            sent = changed = 0
            for q in range(parts):
                s, c, m = _timed(rounds.run, r, q)
                cpu, peak = cpu + c, max(peak, m)
                sent, changed = sent + s["sent"], changed + s["changed"]
            out["rounds"].append(
                {"cpu_s": round(cpu, 3), "peak_mb": round(peak / 1e6, 1), "sent": sent, "changed": changed}
            )
            print(f"  {removal}: round {r}: {cpu:.1f} CPU s, {sent:,} messages, peak {peak / 1e6:.0f} MB", flush=True)
        task_ranks, _ = load_ranks(sig)
        cpu = peak = 0.0
        removed = 0
        for q in range(parts):
            st, c, m = _timed(rounds.finish, q, task_ranks, plan.cluster_folder)
            cpu, peak, removed = cpu + c, max(peak, m), removed + st["removed"]
        out["stages"]["finish"] = {"cpu_s": round(cpu, 3), "peak_mb": round(peak / 1e6, 1)}
    finally:
        tracemalloc.stop()
    out.update(nodes=nodes, edges=len(edges), partitions=parts, final_round=r, removed=removed)
    return out


def _calibration_run(a, removal: str, nodes: int, extra: float, parts: int, memory: bool) -> dict:
    work = (a.work or Path(tempfile.mkdtemp(prefix="cluster_cal_"))) / f"{removal}_{extra}_{parts}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    edges = make_graph(nodes, extra=extra)
    what = "peak memory (tracemalloc)" if memory else "CPU"
    print(f"{removal}: graph of {nodes:,} documents, {len(edges):,} edges (extra {extra}), {parts} partitions: {what}")
    g = calibrate_graph(edges, work, parts, removal, memory=memory)
    g["extra"] = extra
    shutil.rmtree(work, ignore_errors=True)
    return g


def calibrate(a) -> int:
    """`--calibrate`: the cluster stages' CPU per node and per edge and peak memory on graphs of
    `--nodes` documents (two densities, so that per-node and per-edge costs separate), for each
    removal rule: CPU with tracemalloc off (it slows reading the files' headers 2-3x), then the
    same graphs again for each partition's tracemalloc peak (`--no-memory`: not); and the cost
    per (receiver, sender) pair of partitions a round reads, from `--pair-nodes` documents on
    `--pair-partitions` partitions. `--write-calibration` stores them in the plan's calibration."""
    from gristmill.pipeline.planning.projection import CALIBRATION_PATH, cluster_unit_costs

    result = {
        "measured": time.strftime("%Y-%m-%d"),
        "command": "PYTHONPATH=src python benchmarks/cluster_throughput.py --calibrate "
        f"--nodes {a.nodes} --partitions {a.partitions} --pair-nodes {a.pair_nodes} "
        f"--pair-partitions {' '.join(map(str, a.pair_partitions))}",
        "removal": {},
    }
    for removal in a.removal:
        graphs = []
        for extra in (0.2, 1.5):
            g = _calibration_run(a, removal, a.nodes, extra, a.partitions, memory=False)
            if not a.no_memory:
                m = _calibration_run(a, removal, a.nodes, extra, a.partitions, memory=True)
                for k in g["stages"]:
                    g["stages"][k]["peak_mb"] = m["stages"][k]["peak_mb"]
                for x, y in zip(g["rounds"], m["rounds"]):
                    x["peak_mb"] = y["peak_mb"]
            graphs.append(g)
            total = sum(x["cpu_s"] for x in g["stages"].values()) + sum(x["cpu_s"] for x in g["rounds"])
            print(
                f"{removal}: {g['nodes']:,} nodes, {g['edges']:,} edges: {g['final_round']} rounds, "
                f"{total:.1f} CPU s ({total / g['nodes'] * 1e6:.2f} us a node), removed {g['removed']:,}"
            )
        pairs = [_calibration_run(a, removal, a.pair_nodes, 0.2, p, memory=False) for p in a.pair_partitions]
        result["removal"][removal] = {"graphs": graphs, "pairs": pairs}
        fit = cluster_unit_costs(result["removal"][removal])
        for stage, f in fit.items():
            print(
                f"{removal}: {stage}: {f['per_node'] * 1e6:.3f} us a node + {f['per_edge'] * 1e6:.3f} us an edge, "
                f"+ {f['per_pair'] * 1e6:.0f} us a pair of partitions, "
                f"peak {f['peak_bytes_per_node']:.0f} B a node of a partition"
            )
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    if a.write_calibration:
        cal = json.loads(CALIBRATION_PATH.read_text())
        cal["cluster"] = result
        CALIBRATION_PATH.write_text(json.dumps(cal, indent=1) + "\n")
        print(f"wrote {CALIBRATION_PATH} (cluster)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1_000_000, help="documents in clusters")
    ap.add_argument("--giant", type=int, default=0, help="documents of one more component, a path")
    ap.add_argument(
        "--edges", type=Path, default=None, help="a finished run directory with near_dedup: its verified edges"
    )
    ap.add_argument("--tasks", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=None, help="folder for the inputs and runs (default: a temporary one)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument(
        "--calibrate", action="store_true", help="measure the cluster stages' unit costs for `pipeline plan`"
    )
    ap.add_argument("--partitions", type=int, default=16, help="--calibrate: graph partitions")
    ap.add_argument("--removal", nargs="+", default=["kept_neighbour", "components"], help="--calibrate: rules")
    ap.add_argument("--json", type=Path, default=None, help="--calibrate: write the figures here")
    ap.add_argument("--no-memory", action="store_true", help="--calibrate: CPU only, no tracemalloc pass")
    ap.add_argument("--pair-nodes", type=int, default=1_000_000, help="--calibrate: graph of the pairs' cost")
    ap.add_argument("--pair-partitions", type=int, nargs=2, default=[16, 128], help="--calibrate: its partitions")
    ap.add_argument("--write-calibration", action="store_true", help="--calibrate: into scale_calibration.json")
    a = ap.parse_args(argv)
    if a.write_calibration and (a.smoke or not a.calibrate):
        ap.error("--write-calibration needs --calibrate and is refused with --smoke")
    if a.smoke:
        a.nodes, a.tasks, a.partitions, a.pair_nodes, a.pair_partitions = 3000, [1, 4], 4, 3000, [2, 4]
    if a.calibrate:
        return calibrate(a)
    work = a.work or Path(tempfile.mkdtemp(prefix="cluster_bench_"))
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    t = time.monotonic()
    if a.edges is not None:
        sig, verify, dups, n, shards = run_edges(a.edges, work)
        print(f"edges of {a.edges}: {n:,} documents in clusters, {shards} edge shards")
    else:
        edges = make_graph(a.nodes, giant=a.giant)
        sig, verify, dups = write_inputs(edges, work)
        n, shards = len(np.unique(edges)), SHARDS
        print(f"graph: {n:,} documents in clusters, {len(edges):,} edges ({time.monotonic() - t:.1f} s to make)")
    try:
        import datatrove  # noqa: F401

        dt = _in_subprocess(_datatrove, str(dups), str(work / "dt_out"))
    except ImportError:
        dt = None
        print("datatrove MinhashDedupCluster: skipped (not installed: pip install -e '.[bench]')")
    results = {}
    for removal in ("components", "kept_neighbour"):
        ref = _in_subprocess(_one_task, str(verify), removal, shards, str(work / f"removed_{removal}.npy"))
        want = np.load(work / f"removed_{removal}.npy")
        print(
            f"{removal}: one-task union (lsh.{'components' if removal == 'components' else 'kept_neighbour'}): "
            f"{ref['cpu_s']:.2f} CPU s, peak {ref['max_rss_mb']:.0f} MB (base {ref['base_rss_mb']:.0f}), "
            f"removed {ref['removed']:,}"
        )
        for tasks in a.tasks:
            r = gristmill_cluster(sig, verify, work / f"{removal}_{tasks}", tasks, a.workers, removal, n, shards)
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
