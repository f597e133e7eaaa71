"""Neural quality classifier (`classifier` in YAML): scores each document with a local Hugging
Face model directory, as FineWeb-Edu's and NeMo Curator's classifiers do.

The directory is a `*ForSequenceClassification` model (FineWeb-Edu's classifier: a regression
head on a BERT-style encoder) or an encoder with a head of ours (`pipeline train-classifier`);
`classifier_model.py` validates, loads and runs it. Each document gets `<name>_score` (a
regression's output, or the probability of `label`) and `<name>_class` (the regression rounded
into `class_range`, FineWeb-Edu's `int_score`; or the arg max class), and is kept when its score
is at least `min_score` (per language, as every filter's parameters); with `min_score: null` the
step only annotates.

Documents are scored a window at a time (`window` documents, or `BATCH_CHARS` of text): inside
it they are sorted by length, batched by `batch_tokens` padded tokens and written back in input
order. `device: auto` takes a GPU where the task sees one (bf16) and the CPU otherwise (fp32,
with one warning); `device: cuda` is refused at planning where no GPU is visible. A task holds
one GPU (`gpus_per_task`), which an executor can read to ask for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

import pyarrow as pa
from datatrove.data import Document
from loguru import logger
from pydantic import Field

from gristmill.core.configlib import OMIT_DEFAULT, FilterConfig
from gristmill.core.filter import FilterResult, ModelFilter, batched_documents
from gristmill.core.scores import LINEAR_01
from gristmill.core.step import BuildContext, Workload
from gristmill.filters import classifier_model as cm
from gristmill.filters.model_check import ModelError

_warned_cpu = False


def _warn_cpu_once(what: str) -> None:
    global _warned_cpu
    if not _warned_cpu:
        _warned_cpu = True
        logger.warning(f"{what}: no CUDA GPU visible; scoring on CPU in fp32 (device: auto)")


class Classifier(ModelFilter):
    yaml_name = "classifier"
    drop_reasons = ("low_classifier_score",)
    batch_size = 2048  # the default window; `window` sets it
    output_fields = {"classifier_score": pa.float32(), "classifier_class": pa.int32()}
    score_field = "classifier_score"

    class Config(FilterConfig):
        # one model per step; per language: min_score only
        language_fixed: ClassVar[tuple[str, ...]] = (
            "model",
            "name",
            "label",
            "class_range",
            "max_tokens",
            "device",
            "batch_tokens",
            "window",
            "max_chars",
        )

        model: str = Field(
            description="Hugging Face model directory: a *ForSequenceClassification model, or an encoder "
            "with a head from `pipeline train-classifier`"
        )
        name: str = Field(
            "classifier",
            pattern=r"^[a-z][a-z0-9_]*$",
            description="column prefix: the step writes <name>_score and <name>_class",
        )
        min_score: float | None = Field(
            None, description="drop documents whose score is lower; null keeps every document (scores only)"
        )
        label: str | None = Field(
            None, description="a classifier's label whose probability is the score (default: its last label)"
        )
        class_range: tuple[int, int] = Field(
            (0, 5), description="a regression's class: its score rounded and clamped to this range"
        )
        max_tokens: int = Field(512, ge=8, description="tokens per document scored: the text is truncated to them")
        device: Literal["auto", "cpu", "cuda"] = Field(
            "auto",
            description="auto: a GPU where visible (bf16), else CPU (fp32) with a warning; cuda: each task "
            "is given a GPU (on Slurm and Ray, where the planning machine need not have one)",
        )
        batch_tokens: int | None = Field(
            None,
            ge=64,
            description="padded tokens per forward pass (default 65536 on GPU, 8192 on CPU)",
            json_schema_extra=OMIT_DEFAULT,
        )
        window: int = Field(
            2048, ge=1, description="documents sorted by length and scored together", json_schema_extra=OMIT_DEFAULT
        )
        max_chars: int | None = Field(
            None,
            ge=64,
            description="characters kept before tokenizing (default max_tokens x 8; a text cut too short is "
            "tokenized whole)",
            json_schema_extra=OMIT_DEFAULT,
        )

    @classmethod
    def build(cls, config: Config, ctx: BuildContext, step_id: str | None = None) -> Classifier:
        return cls(config, step_id=step_id, executor=getattr(ctx, "executor", "local"))

    def __init__(self, config: Config | None = None, /, *, executor: str = "local", **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        what = f"{self.name} ({c.model})"
        # validated now, in the planning process: the files, then a trial load and a probe score
        self.info = cm.check_classifier(c.model)
        if c.device == "cuda" and executor != "local":
            # the tasks run on the cluster's machines, whose GPUs this one need not have: each
            # task checks its own (`load_model`) and fails in one line without one
            self.device = "cuda"
        else:
            self.device = cm.resolve_device(c.device, what)
        if c.device == "auto" and self.device == "cpu":
            _warn_cpu_once(what)
        self.batch_size = c.window
        self._ahead: dict = {}  # id of a window's first document -> the Future of its tokens
        self.score_key, self.class_key = f"{c.name}_score", f"{c.name}_class"
        self.output_fields = {self.score_key: pa.float32(), self.class_key: pa.int32()}
        self.score_field = self.score_key
        info = self.info
        if info.task == "regression":
            lo, hi = c.class_range
            if lo >= hi:
                raise ModelError(f"{self.name}: class_range {list(c.class_range)} is empty")
            self.score_bins = {"scale": "linear", "lo": float(lo - 1), "hi": float(hi + 1), "n": 4 * (hi - lo + 2)}
            if c.label is not None:
                raise ModelError(f"{c.model}: label {c.label!r} given for a regression model (it has one output)")
            self.label_index = None
        else:
            self.score_bins = LINEAR_01
            labels = list(info.labels)
            if c.label is None:
                self.label_index = len(labels) - 1
            elif c.label in labels:
                self.label_index = labels.index(c.label)
            else:
                raise ModelError(f"{c.model}: no label {c.label!r} in this classifier (it has {labels}); set `label`")

    @property
    def gpus_per_task(self) -> int:
        """GPUs one task of this step's stage uses: 1 when it scores on a GPU (for executors)."""
        return 1 if self.device == "cuda" or self.config.device == "cuda" else 0

    def gpu_seconds(self, work: Workload) -> float | None:
        """From the throughput measured on one H200 (`benchmarks/classifier_throughput.py`,
        docs/benchmarks.md), scaled by parameters x tokens scored per document: a forward's cost
        at these lengths is its matrix products, ~2 x parameters FLOPs a token."""
        if not self.gpus_per_task:
            return None
        scale = (self.info.params * self.config.max_tokens) / (cm.MEASURED_GPU_PARAMS * cm.MEASURED_GPU_TOKENS)
        return work.documents / cm.MEASURED_GPU_DOCS_S * scale

    @property
    def batch_tokens(self) -> int:
        return self.config.batch_tokens or cm.BATCH_TOKENS[self.device]

    def load_model(self):
        info = self.info
        for name, size, mtime in info.files:
            try:
                st = (Path(info.path) / name).stat()
            except OSError as e:
                raise ModelError(f"{info.path}: {name} gone since the run was planned ({e.strerror})") from None
            if (st.st_size, st.st_mtime_ns) != (size, mtime):
                raise ModelError(f"{info.path}: {name} changed since the run was planned; re-run the command")
        c = self.config
        # the task's own view: `auto` takes the GPU this task was given, if any
        device = cm.resolve_device(c.device, f"{self.name} ({c.model})")
        self.device = device
        return cm.Scorer(
            info,
            device,
            c.max_tokens,
            batch_tokens=c.batch_tokens,
            label=self.label_index,
            class_range=c.class_range,
            max_chars=c.max_chars,
            on_event=lambda name, n=1: self.stat_update(name, value=n),
        )

    def model_bytes(self, work: Workload) -> int:
        """Host memory: the weights (fp32, as loaded), one batch's activations on CPU, and a
        window's cut texts and token ids (Python lists: ~36 bytes a token)."""
        c, info = self.config, self.info
        tokens = c.max_tokens
        window = c.window * (cm.CHARS_PER_TOKEN * tokens * 4 + tokens * 36)
        activations = cm.activation_bytes(info, self.batch_tokens, tokens) if self.device == "cpu" else 0
        return cm.weight_bytes(info) + activations + window + (64 << 20)  # + the tokenizer

    def gpu_memory_bytes(self) -> int:
        """GPU memory of a task on GPU: bf16 weights and one batch's activations."""
        if self.device != "cuda":
            return 0
        return cm.weight_bytes(self.info, 2) + cm.activation_bytes(
            self.info, self.batch_tokens, self.config.max_tokens, 2
        )

    def run(self, data, rank: int = 0, world_size: int = 1):
        if self.model._pool is not None:  # on GPU: each window's tokens made while the one before is scored
            data = self._tokenized_ahead(data)
        yield from super().run(data, rank, world_size)

    def _tokenized_ahead(self, data):
        """The documents, read a window ahead of the one `Filter.run` scores: each window (the
        same `batched_documents` windows as Filter.run's) is handed to the tokenizer's thread
        before the one before it is yielded, so its tokens are made while the GPU works."""
        pending = None
        for window in batched_documents(data, self.batch_size):
            future = self.model.prefetch([d.text for d in window])
            if pending is not None:
                yield from pending
            self._ahead[id(window[0])] = future
            pending = window
        if pending is not None:
            yield from pending

    def score_batch(self, docs: list[Document]) -> None:
        future = self._ahead.pop(id(docs[0]), None) if docs else None
        ids = future.result() if future is not None else None
        scores, classes = self.model.score([d.text for d in docs], ids)
        sk, ck = self.score_key, self.class_key
        for doc, s, k in zip(docs, scores.tolist(), classes.tolist()):
            doc.metadata[sk] = s
            doc.metadata[ck] = k

    def filter(self, doc: Document, config: Config) -> FilterResult:
        if config.min_score is None or doc.metadata[self.score_key] >= config.min_score:
            return True
        return False, "low_classifier_score"
