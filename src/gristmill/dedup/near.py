"""`near_dedup`: MinHash-LSH near-duplicate removal across tasks, clustering out of core.

Stages (laid out by `NearDedup.stages`; T = executor.tasks):

1. `near_dedup_signature` (T): shingles (normalised word n-grams, `text.shingle_hashes`: each
   word hashed once, n-grams combined in numpy), MinHash signatures (`minhash.MinHasher`,
   vectorised per batch), one key per LSH band; writes per band
   `bands/band_BBB/task_RRRRR.npy` = (key, source index, offset) and the task's sources table.
2. `near_dedup_buckets` (min(T, b)): per band, sort by (key, order key); runs of equal keys give
   star edges (first document, other) (`lsh.band_edges`), written to `edges/shard_SSS/` by anchor.
3. `near_dedup_shingles` (T, if `verify`): re-reads the documents; for the candidates only (the
   documents of some edge) recomputes the shingle set and writes it to the shards that need it.
4. `near_dedup_verify` (T, if `verify`): per shard, the exact Jaccard of every candidate pair;
   keeps the edges with Jaccard >= threshold (drops LSH false positives).
5. `near_dedup_cluster` (1 task): connected components over the edge shards, read one shard at a
   time (`lsh.components`: memory ~16 B per document in a cluster + one shard of edges); every
   document but its component's first (order key) is removed; removals are written per task.
6. `near_dedup_filter` (T): drops the removed documents (reason `near_duplicate`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from pydantic import Field, model_validator

from gristmill.core.configlib import Strict
from gristmill.core.filter import Filter
from gristmill.core.parquet_io import ParquetReader
from gristmill.core.step import GlobalStep, StageContext, Step
from gristmill.dedup.lsh import band_edges, band_keys, components, optimal_bands, shard_of
from gristmill.dedup.minhash import MinHasher
from gristmill.dedup.order import DocKeys, SourceTable, check_unique, load_ranks, order_key, save_npy, write_json_atomic
from gristmill.dedup.text import jaccard, shingle_hashes, shingles, words

BAND_REC = np.dtype([("key", "<u8"), ("src", "<u4"), ("offset", "<i8")])
BATCH_DOCS = 256




class NearDedupSignature(Step):
    type = "🫂 DEDUP"
    step_name = "near_dedup_signature"

    def __init__(self, p: NearDedup.Config, *, step_id: str | None = None):
        super().__init__(step_id=step_id)
        self.p = p

    @property
    def folder(self) -> Path:
        return self.stage_folder

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        bands, rows = self.p.band_rows()
        hasher = MinHasher(self.p.num_perm, self.p.seed)
        sources = SourceTable()
        out: list[np.ndarray] = []
        batch: list[Document] = []

        def flush():
            x, counts = shingle_hashes([words(d.text) for d in batch], self.p.ngram)
            keep = counts > 0  # no words: never a near duplicate
            sig = hasher.signatures_flat(x, counts[keep])
            rec = np.empty((int(keep.sum()), bands), dtype=BAND_REC)
            rec["key"] = band_keys(sig, bands, rows)
            docs = [d for d, k in zip(batch, keep) if k]
            rec["src"] = np.array([sources(d.metadata.get("source")) for d in docs], dtype=np.uint32)[:, None]
            offs = [d.metadata.get("offset") for d in docs]
            if any(o is None for o in offs):
                raise ValueError("near_dedup needs each document's `offset` (and `source`) for its order key")
            rec["offset"] = np.array(offs, dtype=np.int64)[:, None]
            out.append(rec)
            self.stat_update("no_shingles", value=int((~keep).sum()))
            batch.clear()

        for doc in data:
            batch.append(doc)
            self.stat_update("documents")
            self.stat_update("bytes", value=len(doc.text.encode("utf-8")))
            if len(batch) == BATCH_DOCS:
                with self.track_time():
                    flush()
        with self.track_time():
            if batch:
                flush()
            rec = np.concatenate(out) if out else np.empty((0, bands), dtype=BAND_REC)
            check_unique(order_key(rec["src"][:, 0], rec["offset"][:, 0]), list(sources.index), self.yaml_name)
            for b in range(bands):
                save_npy(self.folder / "bands" / f"band_{b:03d}" / f"task_{rank:05d}.npy", np.ascontiguousarray(rec[:, b]))
            sources.save(self.folder, rank)
            write_json_atomic(self.folder / "lsh.json", {"bands": bands, "rows": rows, "num_perm": self.p.num_perm})
        return
        yield


def _load_band(sig_folder: Path, band: int, task_ranks) -> tuple[np.ndarray, np.ndarray]:
    keys, ords = [], []
    for f in sorted((sig_folder / "bands" / f"band_{band:03d}").glob("task_*.npy")):
        r = np.load(f)
        keys.append(r["key"])
        ords.append(order_key(task_ranks[int(f.stem.split("_")[1])][r["src"]], r["offset"]))
    if not keys:
        return np.empty(0, np.uint64), np.empty(0, np.uint64)
    return np.concatenate(keys), np.concatenate(ords)


class NearDedupBuckets(Step):
    type = "🫂 DEDUP"
    step_name = "near_dedup_buckets"

    def __init__(self, sig_folder: Path, *, bands: int, shards: int, step_id: str | None = None):
        super().__init__(step_id=step_id)
        self.sig_folder, self.bands, self.shards = Path(sig_folder), bands, shards

    @property
    def folder(self) -> Path:
        return self.stage_folder

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.track_time():
            task_ranks, rank_of = load_ranks(self.sig_folder)
            for b in range(rank, self.bands, world_size):
                keys, ords = _load_band(self.sig_folder, b, task_ranks)
                if b == 0:  # every document is in every band: one band checks keys across tasks
                    check_unique(ords, sorted(rank_of, key=rank_of.get), self.yaml_name)
                e = band_edges(keys, ords)
                self.stat_update("candidate_edges", value=len(e))
                shard = shard_of(e[:, 0], self.shards)
                for s in range(self.shards):
                    save_npy(self.folder / "edges" / f"shard_{s:03d}" / f"band_{b:03d}.npy", e[shard == s])
        return
        yield


def _shard_edges(folder: Path, shard: int) -> np.ndarray:
    parts = [np.load(f) for f in sorted((folder / f"shard_{shard:03d}").glob("*.npy"))]
    e = np.concatenate(parts) if parts else np.empty((0, 2), np.uint64)
    return np.unique(e, axis=0) if len(e) else e  # the same pair from several bands once


class NearDedupShingles(Step):
    type = "🫂 DEDUP"
    step_name = "near_dedup_shingles"

    def __init__(self, sig_folder: Path, edge_folder: Path, *, ngram: int, shards: int, step_id: str | None = None):
        super().__init__(step_id=step_id)
        self.sig_folder, self.edge_folder = Path(sig_folder), Path(edge_folder)
        self.ngram, self.shards = ngram, shards

    @property
    def folder(self) -> Path:
        return self.stage_folder

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.track_time():
            ords = DocKeys(self.sig_folder, "near_dedup_signature")
            need = [set(np.unique(_shard_edges(self.edge_folder, s)).tolist()) for s in range(self.shards)]
            anywhere = set().union(*need)
            out = [([], []) for _ in range(self.shards)]
        for doc in data:
            self.stat_update("documents")
            with self.track_time():
                o = ords(doc)
                if o in anywhere:
                    where = [s for s in range(self.shards) if o in need[s]]
                    sh = shingles(doc.text, self.ngram)
                    self.stat_update("candidates")
                    for s in where:
                        out[s][0].append(o)
                        out[s][1].append(sh)
        with self.track_time():
            for s, (keys, sets) in enumerate(out):
                lengths = np.array([len(x) for x in sets], dtype=np.int64)
                vals = np.concatenate(sets) if sets else np.empty(0, np.uint64)
                save_npy(self.folder / "shingles" / f"shard_{s:03d}" / f"task_{rank:05d}.keys.npy", np.array(keys, dtype=np.uint64))
                save_npy(self.folder / "shingles" / f"shard_{s:03d}" / f"task_{rank:05d}.lengths.npy", lengths)
                save_npy(self.folder / "shingles" / f"shard_{s:03d}" / f"task_{rank:05d}.values.npy", vals)
        return
        yield


class NearDedupVerify(Step):
    type = "🫂 DEDUP"
    step_name = "near_dedup_verify"

    def __init__(self, edge_folder: Path, shingle_folder: Path, *, threshold: float, step_id: str | None = None):
        super().__init__(step_id=step_id)
        self.edge_folder, self.shingle_folder = Path(edge_folder), Path(shingle_folder)
        self.threshold = threshold

    @property
    def folder(self) -> Path:
        return self.stage_folder

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.track_time():
            e = _shard_edges(self.edge_folder, rank)
            sets: dict[int, np.ndarray] = {}
            d = self.shingle_folder / "shingles" / f"shard_{rank:03d}"
            for kf in sorted(d.glob("task_*.keys.npy")):
                base = str(kf)[: -len(".keys.npy")]
                keys, lengths, vals = np.load(kf), np.load(base + ".lengths.npy"), np.load(base + ".values.npy")
                for k, part in zip(keys.tolist(), np.split(vals, np.cumsum(lengths)[:-1]) if len(keys) else []):
                    sets[k] = part
            keep = np.array([jaccard(sets[u], sets[v]) >= self.threshold for u, v in e.tolist()], dtype=bool)
            keep = keep.reshape(-1) if len(e) else np.zeros(0, bool)
            save_npy(self.folder / "verified" / f"shard_{rank:03d}" / "edges.npy", e[keep])
        self.stat_update("candidate_pairs", value=len(e))
        self.stat_update("verified_pairs", value=int(keep.sum()))
        return
        yield


def write_cluster_sizes(folder: Path, roots: np.ndarray) -> None:
    """`cluster_sizes.json`: how many duplicate clusters have each size (documents per cluster),
    for `pipeline report`. One entry per distinct size, so it stays small at any scale."""
    sizes, counts = np.unique(np.unique(roots, return_counts=True)[1], return_counts=True) if len(roots) else ([], [])
    write_json_atomic(folder / "cluster_sizes.json", {"sizes": {str(int(k)): int(v) for k, v in zip(sizes, counts)}})


class NearDedupCluster(Step):
    type = "🫂 DEDUP"
    step_name = "near_dedup_cluster"

    def __init__(self, sig_folder: Path, edge_folder: Path, *, shards: int, step_id: str | None = None):
        super().__init__(step_id=step_id)
        self.sig_folder, self.edge_folder, self.shards = Path(sig_folder), Path(edge_folder), shards

    @property
    def folder(self) -> Path:
        return self.stage_folder

    def run(self, data=None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.track_time():
            loaders = [(lambda s=s: _shard_edges(self.edge_folder, s)) for s in range(self.shards)]
            nodes, roots = components(loaders)
            save_npy(self.folder / "clusters.npy", np.stack([nodes, roots], axis=1))
            write_cluster_sizes(self.folder, roots)
            removed = nodes[nodes != roots]
            task_ranks, _ = load_ranks(self.sig_folder)
            src = (removed >> np.uint64(40)).astype(np.int64)
            for t, local in task_ranks.items():  # a task gets the removals of the sources it read
                save_npy(self.folder / "removed" / f"task_{t:05d}.npy", removed[np.isin(src, local.astype(np.int64))])
        self.stat_update("documents_in_clusters", value=len(nodes))
        self.stat_update("clusters", value=int((nodes == roots).sum()))
        self.stat_update("removed", value=len(removed))
        return
        yield


class NearDedupFilter(Filter):
    step_name = "near_dedup_filter"

    def __init__(self, sig_folder: Path, cluster_folder: Path, *, step_id: str | None = None):
        super().__init__(step_id=step_id)
        self.sig_folder, self.cluster_folder = Path(sig_folder), Path(cluster_folder)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        self._ords = DocKeys(self.sig_folder, "near_dedup_signature")
        path = self.cluster_folder / "removed" / f"task_{rank:05d}.npy"
        self._removed = set(np.load(path).tolist()) if path.is_file() else set()
        yield from super().run(data, rank, world_size)

    def filter(self, doc: Document):
        if self._removed and self._ords(doc) in self._removed:
            return False, "near_duplicate"
        return True


class NearDedup(GlobalStep):
    """MinHash-LSH near-duplicate removal: documents whose word n-gram Jaccard similarity reaches
    `threshold` form clusters, of which only the first in (source, offset) order is kept.

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
        seed: int = Field(1, description="seed of the MinHash permutations")

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
        p, tasks, documents = self.config, ctx.tasks, ctx.documents
        bands, _ = p.band_rows()
        sig = ctx.stage("near_dedup_signature", [ParquetReader(documents), NearDedupSignature(p, step_id=self.name)])
        buckets = ctx.stage("near_dedup_buckets", [NearDedupBuckets(sig.folder, bands=bands, shards=tasks,
                                                                    step_id=self.name)], tasks=min(tasks, bands))
        edges = buckets.folder / "edges"
        if p.verify:
            sh = ctx.stage("near_dedup_shingles", [
                ParquetReader(documents),
                NearDedupShingles(sig.folder, edges, ngram=p.ngram, shards=tasks, step_id=self.name)])
            ver = ctx.stage("near_dedup_verify", [NearDedupVerify(edges, sh.folder, threshold=p.threshold,
                                                                  step_id=self.name)])
            edges = ver.folder / "verified"
        cl = ctx.stage("near_dedup_cluster", [NearDedupCluster(sig.folder, edges, shards=tasks, step_id=self.name)],
                       tasks=1)
        ctx.stage("near_dedup_filter", [ParquetReader(documents), NearDedupFilter(sig.folder, cl.folder,
                                                                                   step_id=self.name), ctx.writer()])
