"""Language ID with fastText's lid.176 (`langid` in YAML).

datatrove's LanguageFilter takes no model path (it downloads lid.176.bin from the web); this
step takes a local path or URL, predicts a batch of documents per call, and records `language`
and `language_score`. The predictions are fastText's, bit for bit, made by gristmill's own
predictor (`fasttext_native`: each word's n-grams computed once per task, not once per
occurrence; ~3x fastText's speed on a task's first pages, ~8x once its words are cached).

Long texts: the predictor reads the whole line it is given (the rows of its words and their
character n-grams, ~80 bytes a word: ~13 bytes per byte of text). A text longer than
`max_chars` characters (default 1,000,000; Common Crawl's pages are cut at 1 MiB of HTML, so
real pages are shorter) is predicted on `SAMPLE_WINDOWS` evenly spaced windows of it,
`max_chars` characters in all, each cut at spaces or newlines so no word is split: the average
of fastText's word vectors over the sample estimates the one over the whole text. Documents
shorter than that are predicted whole; sampled ones are counted in stats (`long_text_sampled`).
"""

from __future__ import annotations

from typing import ClassVar

import pyarrow as pa
from datatrove.data import Document
from pydantic import Field

from gristmill.core import storage
from gristmill.core.configlib import OMIT_DEFAULT, FilterConfig, Fraction
from gristmill.core.filter import FilterResult, ModelFilter, Threshold
from gristmill.core.scores import LINEAR_01
from gristmill.core.step import BuildContext, Workload
from gristmill.filters import fasttext_native
from gristmill.filters.model_check import ModelError, check_fasttext  # noqa: F401 (re-exported)

LABEL_PREFIX = "__label__"
#: windows a text longer than `max_chars` is predicted on
SAMPLE_WINDOWS = 8
MAX_CHARS = 1_000_000


def sample_text(text: str, max_chars: int) -> str:
    """`text`, or for a longer one `SAMPLE_WINDOWS` evenly spaced windows of it, `max_chars`
    characters in all, each cut inside at a space or newline (no word split) and joined by
    newlines."""
    if len(text) <= max_chars:
        return text
    width = max(max_chars // SAMPLE_WINDOWS, 1)
    step = (len(text) - width) / max(SAMPLE_WINDOWS - 1, 1)
    windows = []
    for i in range(SAMPLE_WINDOWS):
        start = int(i * step)
        w = text[start : start + width]
        if start > 0:  # drop the word the window's start cut
            cut = min((j for j in (w.find(" "), w.find("\n")) if j >= 0), default=len(w))
            w = w[cut + 1 :]
        if start + width < len(text):  # and the one its end cut
            w = w[: max(w.rfind(" "), w.rfind("\n"), 0)]
        windows.append(w)
    return "\n".join(windows)


class LangId(ModelFilter):
    yaml_name = "langid"
    drop_reasons = ("language_not_kept", "low_language_score")
    batch_size = 256
    output_fields = {"language": pa.string(), "language_score": pa.float32()}
    score_field = "language_score"
    thresholds = (Threshold("min_score", "min", score=True),)
    score_bins = LINEAR_01

    class Config(FilterConfig):
        # one model, one keep-list; `per_language: {zh: {min_score: 0.5}}` sets the score a page
        # labelled zh needs (FineWeb-2 uses a threshold per language: lid confidence is lower for
        # languages close to another, and for pages that mix scripts)
        language_fixed: ClassVar[tuple[str, ...]] = ("model", "languages", "max_chars")

        model: str = Field("models/lid.176.ftz", description="fastText LID model: path or http(s) URL")
        languages: list[str] | None = Field(["en"], description="languages to keep; null keeps all")
        min_score: Fraction = Field(
            0.65,
            description="minimum probability of the top language (per language: "
            "`per_language: {zh: {min_score: 0.5}}`)",
        )
        max_chars: int = Field(
            MAX_CHARS,
            ge=1000,
            description="a longer text is predicted on evenly spaced windows of this many characters in all",
            json_schema_extra=OMIT_DEFAULT,
        )

    @classmethod
    def build(cls, config: Config, ctx: BuildContext, step_id: str | None = None) -> LangId:
        # an http(s) URL is fetched to the local cache now, in the planning process, once; a
        # store's URL (s3://...) is fetched and validated by check_fasttext, which keeps the URL
        # for tasks on machines without the copy
        model = (
            config.model
            if storage.is_url(config.model) and storage.protocol(config.model) not in storage.READ_ONLY
            else str(ctx.local_path(config.model))
        )
        return cls(config, step_id=step_id, model_path=model)

    def __init__(self, config: Config | None = None, /, *, model_path: str | None = None, **kwargs):
        super().__init__(config, **kwargs)
        # validated now, in the planning process (cheap checks, then a trial load in a child
        # process), so a bad model fails the run before any document is read
        self.checked = check_fasttext(model_path or self.config.model)
        self.model_path = self.checked.path
        self.languages = set(self.config.languages) if self.config.languages else None
        self.min_score = self.config.min_score

    def load_model(self):
        return fasttext_native.load_classifier(self.checked)

    def model_bytes(self, work: Workload) -> int:
        """The predictor: its matrices, word cache and a text of `max_chars` (`fasttext_native`)."""
        return fasttext_native.memory_bytes(self.checked, self.config.max_chars)

    def score_batch(self, docs: list[Document]) -> None:
        # one line per text: the predictor reads newlines as spaces (fastText's API refuses them)
        labels, scores = self.model.predict_top([self._text(d) for d in docs])
        for doc, label, score in zip(docs, labels, scores):
            lang = label[len(LABEL_PREFIX) :] if label else "unknown"
            doc.metadata["language"] = lang  # picks the Config `filter` gets
            doc.metadata["language_score"] = score
            self.stat_update(f"lang_{lang}")

    def _text(self, doc: Document) -> str:
        if len(doc.text) <= self.config.max_chars:
            return doc.text
        self.stat_update("long_text_sampled")
        return sample_text(doc.text, self.config.max_chars)

    def filter(self, doc: Document, config: Config) -> FilterResult:
        if self.languages is not None and doc.metadata["language"] not in self.languages:
            return False, "language_not_kept"
        if doc.metadata["language_score"] < config.min_score:
            return False, "low_language_score"
        return True
