"""`near_dedup`: MinHash-LSH near-duplicate removal across tasks, clustering out of core.

Stages (laid out by `NearDedup.stages`; T = executor.tasks):

1. `near_dedup_signature` (T): shingles (normalised word n-grams, `text.shingle_hashes`: each
   word hashed once, n-grams combined in numpy), MinHash signatures (`minhash.MinHasher`,
   vectorised per batch), one key per LSH band; writes per band
   `bands/band_BBB/task_RRRRR.partPPPPP.npy` = (key, source index, offset) records, sorted by
   key, one part per `SPILL_DOCS` documents (so a task holds at most that many: ~20 bytes x
   bands each, plus 8 bytes per document of order keys), and the task's sources table.
2. `near_dedup_buckets` (b x R: one (band, key range) pair per task; R and the task count from
   `bucket_tasks`: R = `key_ranges`, default ceil(T / b), more when a pair would not fit a
   task's memory; with T < b and no `key_ranges`, T tasks of whole bands): a task takes its range
   of the 64-bit key space (`lsh.key_range_bounds`) from every signature task's file of its band
   (binary search in the memory-mapped, key-sorted file: only that slice is read), sorts by
   (key, order key); runs of equal keys give star edges (first document, other)
   (`lsh.sorted_band_edges`), written to `edges/shard_SSS/band_BBB.range_GGGGG.npy` by anchor.
   Equal keys share a range, so the edges are exactly the band's, in the same order, for any R.
3. `near_dedup_shingles` (T, if `verify`): re-reads the documents; for the candidates only (the
   documents of some edge) recomputes the shingle set and writes it to the shards that need it.
4. `near_dedup_verify` (T, if `verify`): per shard, the exact Jaccard of every candidate pair;
   keeps the edges with Jaccard >= threshold (drops LSH false positives).
5. the cluster stages (`cluster_tasks` tasks, `dedup/cluster.py`): `near_dedup_cluster_edges`,
   `cluster_rounds` x `near_dedup_cluster_round`, `near_dedup_cluster_rest` (1 task, nothing to
   do unless the graph needs more rounds), `near_dedup_cluster`: each task holds one partition
   of the duplicate graph. By default (`removal: kept_neighbour`) a document is removed when an
   earlier document it is a verified pair with is kept, so every removal is within the threshold
   of the document kept in its place; `removal: components` removes every document of a
   connected component but its first (order key), as datatrove does, where chains remove
   documents far from the kept one (docs/scale.md). The same removals as the one-task
   `lsh.kept_neighbour` / `lsh.components` (tests/dedup/test_cluster.py).
6. `near_dedup_filter` (T): drops the removed documents (reason `near_duplicate`).

Memory models (each phase's `memory_bytes`; measured figures in docs/scale.md, "Near dedup
memory models"):
- a buckets task holds ~33 bytes per record of its (band, key range): ~33 x N / R for N
  documents, so `key_ranges` (R) bounds it whatever the corpus (`BUCKET_BYTES_PER_RECORD`);
- a cluster task holds ~80 bytes per document of its partition (documents in clusters /
  `cluster_tasks`) and fixed chunk and spill buffers (`cluster.ROUND_BYTES_PER_NODE`).

Every phase reads one `NearDedupPlan` (`self.params`), resolved once by `NearDedup.stages`.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from pydantic import Field, model_validator

from gristmill.core.configlib import Strict
from gristmill.core.documents import text_bytes
from gristmill.core.files import save_npy_atomic, write_text_atomic
from gristmill.core.parquet_io import ParquetReader
from gristmill.core.run_folder import AS_GIVEN, RunFolder
from gristmill.core.step import BASE_TASK_BYTES, DOCUMENT_BYTES_PER_BYTE, GlobalStep, StageContext, Workload
from gristmill.dedup.cluster import (
    CHUNK as CLUSTER_CHUNK,
)
from gristmill.dedup.cluster import (
    EDGE,
    ROUND_BYTES_PER_NODE,
    ROUND_FIXED_BYTES,
    Outbox,
    Rounds,
    read_edge_file,
    removed_slices,
)
from gristmill.dedup.cluster import (
    SPILL as CLUSTER_SPILL,
)
from gristmill.dedup.lsh import (
    band_keys,
    key_range_bounds,
    optimal_bands,
    shard_of,
    sort_records,
    sorted_band_edges,
)
from gristmill.dedup.minhash import EMPTY, MinHasher
from gristmill.dedup.order import (
    OFFSET_BITS,
    DocKeys,
    SourceTable,
    check_unique,
    load_ranks,
    order_key,
)
from gristmill.dedup.phase import DedupFilterPhase, DedupPhase
from gristmill.dedup.text import jaccard, shingle_chunks, shingle_hashes, shingles, words
from gristmill.text.words import CHUNK_CHARS

BAND_REC = np.dtype([("key", "<u8"), ("src", "<u4"), ("offset", "<i8")])
#: bytes a buckets task holds per record of its pair (33.3 measured; tests/dedup/test_buckets.py bounds it by 36)
BUCKET_BYTES_PER_RECORD = 36
BATCH_DOCS = 256
#: characters of text a signature batch holds: it closes once it reaches this (256 web pages are
#: ~1.3M characters)
BATCH_CHARS = 4_000_000
_SCAN_RECORDS = 1 << 20  # records read at a time when a task scans a whole band file
#: documents whose band records a signature task holds before writing them as a sorted part
#: (20 bytes x bands each: ~18 MB at 14 bands; then the argsort of one band at a time)
SPILL_DOCS = 1 << 16
#: shingles a `near_dedup_shingles` task holds before writing them (8 bytes each: 32 MB)
SPILL_SHINGLES = 1 << 22
#: share of documents that are in some candidate pair, for the memory models of the stages that
#: hold candidates (shingles, verify, cluster, filter). An assumption, not a bound: the generated
#: corpora measure ~0.1 (docs/scale.md); raise it for crawls known to repeat more.
CANDIDATE_SHARE = 0.3
#: bytes of text per shingle (a 5-word shingle per word; ~6 bytes per word with its space)
TEXT_BYTES_PER_SHINGLE = 6


@dataclass
class NearDedupPlan:
    """What every phase of one `near_dedup` step reads (`self.params`): built once by
    `NearDedup.stages`, shared by all its phases. The stage folders (names in the run folder, as
    `Stage.label`) are set as `stages()` adds each stage, so they are complete before any task
    runs; a phase reads only earlier ones, through its `run_folder`."""

    #: the step's validated parameters
    config: NearDedup.Config
    #: LSH bands and rows per band (`Config.band_rows`)
    bands: int
    rows: int
    #: key ranges per band of `near_dedup_buckets` (`bucket_tasks`)
    ranges: int
    #: edge shards: one per verify task (executor.tasks)
    shards: int
    #: tasks (graph partitions) of the cluster stages (`cluster_tasks`), rounds planned as stages
    cluster_tasks: int = 1
    cluster_rounds: int = 1
    #: YAML name of the step that planned the phases: what their errors name
    step: str = "near_dedup"
    signature_folder: Path | None = None
    buckets_folder: Path | None = None
    shingles_folder: Path | None = None
    verify_folder: Path | None = None
    cluster_edges_folder: Path | None = None
    round_folders: list[Path] = field(default_factory=list)
    rest_folder: Path | None = None
    cluster_folder: Path | None = None

    @property
    def candidate_edges(self) -> Path:
        """The buckets' edges (LSH candidates), `edges/shard_SSS/*.npy`."""
        return self.buckets_folder / "edges"

    @property
    def cluster_edges(self) -> Path:
        """The edges the cluster stage joins: verified ones, or the candidates without `verify`."""
        return self.verify_folder / "verified" if self.config.verify else self.candidate_edges


class NearDedupSignature(DedupPhase[NearDedupPlan]):
    step_name = "near_dedup_signature"

    def __init__(self, params: NearDedupPlan, *, step_id: str | None = None):
        super().__init__(params, step_id=step_id)
        self.spill_docs = SPILL_DOCS

    def memory_bytes(self, work: Workload) -> int:
        """Band records of up to `spill_docs` documents (20 bytes x bands, three copies while a
        part is sorted and written), 8 bytes per document of order keys, a batch of documents
        (up to `BATCH_CHARS` characters) and their words and shingles."""
        return int(
            60 * self.params.bands * min(work.documents_per_task, self.spill_docs)
            + 8 * work.documents_per_task
            + (DOCUMENT_BYTES_PER_BYTE + 20) * BATCH_CHARS
        )

    #: a long page is shingled a `CHUNK_CHARS` piece at a time (its words, hashes, signature
    #: temporaries: bounded by the piece, the fixed part); what grows with it is the casefolded
    #: page only (measured: 26, 64 and 90 MB over 2, 8 and 30 MB pages, docs/scale.md "Large records")
    document_factor = 2.0
    document_fixed = 56 << 20

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p = self.params
        bands, rows = p.bands, p.rows
        hasher = MinHasher(p.config.num_perm, p.config.seed)
        sources = SourceTable()
        out: list[np.ndarray] = []  # band records not yet written (at most SPILL_DOCS documents)
        held = 0
        order_keys: list[np.ndarray] = []  # 8 bytes per document: the task's repeats are refused at the end
        part = 0
        batch: list[Document] = []

        def flush():
            nonlocal held
            long = [len(d.text) >= CHUNK_CHARS for d in batch]
            x, counts = shingle_hashes(
                [words(d.text, d.metadata.get("language")) for d, lg in zip(batch, long) if not lg], p.config.ngram
            )
            if any(long):  # a long page's signature from its shingles a piece at a time (min of mins)
                short_sig = hasher.signatures_flat(x, counts[counts > 0])
                del x
                all_counts, sigs, k = [], [], 0
                short_counts = iter(counts.tolist())
                for d, lg in zip(batch, long):
                    if lg:
                        row, c = _long_signature(hasher, d.text, p.config.ngram, d.metadata.get("language"))
                    else:
                        c = next(short_counts)
                        row = short_sig[k] if c else None
                        k += 1 if c else 0
                    all_counts.append(c)
                    if c:
                        sigs.append(row)
                counts = np.array(all_counts, dtype=np.int64)
                sig = np.stack(sigs) if sigs else np.empty((0, p.config.num_perm), np.uint64)
            else:
                sig = hasher.signatures_flat(x, counts[counts > 0])
            keep = counts > 0  # no words: never a near duplicate
            rec = np.empty((int(keep.sum()), bands), dtype=BAND_REC)
            rec["key"] = band_keys(sig, bands, rows)
            docs = [d for d, k in zip(batch, keep) if k]
            rec["src"] = np.array([sources(d.metadata.get("source")) for d in docs], dtype=np.uint32)[:, None]
            offs = [d.metadata.get("offset") for d in docs]
            if any(o is None for o in offs):
                raise ValueError(f"{p.step} needs each document's `offset` (and `source`) for its order key")
            rec["offset"] = np.array(offs, dtype=np.int64)[:, None]
            out.append(rec)
            held += len(rec)
            order_keys.append(order_key(rec["src"][:, 0], rec["offset"][:, 0]))
            self.stat_update("no_shingles", value=int((~keep).sum()))
            batch.clear()

        def spill():
            """Writes the held records as one sorted part per band: a task's memory is bounded by
            SPILL_DOCS, not by its share of the corpus (a buckets task binary-searches each part)."""
            nonlocal held, part
            rec = np.concatenate(out) if out else np.empty((0, bands), dtype=BAND_REC)
            for b in range(bands):
                col = rec[:, b]
                save_npy_atomic(
                    self.stage_path("bands", f"band_{b:03d}", f"task_{rank:05d}.part{part:05d}.npy"),
                    col[np.argsort(col["key"], kind="stable")],
                )
            out.clear()
            held, part = 0, part + 1

        batch_chars = 0
        for doc in data:
            batch.append(doc)
            batch_chars += len(doc.text)
            self.stat_update("documents")
            self.stat_update("bytes", value=text_bytes(doc.text))
            if len(batch) == BATCH_DOCS or batch_chars >= BATCH_CHARS:
                batch_chars = 0
                with self.track_time():
                    flush()
                    if held >= self.spill_docs:
                        spill()
        with self.track_time():
            if batch:
                flush()
            if held or part == 0:  # a task with no documents still writes its (empty) part
                spill()
            keys = np.concatenate(order_keys) if order_keys else np.empty(0, np.uint64)
            check_unique(keys, list(sources.index), p.step)
            sources.save(self.stage_path(), rank)
            write_text_atomic(
                self.stage_path("lsh.json"),
                json.dumps({"bands": bands, "rows": rows, "num_perm": p.config.num_perm, "sorted_by_key": True}),
            )
        return
        yield


def _long_signature(hasher: MinHasher, text: str, ngram: int, language: str | None) -> tuple[np.ndarray, int]:
    """(MinHash signature, shingles) of a long text, a piece of its shingles at a time: the
    signature is the minimum over shingles, so that of the parts' minima."""
    sig, count = np.full(hasher.num_perm, EMPTY, dtype=np.uint64), 0
    for x in shingle_chunks(text, ngram, language):
        np.minimum(sig, hasher.signatures_flat(x, np.array([len(x)]))[0], out=sig)
        count += len(x)
    return sig, count


def _lower_bound(keys, x: int) -> int:
    """First index of the sorted (memory-mapped) `keys` with a key >= x: reads ~log2(n) keys."""
    if x >= 1 << 64:
        return len(keys)
    return bisect.bisect_left(keys, np.uint64(x))


def _band_files(folder: Path) -> list[tuple[int, Path]]:
    """(signature task, file) of every sorted part of a band (`task_RRRRR[.partPPPPP].npy`) in
    its `folder` (local)."""
    files = sorted(folder.glob("task_*.npy"))
    return [(int(f.name.split(".")[0].split("_")[1]), f) for f in files]


def _load_pair(band: Path, lo: int, hi: int, task_ranks) -> tuple[np.ndarray, np.ndarray]:
    """(keys, order keys) of the band's records with lo <= key < hi, from every signature task.

    Each task's file is sorted by key, so its slice of the range is found by binary search on
    the memory-mapped file and only that slice is read. The two output arrays are allocated
    once (16 bytes per record); one task's slice (20 bytes per record) is the only other buffer.
    """
    slices = []
    for t, f in _band_files(band):
        m = np.load(f, mmap_mode="r")
        if len(m):
            k = m["key"]
            a, b = _lower_bound(k, lo), _lower_bound(k, hi)
            if b > a:
                slices.append((t, m, a, b))
    n = sum(b - a for _, _, a, b in slices)
    keys, ords = np.empty(n, np.uint64), np.empty(n, np.uint64)
    i = 0
    for t, m, a, b in slices:
        r = np.array(m[a:b])
        keys[i : i + len(r)] = r["key"]
        ords[i : i + len(r)] = order_key(task_ranks[t][r["src"]], r["offset"])
        i += len(r)
    return keys, ords


def _check_shared_sources(band0: Path, task_ranks, part: int, parts: int, names: list[str], step: str) -> None:
    """Refuse two documents of different signature tasks that share (source, offset).

    Each signature task refused its own repeats; documents of two tasks can share an order key
    only if their source is in both tasks' tables (normally never: a source is one input file,
    read by one task). The documents of such sources are checked here, partitioned by a hash of
    the order key (equal keys meet in one part) so a task holds 8 bytes x shared documents / parts.
    Band 0 (`band0`: its folder, local) holds every document that has shingles.
    """
    seen: dict[int, int] = {}
    for ranks in task_ranks.values():
        for r in set(ranks.tolist()):
            seen[r] = seen.get(r, 0) + 1
    shared = np.array(sorted(r for r, c in seen.items() if c > 1), dtype=np.uint64)
    if not len(shared):
        return
    found = []
    for t, f in _band_files(band0):
        local = np.isin(task_ranks[t], shared)
        if not local.any():
            continue
        m = np.load(f, mmap_mode="r")
        for i in range(0, len(m), _SCAN_RECORDS):
            r = np.array(m[i : i + _SCAN_RECORDS])
            r = r[local[r["src"]]]
            o = order_key(task_ranks[t][r["src"]], r["offset"])
            found.append(o[shard_of(o, parts) == part])
    if found:
        check_unique(np.concatenate(found), names, step)


class NearDedupBuckets(DedupPhase[NearDedupPlan]):
    """Stage 2, one (band, key range) pair per task: see the module docstring's memory model."""

    step_name = "near_dedup_buckets"
    memory_setting = "near_dedup.key_ranges"

    def memory_bytes(self, work: Workload) -> int:
        """36 bytes per record of its (band, key range): the module docstring's model."""
        return int(BUCKET_BYTES_PER_RECORD * work.documents / self.params.ranges)

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p = self.params
        sig, rf = p.signature_folder, self.run_folder
        with self.track_time():
            meta = rf.staged(sig, "lsh.json")
            if not json.loads(meta.read_text()).get("sorted_by_key"):
                raise ValueError(
                    f"{meta}: band files not sorted by key (an older near_dedup_signature wrote them); "
                    f"run {p.step} again with --force"
                )
            task_ranks, rank_of = load_ranks(sig, rf)
            bounds = key_range_bounds(p.ranges)
            # a stage planned with one task per pair runs one pair here; fewer tasks run several,
            # one after the other, holding one pair at a time (`bucket_tasks`)
            for pair in range(rank, p.bands * p.ranges, world_size):
                b, g = divmod(pair, p.ranges)
                band = rf.staged(sig, "bands", f"band_{b:03d}")
                if b == 0:
                    _check_shared_sources(band, task_ranks, g, p.ranges, sorted(rank_of, key=rank_of.get), p.step)
                keys, ords = _load_pair(band, bounds[g], bounds[g + 1], task_ranks)
                self.stat_update("records", value=len(keys))
                sort_records(keys, ords)
                e = sorted_band_edges(keys, ords)
                del keys, ords
                self.stat_update("candidate_edges", value=len(e))
                shard = shard_of(e[:, 0], p.shards)
                for s in range(p.shards):
                    save_npy_atomic(
                        self.stage_path("edges", f"shard_{s:03d}", f"band_{b:03d}.range_{g:05d}.npy"),
                        e[shard == s],
                    )
        return
        yield


def _shard_edges(folder: Path, shard: int, run_folder: RunFolder = AS_GIVEN) -> np.ndarray:
    parts = [np.load(f) for f in sorted(run_folder.staged(folder, f"shard_{shard:03d}").glob("*.npy"))]
    e = np.concatenate(parts) if parts else np.empty((0, 2), np.uint64)
    return np.unique(e, axis=0) if len(e) else e  # the same pair from several bands once


class NearDedupShingles(DedupPhase[NearDedupPlan]):
    step_name = "near_dedup_shingles"

    def __init__(self, params: NearDedupPlan, *, step_id: str | None = None):
        super().__init__(params, step_id=step_id)
        self.spill_shingles = SPILL_SHINGLES

    #: a candidate's shingle set: a long page's pieces' sets, merged (8 bytes a shingle, a few
    #: copies while sorted; measured: 32, 76 and 223 MB over 2, 8 and 30 MB pages)
    document_factor = 8.0
    document_fixed = 24 << 20

    def memory_bytes(self, work: Workload) -> int:
        """(candidate, shard) pairs of its documents (16 bytes), one edge shard while reading
        them, held shingles up to `spill_shingles` (8 bytes, twice while written)."""
        candidates = CANDIDATE_SHARE * work.documents_per_task
        return int(
            16 * candidates
            + 32 * CANDIDATE_SHARE * work.documents / max(self.params.shards, 1)
            + 16 * self.spill_shingles
        )

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p = self.params
        with self.track_time():
            ords = DocKeys(p.signature_folder, NearDedupSignature.step_name, self.run_folder)
            # (candidate, shard that needs its shingles) sorted by candidate, for this task's own
            # documents only (it reads the signature task's files again, so the same sources):
            # 16 bytes per pair of its share, where a Python set per shard of every candidate of
            # the run took ~60 bytes per candidate of the run
            task_ranks, _ = load_ranks(p.signature_folder, self.run_folder)
            mine = task_ranks.get(rank, np.empty(0, np.uint64)).astype(np.int64)

            def own(nodes: np.ndarray) -> np.ndarray:
                return nodes[np.isin((nodes >> np.uint64(OFFSET_BITS)).astype(np.int64), mine)]

            need = [own(np.unique(_shard_edges(p.candidate_edges, s, self.run_folder))) for s in range(p.shards)]
            nodes = np.concatenate(need) if need else np.empty(0, np.uint64)
            where = (
                np.concatenate([np.full(len(n), s, np.int32) for s, n in enumerate(need)])
                if need
                else np.empty(0, np.int32)
            )
            order = np.argsort(nodes, kind="stable")
            nodes, where = nodes[order], where[order]
            del need, order
            out = [([], []) for _ in range(p.shards)]
            held, part = 0, 0

        def spill():
            """One part per shard: a task holds at most ~SPILL_SHINGLES shingles (8 bytes each)."""
            nonlocal held, part
            for s, (keys, sets) in enumerate(out):
                lengths = np.array([len(x) for x in sets], dtype=np.int64)
                vals = np.concatenate(sets) if sets else np.empty(0, np.uint64)
                base = self.stage_path("shingles", f"shard_{s:03d}", f"task_{rank:05d}.part{part:05d}")
                save_npy_atomic(Path(f"{base}.keys.npy"), np.array(keys, dtype=np.uint64))
                save_npy_atomic(Path(f"{base}.lengths.npy"), lengths)
                save_npy_atomic(Path(f"{base}.values.npy"), vals)
                keys.clear(), sets.clear()
            held, part = 0, part + 1

        for doc in data:
            self.stat_update("documents")
            with self.track_time():
                o = np.uint64(ords(doc))
                lo, hi = int(np.searchsorted(nodes, o, side="left")), int(np.searchsorted(nodes, o, side="right"))
                if hi > lo:
                    sh = shingles(doc.text, p.config.ngram, doc.metadata.get("language"))
                    self.stat_update("candidates")
                    for s in where[lo:hi].tolist():
                        out[s][0].append(int(o))
                        out[s][1].append(sh)
                        held += len(sh)
                    if held >= self.spill_shingles:
                        spill()
        with self.track_time():
            if held or part == 0:
                spill()
        return
        yield


class NearDedupVerify(DedupPhase[NearDedupPlan]):
    step_name = "near_dedup_verify"

    def memory_bytes(self, work: Workload) -> int:
        """The shingle sets of its shard's candidates (8 bytes per shingle) and its edges; the
        largest document's set among them (a shingle per `TEXT_BYTES_PER_SHINGLE` of text)."""
        candidates = CANDIDATE_SHARE * work.documents / max(work.tasks, 1)
        shingles = work.text_bytes / max(work.documents, 1) / TEXT_BYTES_PER_SHINGLE
        return int(candidates * (8 * shingles + 48) + 8 * work.max_document_bytes / TEXT_BYTES_PER_SHINGLE)

    #: comparing a pair: np.intersect1d of two sets concatenates and sorts them
    document_factor = 6.0

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p = self.params
        with self.track_time():
            e = _shard_edges(p.candidate_edges, rank, self.run_folder)
            sets: dict[int, np.ndarray] = {}
            d = self.run_folder.staged(p.shingles_folder, "shingles", f"shard_{rank:03d}")
            for kf in sorted(d.glob("task_*.keys.npy")):
                base = str(kf)[: -len(".keys.npy")]
                keys, lengths, vals = np.load(kf), np.load(base + ".lengths.npy"), np.load(base + ".values.npy")
                for k, part in zip(keys.tolist(), np.split(vals, np.cumsum(lengths)[:-1]) if len(keys) else []):
                    sets[k] = part
            keep = np.array([jaccard(sets[u], sets[v]) >= p.config.threshold for u, v in e.tolist()], dtype=bool)
            keep = keep.reshape(-1) if len(e) else np.zeros(0, bool)
            save_npy_atomic(self.stage_path("verified", f"shard_{rank:03d}", "edges.npy"), e[keep])
        self.stat_update("candidate_pairs", value=len(e))
        self.stat_update("verified_pairs", value=int(keep.sum()))
        return
        yield


def _cluster_edge_files(run_folder: RunFolder, p: NearDedupPlan, shard: int) -> list[Path]:
    """The edge files of one shard the cluster stages read; refuses a shard with fewer files than
    the stage before writes for it (every shard gets its files, empty or not)."""
    d = run_folder.staged(p.cluster_edges, f"shard_{shard:03d}")
    files = sorted(d.glob("*.npy"))
    expected, writer = (1, "near_dedup_verify") if p.config.verify else (p.bands * p.ranges, "near_dedup_buckets")
    if len(files) < expected:
        raise ValueError(
            f"{d}: {len(files)} edge files of the {expected} {writer} writes (missing: that stage did not "
            f"finish, or its files were removed); run {p.step} again with --force"
        )
    return files


class NearDedupClusterEdges(DedupPhase[NearDedupPlan]):
    """Every verified edge as two entries, one for each end's partition (`cluster.py`, stage 1)."""

    step_name = "near_dedup_cluster_edges"
    memory_setting = "near_dedup.cluster_tasks"

    def __init__(self, params: NearDedupPlan, *, step_id: str | None = None):
        super().__init__(params, step_id=step_id)
        self.cluster_chunk, self.cluster_spill = CLUSTER_CHUNK, CLUSTER_SPILL

    def memory_bytes(self, work: Workload) -> int:
        """A chunk of edges and its entries, and an outbox's spill while sorted: fixed."""
        return int(64 * CLUSTER_CHUNK + 3 * EDGE.itemsize * CLUSTER_SPILL)

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p = self.params
        with self.track_time():
            out = Outbox(self.stage_path("edges"), rank, p.cluster_tasks, EDGE, "src", self.cluster_spill)
            edges = 0
            for s in range(rank, p.shards, world_size):
                for f in _cluster_edge_files(self.run_folder, p, s):
                    for e in read_edge_file(f, self.cluster_chunk):
                        e = np.unique(np.sort(e, axis=1), axis=0)  # (earlier, later), once per chunk
                        e = e[e[:, 0] != e[:, 1]]
                        edges += len(e)
                        both = np.empty(2 * len(e), EDGE)
                        both["src"][: len(e)], both["dst"][: len(e)] = e[:, 0], e[:, 1]
                        both["src"][len(e) :], both["dst"][len(e) :] = e[:, 1], e[:, 0]
                        out.add(both)
            out.close()
        self.stat_update("edges", value=edges)
        return
        yield


class _ClusterPhase(DedupPhase[NearDedupPlan]):
    memory_setting = "near_dedup.cluster_tasks"

    def __init__(self, params: NearDedupPlan, *, step_id: str | None = None):
        super().__init__(params, step_id=step_id)
        # records read at a time, held before a spill (instance attributes: tests shrink them)
        self.cluster_chunk, self.cluster_spill = CLUSTER_CHUNK, CLUSTER_SPILL

    def memory_bytes(self, work: Workload) -> int:
        """`ROUND_BYTES_PER_NODE` per node of its partition (documents in clusters / cluster
        tasks) and the fixed chunk and spill buffers (`cluster.py`)."""
        nodes = CANDIDATE_SHARE * work.documents / max(self.params.cluster_tasks, 1)
        return int(ROUND_BYTES_PER_NODE * nodes + ROUND_FIXED_BYTES)

    def rounds(self) -> Rounds:
        p = self.params
        components = p.config.removal == "components"
        rounds = Rounds(
            p.cluster_edges_folder, p.round_folders, p.rest_folder, p.cluster_tasks, components, self.run_folder
        )
        rounds.chunk, rounds.spill = self.cluster_chunk, self.cluster_spill
        return rounds


class NearDedupClusterRound(_ClusterPhase):
    """One round of messages between the partitions (`cluster.py`, stage 2)."""

    step_name = "near_dedup_cluster_round"

    def __init__(self, params: NearDedupPlan, round: int, *, step_id: str | None = None):
        super().__init__(params, step_id=step_id)
        self.round = round

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.track_time():
            rounds = self.rounds()
            for q in range(rank, self.params.cluster_tasks, world_size):
                s = rounds.run(self.round, q)
                self.stat_update("messages", value=s["sent"])
                self.stat_update("changed", value=s["changed"])
        return
        yield


class NearDedupClusterRest(_ClusterPhase):
    """The rounds a graph needs beyond `cluster_rounds`, one partition at a time (`cluster.py`,
    stage 3); nothing when the planned rounds sufficed."""

    step_name = "near_dedup_cluster_rest"

    def memory_bytes(self, work: Workload) -> int:
        """One partition at a time: what a round task holds."""
        return super().memory_bytes(work)

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.track_time():
            rounds = self.rounds()
            r = len(rounds.rounds)
            cap = self.params.config.cluster_max_rounds
            while not rounds.converged(r):
                if r >= cap:
                    sent = sum(s["sent"] for s in rounds.summaries(r))
                    raise RuntimeError(
                        f"{self.params.step}: the duplicate graph did not converge in "
                        f"{self.params.step}.cluster_max_rounds = {cap} rounds (round {r} still sent {sent:,} "
                        f"messages); raise {self.params.step}.cluster_max_rounds and run again "
                        "(the rounds done are kept)"
                    )
                r += 1
                for q in range(self.params.cluster_tasks):
                    if not self.run_folder.staged(
                        rounds.summary_path(r, q)
                    ).is_file():  # a killed rest resumes at its partition
                        rounds.run(r, q)
                self.stat_update("rounds")
            self.stat_update("final_round", value=r)
        return
        yield


class NearDedupCluster(_ClusterPhase):
    """Each partition's clusters, sizes and removals (`cluster.py`, stage 4)."""

    step_name = "near_dedup_cluster"

    def memory_bytes(self, work: Workload) -> int:
        """Its partition's state and (node, root) pairs and removals (~70 bytes per node)."""
        nodes = CANDIDATE_SHARE * work.documents / max(self.params.cluster_tasks, 1)
        return int(ROUND_BYTES_PER_NODE * nodes)

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p = self.params
        with self.track_time():
            rounds = self.rounds()
            task_ranks, _ = load_ranks(p.signature_folder, self.run_folder)
            for q in range(rank, p.cluster_tasks, world_size):
                for k, v in rounds.finish(q, task_ranks, self.stage_path()).items():
                    self.stat_update(k, value=v)
            if rank == 0:
                self.stat_update("rounds", value=rounds.final_round())
        return
        yield


class NearDedupFilter(DedupFilterPhase[NearDedupPlan]):
    step_name = "near_dedup_filter"

    def memory_bytes(self, work: Workload) -> int:
        """The order keys its documents lost to dedup: 8 bytes each; what every filter holds."""
        return int(8 * CANDIDATE_SHARE * work.documents_per_task) + super().memory_bytes(work)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p, rf = self.params, self.run_folder
        self._ords = DocKeys(p.signature_folder, NearDedupSignature.step_name, rf)
        # sorted order keys, 8 bytes each (a Python set took ~60), found by binary search: this
        # task's slice of every cluster partition's removals
        self._removed = removed_slices(rf.staged(p.cluster_folder, "removed"), rank)
        yield from super().run(data, rank, world_size)

    def filter(self, doc: Document, config: Strict):
        if len(self._removed):
            o = np.uint64(self._ords(doc))
            i = int(np.searchsorted(self._removed, o))
            if i < len(self._removed) and self._removed[i] == o:
                return False, "near_duplicate"
        return True


class NearDedup(GlobalStep):
    """MinHash-LSH near-duplicate removal: a document goes when its word n-gram Jaccard similarity
    with an earlier kept document (in (source, offset) order) reaches `threshold`
    (`removal: components`: only the first of each connected cluster is kept).

    Its stages are described in the module docstring.
    """

    yaml_name = "near_dedup"
    drop_reasons = ("near_duplicate",)

    class Config(Strict):
        threshold: float = Field(0.8, gt=0, lt=1, description="target Jaccard similarity of near duplicates")
        ngram: int = Field(5, ge=1, description="words per shingle")
        num_perm: int = Field(128, ge=2, description="MinHash permutations")
        bands: int | None = Field(None, ge=1, description="LSH bands (default: from threshold, datasketch's optimum)")
        rows: int | None = Field(None, ge=1, description="rows per band (with `bands`)")
        fp_weight: float = Field(0.1, ge=0, le=1, description="weight of false positives when choosing bands")
        fn_weight: float = Field(0.9, ge=0, le=1, description="weight of false negatives when choosing bands")
        verify: bool = Field(True, description="check candidate pairs' exact Jaccard (drops LSH false positives)")
        removal: Literal["kept_neighbour", "components"] = Field(
            "kept_neighbour",
            description="kept_neighbour: a document goes only for a near duplicate "
            "(a verified pair) that is kept, earlier in order; components: every document of a connected "
            "component but its first (datatrove's, NeMo Curator's: chains A~B~C remove C for A, however far)",
        )
        seed: int = Field(1, description="seed of the MinHash permutations")
        key_ranges: int | None = Field(
            None,
            ge=1,
            description="key ranges per band: `near_dedup_buckets` runs bands x key_ranges tasks, "
            "each holding ~33 bytes x documents / key_ranges (default: ceil(tasks / bands))",
        )

        cluster_tasks: int | None = Field(
            None,
            ge=1,
            description="tasks of the cluster stages, one partition of the duplicate graph each, holding "
            f"~{ROUND_BYTES_PER_NODE} bytes x documents in clusters / cluster_tasks (default: executor.tasks, "
            "more when a partition would not fit a task's memory)",
        )
        cluster_rounds: int | None = Field(
            None,
            ge=1,
            description="rounds of the cluster stages planned as stages (a round after the graph is done "
            "ends at once; a graph that needs more continues in near_dedup_cluster_rest, one partition at a time; "
            "default: what generated graphs of the documents expected in clusters took, measured, plus 2, "
            "at least 8: `planned_rounds`)",
        )

        cluster_max_rounds: int = Field(
            128,
            ge=1,
            description="rounds after which near_dedup_cluster_rest gives up with an error naming this setting "
            "(components takes ~2 log2 of a component's diameter, kept_neighbour its longest chain of decisions)",
        )

        @model_validator(mode="after")
        def _rounds(self):
            if self.cluster_rounds is not None and self.cluster_max_rounds < self.cluster_rounds:
                raise ValueError(
                    f"cluster_max_rounds ({self.cluster_max_rounds}) is below cluster_rounds ({self.cluster_rounds})"
                )
            return self

        @model_validator(mode="after")
        def _bands_rows(self):
            if (self.bands is None) != (self.rows is None):
                raise ValueError("give both `bands` and `rows`, or neither")
            if self.bands is not None and self.bands * self.rows > self.num_perm:
                raise ValueError(f"bands*rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
            return self

        def band_rows(self) -> tuple[int, int]:
            if self.bands is not None:
                return self.bands, self.rows
            return optimal_bands(self.threshold, self.num_perm, self.fp_weight, self.fn_weight)

    def stages(self, ctx: StageContext) -> None:
        bands, rows = self.config.band_rows()
        ranges, buckets_tasks = bucket_tasks(
            self.config,
            ctx.tasks,
            ctx.workload(1).documents,
            lambda n: ctx.task_memory_bytes("near_dedup_buckets", n) - BASE_TASK_BYTES,
        )
        # one plan for every phase; each stage's folder is set once the stage is added
        plan = NearDedupPlan(self.config, bands, rows, ranges, shards=ctx.tasks, step=self.yaml_name)
        docs, name = ctx.documents, self.name
        sig = ctx.stage("near_dedup_signature", [ParquetReader(docs), NearDedupSignature(plan, step_id=name)])
        plan.signature_folder = Path(sig.label)
        buckets = ctx.stage("near_dedup_buckets", [NearDedupBuckets(plan, step_id=name)], tasks=buckets_tasks)
        plan.buckets_folder = Path(buckets.label)
        if plan.config.verify:
            sh = ctx.stage("near_dedup_shingles", [ParquetReader(docs), NearDedupShingles(plan, step_id=name)])
            plan.shingles_folder = Path(sh.label)
            plan.verify_folder = Path(ctx.stage("near_dedup_verify", [NearDedupVerify(plan, step_id=name)]).label)
        c = cluster_tasks(
            self.config,
            ctx.tasks,
            ctx.workload(1).documents,
            lambda n: ctx.task_memory_bytes("near_dedup_cluster_round", n) - BASE_TASK_BYTES,
        )
        rounds = self.config.cluster_rounds or min(
            planned_rounds(self.config.removal, CANDIDATE_SHARE * ctx.workload(1).documents),
            self.config.cluster_max_rounds,
        )
        plan.cluster_tasks, plan.cluster_rounds = c, rounds
        edges = ctx.stage("near_dedup_cluster_edges", [NearDedupClusterEdges(plan, step_id=name)], tasks=c)
        plan.cluster_edges_folder = Path(edges.label)
        for r in range(1, plan.cluster_rounds + 1):
            rnd = ctx.stage("near_dedup_cluster_round", [NearDedupClusterRound(plan, r, step_id=name)], tasks=c)
            plan.round_folders.append(Path(rnd.label))
        rest = ctx.stage("near_dedup_cluster_rest", [NearDedupClusterRest(plan, step_id=name)], tasks=1)
        plan.rest_folder = Path(rest.label)
        plan.cluster_folder = Path(
            ctx.stage("near_dedup_cluster", [NearDedupCluster(plan, step_id=name)], tasks=c).label
        )
        ctx.stage("near_dedup_filter", [ParquetReader(docs), NearDedupFilter(plan, step_id=name), ctx.writer()])


#: rounds the cluster stages took on generated graphs (`benchmarks/cluster_throughput.py`: Zipf-sized
#: clusters of random trees; docs/dedup.md): (log10 of the documents in clusters, rounds)
ROUNDS_MEASURED = {
    "components": ((3.48, 12), (6.0, 17), (7.0, 18)),
    "kept_neighbour": ((3.48, 6), (6.0, 9), (7.0, 11)),
}
#: the fewest round stages planned (a graph of a few hundred documents takes 3 to 5)
MIN_PLANNED_ROUNDS = 8


def planned_rounds(removal: str, nodes: float) -> int:
    """Round stages to plan for a graph of `nodes` documents: the measured rounds at that size
    (interpolated in log10 of the nodes; past the largest graph measured, extended by the slope
    over all of them: rounds grow ~ log of a component's diameter), plus 2, at least
    `MIN_PLANNED_ROUNDS` (and that below the smallest graph measured). A graph that takes more
    continues in `near_dedup_cluster_rest`, up to `cluster_max_rounds`."""
    pts = ROUNDS_MEASURED[removal]
    x = math.log10(max(nodes, 1.0))
    if x <= pts[0][0]:  # a few thousand documents: any rounds past the planned ones take seconds
        return MIN_PLANNED_ROUNDS
    if x >= pts[-1][0]:
        slope = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
        r = pts[-1][1] + slope * (x - pts[-1][0])
    else:
        (x0, y0), (x1, y1) = next((a, b) for a, b in zip(pts, pts[1:]) if a[0] <= x <= b[0])
        r = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return max(MIN_PLANNED_ROUNDS, math.ceil(r) + 2)


def bucket_tasks(
    config: NearDedup.Config, tasks: int, documents: float, memory_budget: Callable[[int], int]
) -> tuple[int, int]:
    """(key ranges per band, tasks) of `near_dedup_buckets`, for `tasks` tasks per stage and
    `documents` documents; `memory_budget(n)`: the bytes a task of a stage of n tasks may hold
    for its pair (beyond `BASE_TASK_BYTES`).

    - `key_ranges` set: that many ranges, one (band, range) pair per task; a pair that does not
      fit is refused by the planner's memory check, naming `near_dedup.key_ranges`;
    - else the fewest ranges that give each of `tasks` tasks a pair, ceil(tasks / bands), raised
      when a pair would not fit in the budget (`BUCKET_BYTES_PER_RECORD` per record), one pair
      per task;
    - with fewer tasks than bands and no split forced by memory: `tasks` tasks of whole bands
      (ceil(bands / tasks) each, one after the other), as many processes as the other stages:
      a small local run does not start a process per band.
    """
    bands, _ = config.band_rows()
    if config.key_ranges is not None:
        return config.key_ranges, bands * config.key_ranges
    ranges = -(-tasks // bands)
    need = -(-int(BUCKET_BYTES_PER_RECORD * documents) // max(memory_budget(bands * ranges), 1 << 20))
    if need > ranges:
        return need, bands * need
    return ranges, bands * ranges if tasks >= bands else tasks


def cluster_tasks(config: NearDedup.Config, tasks: int, documents: float, memory_budget: Callable[[int], int]) -> int:
    """Tasks (graph partitions) of the cluster stages: `cluster_tasks` if set (a partition that
    does not fit is refused by the planner's memory check, naming it), else `tasks`, raised until
    a partition of the documents expected in clusters (`CANDIDATE_SHARE`) fits `memory_budget(n)`."""
    if config.cluster_tasks is not None:
        return config.cluster_tasks
    held = ROUND_BYTES_PER_NODE * CANDIDATE_SHARE * documents
    need = -(-int(held) // max(memory_budget(tasks) - ROUND_FIXED_BYTES, 1 << 20))
    return max(tasks, need)
