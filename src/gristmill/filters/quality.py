"""fastText quality classifier (`quality` in YAML), as DCLM's `fasttext_oh_eli5` filter.

Scores each document with a binary fastText classifier and keeps it if the probability of
`label` (default `__label__hq`, DCLM's and `pipeline quality train`'s) is at least `min_score`.
Predicts a batch of documents per call, like `langid`, with the same predictor (fastText's
probabilities bit for bit, `fasttext_native`). The document's newlines count as spaces, as in
the classifier's training text (fastText reads one line per example).

A text longer than `max_chars` characters is scored on evenly spaced windows of it, as `langid`
does (`langid.sample_text`; counted in stats as `long_text_sampled`): fastText would otherwise
hold ~10 bytes per byte of a huge page.
"""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
from datatrove.data import Document
from pydantic import Field

from gristmill.core.configlib import OMIT_DEFAULT, FilterConfig, Fraction
from gristmill.core.filter import FilterResult, ModelFilter, Threshold
from gristmill.core.scores import LINEAR_01
from gristmill.core.step import Workload
from gristmill.filters import fasttext_native
from gristmill.filters.langid import MAX_CHARS, sample_text
from gristmill.filters.model_check import ModelError, check_fasttext


def prepare(text: str) -> str:
    """The text a quality classifier is trained on (the predictor reads newlines as spaces)."""
    return text.replace("\n", " ")  # fastText reads one line per example; other whitespace separates words


class Quality(ModelFilter):
    yaml_name = "quality"
    drop_reasons = ("low_quality_score",)
    batch_size = 256
    output_fields = {"quality_score": pa.float32()}
    score_field = "quality_score"
    thresholds = (Threshold("min_score", "min", score=True),)
    score_bins = LINEAR_01

    class Config(FilterConfig):
        language_fixed: ClassVar[tuple[str, ...]] = ("model", "label", "max_chars")  # one classifier per step

        model: str = Field("models/quality/en.bin", description="fastText classifier (`pipeline quality train`)")
        label: str = Field("__label__hq", description="label whose probability is the quality score")
        min_score: Fraction = Field(0.5, description="drop documents whose probability of `label` is lower")
        max_chars: int = Field(
            MAX_CHARS,
            ge=1000,
            description="a longer text is scored on evenly spaced windows of this many characters in all",
            json_schema_extra=OMIT_DEFAULT,
        )

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
        return fasttext_native.load_classifier(self.checked)

    def model_bytes(self, work: Workload) -> int:
        """The predictor: its matrices, word cache and a text of `max_chars` (`fasttext_native`)."""
        return fasttext_native.memory_bytes(self.checked, self.config.max_chars)

    def score_batch(self, docs: list[Document]) -> None:
        # the probability of `label` as fastText's predict(k=-1) reports it
        for doc, score in zip(docs, self.model.label_scores([self._text(d) for d in docs], self.label)):
            doc.metadata["quality_score"] = score

    def _text(self, doc: Document) -> str:
        if len(doc.text) <= self.config.max_chars:
            return doc.text
        self.stat_update("long_text_sampled")
        return sample_text(doc.text, self.config.max_chars)

    def filter(self, doc: Document, config: Config) -> FilterResult:
        return True if doc.metadata["quality_score"] >= config.min_score else (False, "low_quality_score")
