"""`quality_buckets`: one quality score from several signals, cut into buckets (Nemotron-CC's ensemble).

A run may compute several quality signals per document: a neural classifier's probability
(`classifier`: `<name>_score`), the fastText classifier's (`quality`: `quality_score`), KenLM's
perplexity (`kenlm`: `perplexity`, lower is better). Their scales differ, so each is first made
its percentile rank over the run (the share of the run's documents with a worse value, ties
counted half: 0..1, higher better), and the ranks are combined by `combine`:

- `max_rank`: a document's best rank (Nemotron-CC takes the highest of its classifiers'
  buckets: a page that one signal rates highly stays high, whatever the others say);
- `weighted`: Σ weight · rank / Σ weight.

The combined score (`quality_ensemble`) is cut into `buckets` buckets at its own percentiles over
the run: `quality_bucket` 0..N-1, N-1 the best, each holding ~1/N of the documents (ties stay
together). Documents below bucket `drop_below` are dropped (`low_quality_bucket`). The tokenize
step can then repeat the high buckets and drop the low ones (`tokenize.bucket_weights`). A
document without a signal's value (a language KenLM has no model for) ranks 0 on it, counted
as `missing_<field>`.

Three stages; none holds more than the sample, whatever the size of the crawl:

    NN_quality_buckets_sample (N tasks) each task's `sample_docs` documents of smallest
        xxh3_64(id), with their signals' values (output/sample_RRRRR.npz)
    NN_quality_buckets_cuts   (1 task)  the run's sample: the same selection over the union (a
        document of the run's sample is in its task's), read file by file; per signal its
        values sorted, and the combined score of every sampled document sorted
        (output/cuts.npz; output/cuts.json: the bucket boundaries, for people)
    NN_quality_buckets        (N tasks) each document's ranks (binary searches in the sorted
        sample), combined score and bucket, and the drop

With at most `sample_docs` documents in the run the percentiles are exact; with more they are
those of a uniform sample of `sample_docs` documents (a rank's standard error at most
0.5/sqrt(sample_docs): 0.0005 at the default million).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import xxhash
from datatrove.data import Document, DocumentsPipeline
from pydantic import Field, model_validator

from gristmill.core.configlib import ConfigError, Strict
from gristmill.core.files import write_text_atomic
from gristmill.core.filter import Filter, FilterResult
from gristmill.core.parquet_io import ParquetReader
from gristmill.core.scores import LINEAR_01
from gristmill.core.step import GlobalStep, StageContext, Step, Workload, config_key

SAMPLE_SALT = b"gristmill-quality-buckets:"
SCORE, BUCKET = "quality_ensemble", "quality_bucket"


def sample_key(doc_id: str) -> int:
    return xxhash.xxh3_64_intdigest(SAMPLE_SALT + doc_id.encode("utf-8"))


class Signal(Strict):
    field: str = Field(description="a metadata column an earlier step writes: `quality_score`, `perplexity`, ...")
    better: Literal["higher", "lower"] = Field("higher", description="which way is better (`lower` for perplexity)")
    weight: float = Field(1.0, gt=0, description="its weight when `combine: weighted`")


class QualityBucketsConfig(Strict):
    signals: list[Signal] = Field(min_length=1, description="the scores to combine, each ranked over the run")
    combine: Literal["max_rank", "weighted"] = Field(
        "max_rank", description="max_rank: a document's best rank; weighted: the weighted mean of its ranks"
    )
    buckets: int = Field(20, ge=2, le=1000, description="buckets of the combined score, by its percentiles")
    drop_below: int = Field(0, ge=0, description="drop documents in buckets below this one (0: keep every bucket)")
    sample_docs: int = Field(
        1_000_000, ge=100, description="documents (by id hash) whose values give the percentiles: exact up to this"
    )

    @model_validator(mode="after")
    def _check(self):
        fields = [s.field for s in self.signals]
        if len(set(fields)) != len(fields):
            raise ValueError(f"signals: a field is named twice ({', '.join(fields)})")
        if self.drop_below >= self.buckets:
            raise ValueError(f"drop_below ({self.drop_below}) must be below buckets ({self.buckets})")
        return self


def _values(doc: Document, fields: list[str]) -> list[float]:
    out = []
    for f in fields:
        v = doc.metadata.get(f)
        out.append(float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.nan)
    return out


def _smallest(keys: np.ndarray, values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The `k` entries of smallest key (ties: every entry of the k-th key's value is kept only up
    to k, by position), sorted by key."""
    if len(keys) > k:
        part = np.argpartition(keys, k - 1)[:k]
        keys, values = keys[part], values[part]
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


class SampleSignals(Step):
    """Task r: its `sample_docs` documents of smallest id hash, with their signals' values."""

    type = "📊 QUALITY"
    step_name = "quality_buckets_sample"

    def __init__(self, fields: list[str], sample_docs: int):
        super().__init__()
        self.fields, self.sample_docs = list(fields), sample_docs

    memory_setting = "quality_buckets.sample_docs"

    def memory_bytes(self, work: Workload) -> int:
        """Keys and values of up to twice the sample before each pruning (8 bytes each)."""
        per_task = min(self.sample_docs, work.documents_per_task)
        return int(2 * per_task * 8 * (len(self.fields) + 1) * 2)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        k, width = self.sample_docs, len(self.fields)
        keys = np.zeros(0, np.uint64)
        values = np.zeros((0, width), np.float64)
        buf_k: list[int] = []
        buf_v: list[list[float]] = []

        def prune():
            nonlocal keys, values
            if buf_k:
                keys = np.concatenate([keys, np.array(buf_k, np.uint64)])
                values = np.concatenate([values, np.array(buf_v, np.float64).reshape(-1, width)])
                buf_k.clear(), buf_v.clear()
            keys, values = _smallest(keys, values, k)

        n = 0
        with self.track_time():
            for doc in data or []:
                buf_k.append(sample_key(doc.id or doc.text))
                buf_v.append(_values(doc, self.fields))
                n += 1
                if len(buf_k) >= k:
                    prune()
            prune()
            out = self.stage_path("output", f"sample_{rank:05d}.npz")
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp.npz")
            np.savez(tmp, keys=keys, values=values)
            os.replace(tmp, out)
        self.stat_update("documents", value=n)
        self.stat_update("sampled", value=len(keys))
        return
        yield


def mid_ranks(sorted_values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The share of `sorted_values` below each of `x`, values equal to it counted half (0..1);
    NaN where `x` is NaN or there are no values."""
    n = len(sorted_values)
    if n == 0:
        return np.full(len(x), np.nan)
    lo = np.searchsorted(sorted_values, x, side="left")
    hi = np.searchsorted(sorted_values, x, side="right")
    r = (lo + hi) / (2.0 * n)
    r[np.isnan(x)] = np.nan
    return r


def combine(values: np.ndarray, sorted_signals: list[np.ndarray], config: QualityBucketsConfig) -> np.ndarray:
    """The combined score of documents (rows of `values`: one column per signal): each signal's
    rank (1 - rank for `better: lower`; a missing value ranks 0), then `config.combine`."""
    ranks = np.empty_like(values, dtype=np.float64)
    for j, (signal, ref) in enumerate(zip(config.signals, sorted_signals)):
        r = mid_ranks(ref, values[:, j])
        if signal.better == "lower":
            r = 1.0 - r
        ranks[:, j] = np.nan_to_num(r, nan=0.0)
    if config.combine == "max_rank":
        return ranks.max(axis=1) if len(ranks) else np.zeros(0)
    w = np.array([s.weight for s in config.signals])
    return ranks @ w / w.sum()


def bucket_of(scores: np.ndarray, sorted_combined: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket 0..buckets-1 of each combined score: its mid-rank among the sample's, times `buckets`."""
    if len(sorted_combined) == 0:
        return np.zeros(len(scores), np.int32)
    r = mid_ranks(sorted_combined, scores)
    return np.minimum((r * buckets).astype(np.int32), buckets - 1)


class BucketCuts(Step):
    """The run's sample from the tasks' samples; per signal its sorted values; the combined score."""

    type = "📊 QUALITY"
    step_name = "quality_buckets_cuts"
    #: reads at most `sample_docs` per sample file, whatever the crawl
    bounded_work = True
    memory_setting = "quality_buckets.sample_docs"

    def __init__(self, config: QualityBucketsConfig, sample_folder: Path):
        super().__init__()
        self.params, self.sample_folder = config, Path(sample_folder)

    def memory_bytes(self, work: Workload) -> int:
        """The sample kept and one task's sample read beside it, then the sorted copies."""
        n = min(self.params.sample_docs, work.documents)
        return int(4 * n * 8 * (len(self.params.signals) + 1))

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        c = self.params
        width = len(c.signals)
        keys, values = np.zeros(0, np.uint64), np.zeros((0, width), np.float64)
        with self.track_time():
            files = sorted(self.run_folder.listed(self.sample_folder, "sample_*.npz"))
            if len(files) != getattr(self, "sample_tasks", len(files)):
                raise FileNotFoundError(
                    f"{self.sample_folder}: {len(files)} sample files, {self.sample_tasks} sample tasks ran"
                )
            for f in files:
                with np.load(self.run_folder.staged(f)) as z:
                    keys, values = _smallest(
                        np.concatenate([keys, z["keys"]]), np.concatenate([values, z["values"]]), c.sample_docs
                    )
            signals = [np.sort(values[:, j][~np.isnan(values[:, j])]) for j in range(width)]
            combined = np.sort(combine(values, signals, c))
            out = self.stage_path("output")
            out.mkdir(parents=True, exist_ok=True)
            tmp = out / "cuts.tmp.npz"
            np.savez(tmp, combined=combined, **{f"signal_{j}": s for j, s in enumerate(signals)})
            os.replace(tmp, out / "cuts.npz")
            bounds = np.quantile(combined, np.arange(1, c.buckets) / c.buckets).tolist() if len(combined) else []
            write_text_atomic(
                out / "cuts.json",
                json.dumps(
                    {
                        "sampled_documents": int(len(keys)),
                        "signals": {s.field: int(len(v)) for s, v in zip(c.signals, signals)},
                        "combine": c.combine,
                        "buckets": c.buckets,
                        "bucket_lower_bounds": [0.0, *bounds],
                    },
                    indent=1,
                )
                + "\n",
            )
        self.stat_update("sampled", value=int(len(keys)))
        return
        yield


class AssignBuckets(Filter):
    """Each document's combined score and bucket (columns `quality_ensemble`, `quality_bucket`)."""

    drop_reasons = ("low_quality_bucket",)
    output_fields = {SCORE: pa.float32(), BUCKET: pa.int32()}
    score_field = SCORE
    score_bins = LINEAR_01
    batch_size = 1024

    def __init__(self, config: QualityBucketsConfig, cuts_folder: Path, *, step_id: str | None = None):
        super().__init__(step_id=step_id)
        self.params, self.cuts_folder = config, Path(cuts_folder)
        self._cuts = None

    def memory_bytes(self, work: Workload) -> int:
        """The sorted sample: every signal's values and the combined score, 8 bytes each."""
        n = min(self.params.sample_docs, work.documents)
        return int(n * 8 * (len(self.params.signals) + 1)) + super().memory_bytes(work)

    def _load(self):
        with np.load(self.run_folder.staged(self.cuts_folder, "cuts.npz")) as z:
            signals = [z[f"signal_{j}"] for j in range(len(self.params.signals))]
            self._cuts = (signals, z["combined"])

    def score_batch(self, docs: list[Document]) -> None:
        if self._cuts is None:
            self._load()
        signals, combined = self._cuts
        fields = [s.field for s in self.params.signals]
        values = np.array([_values(d, fields) for d in docs], np.float64).reshape(len(docs), len(fields))
        for j, f in enumerate(fields):
            missing = int(np.isnan(values[:, j]).sum())
            if missing:
                self.stat_update(f"missing_{f}", value=missing)
        scores = combine(values, signals, self.params)
        buckets = bucket_of(scores, combined, self.params.buckets)
        for doc, s, b in zip(docs, scores.tolist(), buckets.tolist()):
            doc.metadata[SCORE] = s
            doc.metadata[BUCKET] = b
        for b, n in enumerate(np.bincount(buckets, minlength=self.params.buckets).tolist()):
            if n:
                self.stat_update(f"bucket_{b:03d}", value=n)

    def filter(self, doc: Document, config: Strict) -> FilterResult:
        return True if doc.metadata[BUCKET] >= self.params.drop_below else (False, "low_quality_bucket")


class QualityBuckets(GlobalStep):
    """Nemotron-CC's ensemble: quality signals an earlier step wrote (a classifier's `<name>_score`,
    `quality_score`, `perplexity` with `better: lower`), each ranked over the run (its percentile),
    combined into `quality_ensemble` (a document's best rank, or their weighted mean) and cut into
    `buckets` buckets of equal share by its percentiles (`quality_bucket`, 0 the lowest); documents
    below bucket `drop_below` are dropped. `tokenize.bucket_weights` then repeats or drops buckets.
    Percentiles come from an id-hash sample of `sample_docs` documents: exact for runs up to that."""

    yaml_name = "quality_buckets"
    Config = QualityBucketsConfig
    drop_reasons = ("low_quality_bucket",)
    output_fields = AssignBuckets.output_fields

    def stages(self, ctx: StageContext) -> None:
        c = self.config
        where = config_key(self.name)
        for i, s in enumerate(c.signals):
            if s.field not in ctx.fields:
                have = ", ".join(sorted(ctx.fields)) or "none"
                raise ConfigError(
                    f"{where}.signals[{i}].field: no earlier step writes {s.field!r} (the documents carry: {have})"
                )
        fields = [s.field for s in c.signals]
        sample = ctx.stage(
            "quality_buckets_sample", [ParquetReader(ctx.documents), SampleSignals(fields, c.sample_docs)]
        )
        cuts = ctx.stage("quality_buckets_cuts", [BucketCuts(c, Path(sample.label, "output"))], tasks=1)
        cuts.pipeline[0].sample_tasks = sample.tasks
        ctx.stage(
            "quality_buckets",
            [
                ParquetReader(ctx.documents),
                AssignBuckets(c, Path(cuts.label, "output"), step_id=self.name),
                ctx.writer(),
            ],
        )
