"""`near_dedup`'s clustering on N tasks: both removal rules as rounds of messages between
partitions of the duplicate graph, each partition (the nodes whose hash is its number, `part_of`)
held by one task, so a task's memory is set by the number of partitions, not by the corpus.

Stages (planned by `NearDedup.stages`; N = `cluster_tasks`, R = `cluster_rounds`):

1. `near_dedup_cluster_edges` (N): every verified edge (a, b) becomes two entries (src, dst),
   (a, b) for a's partition and (b, a) for b's, written by each task as parts sorted by
   destination partition with an index of where each partition starts (`Outbox`): a reader
   takes its slice of every part by that index, memory-mapped, a chunk at a time (`inbox`).
2. `near_dedup_cluster_round` (N, R stages): task q loads its partition's state from the round
   before (its first round: the node keys, from its edge entries), applies the messages sent to
   its nodes in the round before, and sends new ones along its entries (read again, a chunk at a
   time), from the nodes whose state changed:
   - `components`: min-label propagation with pointer jumping. A node's label is the smallest
     node key it has heard of; a label that falls is sent to every neighbour, and the node asks
     the node its label names for that node's own label (answered the next round). When no
     label falls anywhere, each node's label is the smallest key of its component: its first
     document in the order key, the root `lsh.components` gives. Rounds: bounded by the largest
     distance from a component's first document to its others plus one (propagation alone);
     jumping halves the distance a label has left every two rounds along a chain of labels, so
     long chains take ~2 log2(length) rounds (measured: docs/dedup.md);
   - `kept_neighbour`: the rounds of `lsh.kept_neighbour`, as messages: a node decided in a
     round tells its later neighbours (kept: its key; removed: that it is); a node with a kept
     earlier neighbour is removed for the smallest one heard of, a node all of whose earlier
     neighbours are removed is kept. Rounds: the longest chain of decisions (a document kept
     because the one it is near was removed because ...), plus one.
   Both rules also send the cluster sizes' counts (a node that joins a root adds one to it, a
   label that moves takes one from the old root), so a root's count is its cluster's size when
   the rounds end, with no shuffle after. A round in which no task sent a message is the last:
   every later round's task finds that in the round's summaries and finishes at once (no state
   read, nothing written but its summary).
3. `near_dedup_cluster_rest` (1): a graph that needs more than R rounds continues here, the same
   rounds with the N partitions taken one after the other in one process (one partition held at a
   time: the same memory as a round task), until no message is sent. Nothing to do (an instant
   task) when the planned rounds sufficed, which is the case on every graph measured
   (docs/dedup.md).
4. `near_dedup_cluster` (N): task q writes its partition's (node, root) pairs, its cluster-size
   histogram, and the removed documents sorted by the `near_dedup_filter` task that reads their
   source, with an index (each filter task reads its own slice of every partition's file).

Why rounds are stages and not a loop inside one stage: a loop would need every task of the stage
to run at once (a barrier between rounds), which neither a local run with fewer workers than
tasks nor a Slurm array with a concurrency limit gives; a stage per round is resumable and runs on
every executor as any stage does, and a round after the last costs only its tasks' start.

Every file is written whole or not at all (`save_npy_atomic`) and depends only on the round
before, so a killed round's task, run again, writes the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gristmill.core.files import replacing, save_npy_atomic, write_text_atomic
from gristmill.core.run_folder import AS_GIVEN, RunFolder
from gristmill.dedup.lsh import shard_of
from gristmill.dedup.order import OFFSET_BITS

EDGE = np.dtype([("src", "<u8"), ("dst", "<u8")])
MSG = np.dtype([("dst", "<u8"), ("val", "<u8"), ("kind", "i1")])
#: a partition's nodes: key, root (label / kept neighbour), cluster count, earlier neighbours,
#: removed earlier neighbours heard of, decision (kept_neighbour: 0 undecided, 1 kept, 2 removed)
STATE = np.dtype(
    [("node", "<u8"), ("root", "<u8"), ("count", "<i8"), ("earlier", "<i8"), ("removed_in", "<i8"), ("state", "i1")]
)
#: message kinds: components (ASK: "send your label to `val`", pointer jumping)
LABEL, JOIN, LEAVE, ASK = 0, 1, 2, 3
#: message kinds: kept_neighbour
KEPT, REMOVED, REMOVED_FOR = 0, 1, 2
NONE = np.uint64(0xFFFFFFFFFFFFFFFF)
#: records read at a time from an edge or message file (16-17 bytes each)
CHUNK = 1 << 20
#: records an outbox holds before writing them as one sorted part
SPILL = 1 << 20
#: bytes a round task holds per node of its partition: the state (41), the labels before the
#: round, the changed flags and the per-round counts (measured: docs/dedup.md)
ROUND_BYTES_PER_NODE = 80
#: a round task's fixed part: a chunk read (and its lookups) and an outbox's spill while sorted
ROUND_FIXED_BYTES = 48 * CHUNK + 3 * MSG.itemsize * SPILL


def part_of(nodes: np.ndarray, parts: int) -> np.ndarray:
    """The partition (task) that holds each node."""
    return shard_of(np.asarray(nodes, dtype=np.uint64), parts).astype(np.int64)


class Outbox:
    """Records for N partitions, written as parts `task_RRRRR.partPPPPP.rec.npy` sorted by the
    partition of `key` (stable: in the order added), each with `.idx.npy`, the N+1 offsets of the
    partitions' slices. Holds at most ~`spill` records."""

    def __init__(self, folder: Path, rank: int, parts: int, dtype: np.dtype, key: str, spill: int = SPILL):
        self.folder, self.rank, self.parts, self.dtype, self.key, self.spill = folder, rank, parts, dtype, key, spill
        self.buf: list[np.ndarray] = []
        self.held = self.part = self.written = 0

    def add(self, rec: np.ndarray) -> None:
        if len(rec):
            self.buf.append(rec)
            self.held += len(rec)
            if self.held >= self.spill:
                self._write()

    def _write(self) -> None:
        rec = np.concatenate(self.buf) if self.buf else np.empty(0, self.dtype)
        self.buf, self.held = [], 0
        where = part_of(rec[self.key], self.parts)
        # a stable sort of small integers: numpy's radix sort for 16-bit keys, linear
        order = np.argsort(where.astype(np.uint16) if self.parts <= 1 << 16 else where, kind="stable")
        rec, where = rec[order], where[order]
        del order
        idx = np.searchsorted(where, np.arange(self.parts + 1)).astype(np.int64)
        base = self.folder / f"task_{self.rank:05d}.part{self.part:05d}"
        save_npy_atomic(Path(f"{base}.rec.npy"), rec)
        save_npy_atomic(Path(f"{base}.idx.npy"), idx)
        self.written += len(rec)
        self.part += 1

    def close(self) -> int:
        """Writes what is held (an empty part if nothing was ever written: every sender has a
        file, so a missing one is an error, not an empty slice); the records written."""
        if self.held or self.part == 0:
            self._write()
        return self.written


def inbox(
    folder: Path, part: int, parts: int, senders: int, dtype: np.dtype, chunk: int = CHUNK
) -> Iterator[np.ndarray]:
    """Partition `part`'s slice of every sender's parts in `folder` (local), a chunk at a time, in
    (sender, part) order. Refuses, naming the file, a sender with no part, a part without its
    index, or a part shorter or of another layout than its index says (truncated, overwritten)."""
    files = sorted(folder.glob("task_*.part*.rec.npy"))
    have = {int(f.name[5:10]) for f in files}
    missing = sorted(set(range(senders)) - have)
    if missing:
        raise ValueError(
            f"{folder}: no part of task {missing[0]} ({len(missing)} of {senders} tasks missing): "
            "the stage that writes them did not finish; run the step again"
        )
    for f in files:
        ix = Path(str(f)[: -len(".rec.npy")] + ".idx.npy")
        try:
            idx = np.load(ix)
            m = np.load(f, mmap_mode="r")
        except (OSError, ValueError, EOFError) as e:
            raise ValueError(f"{f}: unreadable ({e}); run the step again with --force") from None
        if m.dtype != dtype or len(idx) != parts + 1 or int(idx[-1]) != len(m):
            raise ValueError(
                f"{f}: {len(m)} records of {m.dtype}, its index says {int(idx[-1]) if len(idx) else 0} "
                f"in {len(idx) - 1} partitions (expected {dtype} in {parts}); run the step again with --force"
            )
        lo, hi = int(idx[part]), int(idx[part + 1])
        for i in range(lo, hi, chunk):
            yield np.array(m[i : min(i + chunk, hi)])


def _indexes(folder: Path) -> list[np.ndarray]:
    """The partition offsets of every part in an outbox folder (local)."""
    return [np.load(f) for f in sorted(folder.glob("task_*.part*.idx.npy"))]


def read_edge_file(path: Path, chunk: int = CHUNK) -> Iterator[np.ndarray]:
    """An (E, 2) uint64 edge file a chunk at a time; one clear line if it is not one."""
    try:
        m = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{path}: edge file unreadable ({e}); run near_dedup again with --force") from None
    if m.dtype != np.uint64 or m.ndim != 2 or (m.shape[1] != 2 and len(m)):
        raise ValueError(f"{path}: not an (E, 2) uint64 edge file ({m.dtype}, shape {m.shape})")
    for i in range(0, len(m), chunk):
        yield np.array(m[i : i + chunk])


def lookup(nodes: np.ndarray, keys: np.ndarray, where: Path) -> np.ndarray:
    """Indices of `keys` in the sorted `nodes`; refuses a key that is not there (a message or an
    entry for a node this partition does not hold: files of another run or partition count)."""
    i = np.searchsorted(nodes, keys)
    bad = (i >= len(nodes)) | (nodes[np.minimum(i, len(nodes) - 1)] != keys) if len(nodes) else np.ones(len(keys), bool)
    if bad.any():
        raise ValueError(
            f"{where}: record for node {int(keys[bad][0])}, not one of this partition's {len(nodes)} nodes "
            "(files of another run?); run near_dedup again with --force"
        )
    return i


def _histogram(counts: np.ndarray) -> dict[str, int]:
    counts = counts[counts >= 2]
    sizes, n = np.unique(counts, return_counts=True) if len(counts) else ([], [])
    return {str(int(k)): int(v) for k, v in zip(sizes, n)}


def owner_tasks(task_ranks: dict[int, np.ndarray]) -> np.ndarray:
    """Source rank -> the signature (and filter) task that read it."""
    size = 1 + max((int(r.max()) for r in task_ranks.values() if len(r)), default=-1)
    owner = np.zeros(size, dtype=np.int64)
    for t, ranks in task_ranks.items():
        owner[ranks.astype(np.int64)] = t
    return owner


def removed_slices(folder: Path, task: int) -> np.ndarray:
    """Sorted order keys of the documents `task` of `near_dedup_filter` must drop: its slice of
    every partition's `removed/part_QQQQQ` file (in `folder`, local)."""
    out = []
    for f in sorted(folder.glob("part_*.rec.npy")):
        idx = np.load(Path(str(f)[: -len(".rec.npy")] + ".idx.npy"))
        m = np.load(f, mmap_mode="r")
        if task + 1 < len(idx):
            out.append(np.array(m[int(idx[task]) : int(idx[task + 1])]))
    return np.sort(np.concatenate(out)) if out else np.empty(0, np.uint64)


def read_clusters(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, roots) of every clustered document, sorted by node, from a `near_dedup_cluster`
    stage folder (its partitions' `dups/clusters_QQQQQ.npy`): what `lsh.components` /
    `lsh.kept_neighbour` return for the same edges. Holds every clustered document: for tests,
    benchmarks and inspection, not for a run."""
    parts = [np.load(f) for f in sorted((Path(folder) / "dups").glob("clusters_*.npy"))]
    cl = np.concatenate(parts) if parts else np.empty((0, 2), np.uint64)
    cl = cl[np.argsort(cl[:, 0], kind="stable")]
    return cl[:, 0], cl[:, 1]


def cluster_sizes(folder: Path) -> dict[str, int] | None:
    """The cluster-size histogram of a `near_dedup_cluster` stage folder (sum of its partitions'),
    or None when it has none."""
    files = sorted(Path(folder).glob("dups/sizes_*.json"))
    if not files:
        return None
    total: dict[int, int] = {}
    for f in files:
        for k, v in json.loads(f.read_text())["sizes"].items():
            total[int(k)] = total.get(int(k), 0) + v
    return {str(k): total[k] for k in sorted(total)}


class Rounds:
    """The rounds of one planned clustering: where each round's state and messages are, and one
    round's work for one partition (`run`). `rounds[r - 1]` is the stage folder of round r <= R;
    later rounds live in the `near_dedup_cluster_rest` folder. The folders are in `run_folder`,
    which fetches what a round reads (a run on object storage)."""

    def __init__(
        self,
        edges: Path,
        rounds: list[Path],
        rest: Path,
        parts: int,
        components: bool,
        run_folder: RunFolder = AS_GIVEN,
    ):
        self.edges, self.rest = run_folder.path(edges), run_folder.path(rest)
        self.rounds = [run_folder.path(r) for r in rounds]
        self.parts, self.components, self.run_folder = parts, components, run_folder
        self._converged: dict[int, bool] = {}
        #: records read at a time and held by an outbox (instance attributes: tests make them tiny)
        self.chunk, self.spill = CHUNK, SPILL

    def state_dir(self, r: int) -> Path:
        return self.rounds[r - 1] / "dups" if r <= len(self.rounds) else self.rest / "dups" / f"round_{r:05d}"

    def msg_dir(self, r: int) -> Path:
        return self.rounds[r - 1] / "edges" if r <= len(self.rounds) else self.rest / "edges" / f"round_{r:05d}"

    def summary_path(self, r: int, q: int) -> Path:
        return self.state_dir(r) / f"summary_{q:05d}.json"

    def summaries(self, r: int) -> list[dict]:
        out = []
        for q in range(self.parts):
            f = self.run_folder.staged(self.summary_path(r, q))
            if not f.is_file():
                raise ValueError(
                    f"{f}: missing: round {r} of near_dedup's clustering did not finish; run the step again"
                )
            out.append(json.loads(f.read_text()))
        return out

    def converged(self, r: int) -> bool:
        """Round r sent no message: every partition's state after it is final."""
        if r not in self._converged:
            self._converged[r] = sum(s["sent"] for s in self.summaries(r)) == 0
        return self._converged[r]

    def final_round(self) -> int:
        """The first round that sent no message (the planned rounds', then the rest's): the rounds
        the graph took."""
        r = 1
        while not self.converged(r):
            r += 1
        return r

    def state(self, r: int, q: int) -> np.ndarray:
        """Partition q's state after round r (a converged round keeps the state of the one it
        found converged)."""
        s = json.loads(self.run_folder.staged(self.summary_path(r, q)).read_text())
        return np.load(self.run_folder.staged(self.state_dir(s["state_round"]), f"part_{q:05d}.npy"))

    def entries(self, q: int) -> Iterator[np.ndarray]:
        """Partition q's edge entries (src in q), a chunk at a time."""
        return inbox(self.run_folder.staged(self.edges, "edges"), q, self.parts, self.parts, EDGE, self.chunk)

    def _first(self, q: int) -> np.ndarray:
        nodes = np.empty(0, np.uint64)
        for e in self.entries(q):
            nodes = np.union1d(nodes, e["src"])
        st = np.zeros(len(nodes), STATE)
        st["node"] = nodes
        st["count"] = 1
        if self.components:
            st["root"] = nodes
        else:
            st["root"] = NONE
            for e in self.entries(q):
                i = lookup(nodes, e["src"], self.edges)
                st["earlier"] += np.bincount(i[e["dst"] < e["src"]], minlength=len(nodes))
        return st

    def run(self, r: int, q: int) -> dict:
        """Round r for partition q; returns (and writes, last) its summary."""
        _sweep(self.state_dir(r), f"*_{q:05d}.*.tmp")
        _sweep(self.msg_dir(r), f"task_{q:05d}.part*.tmp")
        if r > 1 and self.converged(r - 1):
            prev = json.loads(self.run_folder.staged(self.summary_path(r - 1, q)).read_text())
            summary = {"sent": 0, "state_round": prev["state_round"], "changed": 0, "nodes": prev["nodes"]}
            write_text_atomic(self.summary_path(r, q), json.dumps(summary))
            return summary
        if r == 1:
            st = self._first(q)
        else:
            st = self.state(r - 1, q)
        nodes = st["node"]
        n = len(nodes)
        out = Outbox(self.msg_dir(r), q, self.parts, MSG, "dst", self.spill)
        if self.components:
            changed = self._components(st, r, q, out)
        else:
            changed = self._kept(st, r, q, out)
        if changed.any() or r == 1:
            for e, i in self._entries_at(q, nodes, r):
                a = changed[i]
                if not self.components:
                    a &= e["src"] < e["dst"]  # decisions go to later neighbours only
                if a.any():
                    m = np.empty(int(a.sum()), MSG)
                    m["dst"] = e["dst"][a]
                    if self.components:
                        m["val"], m["kind"] = st["root"][i[a]], LABEL
                    else:
                        kept = st["state"][i[a]] == 1
                        m["val"] = np.where(kept, e["src"][a], NONE)
                        m["kind"] = np.where(kept, KEPT, REMOVED)
                    out.add(m)
        save_npy_atomic(self.state_dir(r) / f"part_{q:05d}.npy", st)
        sent = out.close()
        summary = {"sent": sent, "state_round": r, "changed": int(changed.sum()), "nodes": n}
        if not self.components:
            summary["undecided"] = int((st["state"] == 0).sum())
        write_text_atomic(self.summary_path(r, q), json.dumps(summary))
        return summary

    def _entries_at(self, q: int, nodes: np.ndarray, r: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Partition q's entries a chunk at a time, each with its source's index in `nodes`:
        looked up in round 1 and written (`dups/entries_QQQQQ.npy`, 8 bytes an entry, filled a
        chunk at a time through a memory map), read back by the later rounds (the lookup was
        the largest cost of a round)."""
        path = self.state_dir(1) / f"entries_{q:05d}.npy"
        if r > 1:
            index = np.load(self.run_folder.staged(path), mmap_mode="r")
            at = 0
            for e in self.entries(q):
                yield e, np.array(index[at : at + len(e)])
                at += len(e)
            return
        total = sum(int(i[q + 1] - i[q]) for i in _indexes(self.run_folder.staged(self.edges, "edges")))
        with replacing(path) as tmp:
            index = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(total,))
            at = 0
            for e in self.entries(q):
                i = lookup(nodes, e["src"], self.edges)
                index[at : at + len(e)] = i
                at += len(e)
                yield e, i
            index.flush()
            del index

    def _received(self, r: int, q: int) -> Iterator[np.ndarray]:
        if r > 1:
            yield from inbox(self.run_folder.staged(self.msg_dir(r - 1)), q, self.parts, self.parts, MSG, self.chunk)

    def _components(self, st: np.ndarray, r: int, q: int, out: Outbox) -> np.ndarray:
        """Applies the labels and counts sent, then answers the nodes that asked one of its nodes
        for its label (pointer jumping: a node whose label fell to L asks L for L's own label, so
        a label travels a chain in ~2 log2(length) rounds, not one link a round); the nodes whose
        label fell (round 1: all, so every node tells its neighbours its own key). Sends the
        counts of the moves and the questions."""
        nodes = st["node"]
        n = len(nodes)
        before = st["root"].copy()
        for m in self._received(r, q):
            i = lookup(nodes, m["dst"], self.msg_dir(r - 1))
            lab = m["kind"] == LABEL
            np.minimum.at(st["root"], i[lab], m["val"][lab])
            st["count"] += np.bincount(i[m["kind"] == JOIN], minlength=n) - np.bincount(
                i[m["kind"] == LEAVE], minlength=n
            )
        for m in self._received(r, q):  # the labels after this round's: answers in the next
            ask = m[m["kind"] == ASK]
            if len(ask):
                a = np.empty(len(ask), MSG)
                a["dst"], a["val"], a["kind"] = (
                    ask["val"],
                    st["root"][lookup(nodes, ask["dst"], self.msg_dir(r - 1))],
                    LABEL,
                )
                out.add(a)
        if r == 1:
            return np.ones(n, bool)
        moved = st["root"] != before
        if moved.any():
            hook = moved & (before != nodes)
            for dst, val, kind in (
                (before[moved], 0, LEAVE),
                (st["root"][moved], 0, JOIN),
                (st["root"][moved], nodes[moved], ASK),
                (before[hook], st["root"][hook], LABEL),  # the old label's node: its tree hooks under the new
            ):
                m = np.empty(len(dst), MSG)
                m["dst"], m["val"], m["kind"] = dst, val, kind
                out.add(m)
        return moved

    def _kept(self, st: np.ndarray, r: int, q: int, out: Outbox) -> np.ndarray:
        """Applies the decisions heard of; decides what can be (`lsh.kept_neighbour`'s round);
        the nodes decided now. Sends each removed node's +1 to the kept one it is removed for."""
        nodes = st["node"]
        n = len(nodes)
        for m in self._received(r, q):
            i = lookup(nodes, m["dst"], self.msg_dir(r - 1))
            k = (m["kind"] == KEPT) & (st["state"][i] == 0)  # a decided node keeps the one it was removed for
            np.minimum.at(st["root"], i[k], m["val"][k])
            st["removed_in"] += np.bincount(i[m["kind"] == REMOVED], minlength=n)
            st["count"] += np.bincount(i[m["kind"] == REMOVED_FOR], minlength=n)
        todo = st["state"] == 0
        gone = todo & (st["root"] != NONE)
        kept = todo & ~gone & (st["removed_in"] == st["earlier"])
        st["state"][gone] = 2
        st["state"][kept] = 1
        if gone.any():
            m = np.empty(int(gone.sum()), MSG)
            m["dst"], m["val"], m["kind"] = st["root"][gone], 0, REMOVED_FOR
            out.add(m)
        return gone | kept

    def finish(self, q: int, task_ranks: dict[int, np.ndarray], folder: Path) -> dict:
        """Partition q's results into the `near_dedup_cluster` stage `folder`: `dups/clusters`
        (node, root), `dups/sizes` (histogram), `removed/part` (by filter task). Counters."""
        st = self.state(self.final_round(), q)
        nodes = st["node"]
        if self.components:
            roots, counts = st["root"], st["count"][st["root"] == nodes]
        else:
            if (st["state"] == 0).any():
                raise ValueError(
                    f"{self.state_dir(self.final_round())}: partition {q} has undecided nodes after the last round"
                )
            roots = np.where(st["state"] == 2, st["root"], nodes)
            counts = st["count"][st["state"] == 1]
        save_npy_atomic(folder / "dups" / f"clusters_{q:05d}.npy", np.stack([nodes, roots], axis=1))
        write_text_atomic(folder / "dups" / f"sizes_{q:05d}.json", json.dumps({"sizes": _histogram(counts)}))
        removed = np.sort(nodes[nodes != roots])
        owner = owner_tasks(task_ranks)[(removed >> np.uint64(OFFSET_BITS)).astype(np.int64)]
        order = np.argsort(owner, kind="stable")
        removed, owner = removed[order], owner[order]
        tasks = max(task_ranks, default=-1) + 1
        save_npy_atomic(folder / "removed" / f"part_{q:05d}.rec.npy", removed)
        save_npy_atomic(
            folder / "removed" / f"part_{q:05d}.idx.npy", np.searchsorted(owner, np.arange(tasks + 1)).astype(np.int64)
        )
        return {
            "documents_in_clusters": len(nodes),
            "clusters": int((counts >= 2).sum()),
            "removed": len(removed),
        }


def _sweep(folder: Path, pattern: str) -> None:
    """Remove what an earlier attempt of a partition's task, killed outright, left half written in
    `folder`: temporary files (`core.files.temporary_path`) of names only that task writes."""
    if folder.is_dir():
        for stale in folder.glob(pattern):
            stale.unlink(missing_ok=True)
