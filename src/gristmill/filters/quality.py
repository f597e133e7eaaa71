"""fastText quality classifier (`quality` in YAML), as DCLM's `fasttext_oh_eli5` filter.

Scores each document with a binary fastText classifier and keeps it if the probability of
`label` (default `__label__hq`, DCLM's and `pipeline quality train`'s) is at least `min_score`.
Predicts a batch of documents per call, like `langid`. The document's newlines are replaced by
spaces, as the classifier's training text was (fastText reads one line per example).
"""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
from datatrove.data import Document
from pydantic import Field

from gristmill.core.configlib import FilterConfig, Fraction
from gristmill.core.filter import FilterResult, ModelFilter
from gristmill.core.scores import LINEAR_01
from gristmill.filters.langid import load_fasttext
from gristmill.filters.model_check import ModelError, check_fasttext


def prepare(text: str) -> str:
    """The text a quality classifier sees, at training and at prediction."""
    return text.replace("\n", " ")  # fastText's predict refuses newlines; other whitespace separates words


def label_scores(model, texts: list[str], label: str) -> list[float]:
    """Probability of `label` for each text (k=-1: every label, so a low score is still seen)."""
    labels, probs = model.predict([prepare(t) for t in texts], k=-1)
    out = []
    for labs, ps in zip(labels, probs):
        out.append(next((float(p) for lab, p in zip(labs, ps) if lab == label), 0.0))
    return out


class Quality(ModelFilter):
    yaml_name = "quality"
    drop_reasons = ("low_quality_score",)
    batch_size = 256
    output_fields = {"quality_score": pa.float32()}
    score_field = "quality_score"
    score_bins = LINEAR_01

    class Config(FilterConfig):
        language_fixed: ClassVar[tuple[str, ...]] = ("model", "label")  # one classifier per step

        model: str = Field("models/quality/en.bin", description="fastText classifier (`pipeline quality train`)")
        label: str = Field("__label__hq", description="label whose probability is the quality score")
        min_score: Fraction = Field(0.5, description="drop documents whose probability of `label` is lower")

    def __init__(self, config: Config | None = None, /, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        # Validated now, in the planning process, with its labels: before any document is read.
        self.checked = check_fasttext(c.model, "fastText classifier")
        self.model_path = self.checked.path
        labels = self.checked.info["labels"]
        if c.label not in labels:
            raise ModelError(
                f"{self.model_path}: no label {c.label!r} in this classifier (it has {labels}); set `label`"
            )
        self.label = c.label
        self.min_score = c.min_score

    def load_model(self):
        return load_fasttext(self.checked)

    def score_batch(self, docs: list[Document]) -> None:
        for doc, score in zip(docs, label_scores(self.model, [d.text for d in docs], self.label)):
            doc.metadata["quality_score"] = score

    def filter(self, doc: Document, config: Config) -> FilterResult:
        return True if doc.metadata["quality_score"] >= config.min_score else (False, "low_quality_score")
