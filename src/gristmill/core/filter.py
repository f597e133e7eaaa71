"""The filter contract: `filter(doc)` returns True to keep or `(False, "reason")` to drop.

Like datatrove's BaseFilter, plus what our stats need: bytes in and out (a filter such as
`c4_lines` rewrites text), every drop counted under its reason, and an optional sample of
dropped documents written for inspection.

Every filter's parameters may differ by language: a filter's `Config` gets a `per_language`
key (`per_language: {zh: {min_avg_word_length: 1}, default: {...}}`, see
`configlib.with_per_language`), and `config_for(language)` is the Config of a page's
language, resolved once per language when the step is built. While `filter(doc)` runs (from
the default `filter_batch`), `self.config` is the Config of the document's language, so a
filter that reads `self.config` follows `per_language` without knowing of it; a filter that
overrides `filter_batch` calls `config_for` itself.
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import ClassVar

from datatrove.data import Document, DocumentsPipeline
from datatrove.utils.batching import batched

from gristmill.core.configlib import Strict, language_configs, with_per_language
from gristmill.core.scores import LENGTH_BINS, ScoreRecorder
from gristmill.core.sinks import DroppedSampler
from gristmill.core.step import Step, Workload

FilterResult = bool | tuple[bool, str]


class Filter(Step):
    type = "🔻 FILTER"
    #: documents handed to filter_batch at once (models predict faster on batches)
    batch_size: int = 1
    #: metadata field holding the score this filter thresholds on, histogrammed per run
    #: (`<stage>/scores/`); None: the document's length in characters
    score_field: str | None = None
    #: the histogram's fixed bins: {"scale": "linear"|"log" (log10 of the value), "lo", "hi", "n"}
    score_bins: dict = LENGTH_BINS

    #: set by the stage context (when `output.dropped_sample` > 0): a sample of dropped documents
    dropped: DroppedSampler | None = None
    #: set by the stage context to `<stage>/scores/<step>`; None: scores are kept but not written
    scores_folder: str | None = None
    #: parameters that `per_language` may not set (a model file: one is loaded per step)
    language_fixed: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # every filter that declares parameters accepts `per_language` overrides of them,
        # without each filter declaring it (a plugin's filter included)
        own = cls.__dict__.get("Config")
        if own is not None and "per_language" not in own.model_fields:
            cls.Config = with_per_language(own, cls.language_fixed)

    def __init__(self, config: Strict | None = None, /, *, step_id: str | None = None, **params):
        super().__init__(config, step_id=step_id, **params)
        self._step_config = self.config
        self._language_configs, self._other_config = language_configs(self.config)

    def config_for(self, language: str | None) -> Strict:
        """The parameters for a page labelled `language` (`per_language` applied): the
        language's own, else `default`'s, else the top-level ones."""
        return self._language_configs.get(language, self._other_config)

    @abstractmethod
    def filter(self, doc: Document) -> FilterResult:
        raise NotImplementedError

    def filter_batch(self, docs: list[Document]) -> list[FilterResult]:
        if not self._language_configs and self._other_config is self._step_config:
            return [self.filter(d) for d in docs]  # no per_language: one config for all
        results = []
        try:
            for d in docs:
                self.config = self.config_for(d.metadata.get("language"))
                results.append(self.filter(d))
        finally:
            self.config = self._step_config
        return results

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if self.dropped:
            self.dropped.open(rank)
        scores = ScoreRecorder(self.name, self.score_field, self.score_bins)
        try:
            for batch in batched(data, self.batch_size):
                sizes = [len(d.text.encode("utf-8")) for d in batch]
                chars = [len(d.text) for d in batch]
                with self.track_time():
                    results = self.filter_batch(batch)
                for doc, size, length, result in zip(batch, sizes, chars, results):
                    self.stat_update("total")
                    self.stat_update("bytes_in", value=size)
                    keep, reason = (result, None) if isinstance(result, bool) else result
                    size_out = len(doc.text.encode("utf-8")) if keep else 0
                    # after filtering: langid's own label counts for the documents it saw
                    scores.add(doc, length, keep, reason, size, size_out)
                    if keep:
                        self.stat_update("forwarded")
                        self.stat_update("bytes_out", value=size_out)
                        yield doc
                    else:
                        self.stat_update("dropped")
                        self.stat_update(f"dropped_{reason or 'unspecified'}")
                        if self.dropped:
                            self.dropped.offer(doc, reason)
            if self.scores_folder is not None:  # the task's input is exhausted: it finished
                scores.write(Path(self.scores_folder), rank)
        finally:
            if self.dropped:
                self.dropped.close()


class ModelFilter(Filter):
    """A filter that scores with a model (fastText, KenLM).

    The model file is validated when the step is constructed, in the planning process
    (`model_check`: cheap checks, then a trial load in a short-lived child process), so a
    truncated or corrupt file is one clear error before any stage starts, never a crashed or
    hung worker. The model is then loaded in the task's own process, only if the file is
    unchanged since that check, never pickled with the step (datatrove ships steps to workers
    and Slurm jobs by pickle), and before the first document, so the step's timer measures
    scoring only.
    """

    _model = None

    def load_model(self):
        raise NotImplementedError

    def memory_bytes(self, work: Workload) -> int:
        """The model files (`self.checked`: one or a dict of them) twice over: loaded, then the
        buffers of scoring a batch; KenLM binaries are memory-mapped, so this is an upper bound."""
        checked = getattr(self, "checked", None)
        files = checked.values() if isinstance(checked, dict) else [checked] if checked is not None else []
        return sum(2 * c.size for c in files) + (8 << 20)

    @property
    def model(self):
        if self._model is None:
            self._model = self.load_model()
        return self._model

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_model"] = None
        return state

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        self.model  # noqa: B018 - loads it before the first document, so the step timer measures scoring only
        yield from super().run(data, rank, world_size)
