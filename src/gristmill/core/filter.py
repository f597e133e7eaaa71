"""The filter contract: `filter(doc, config)` returns True to keep or `(False, "reason")` to drop.

Like datatrove's BaseFilter, plus what our stats need: bytes in and out (a filter such as
`c4_lines` rewrites text), every drop counted under its reason, and an optional sample of
dropped documents written for inspection.

Every filter's parameters may differ by language, and every filter gets them one way: its
`Config` subclasses `configlib.FilterConfig`, which carries `per_language`
(`per_language: {zh: {min_avg_word_length: 1}, default: {...}}`) and `language_fixed`; the
step resolves it once per language when it is built (`config_for(language)`), and
`filter_batch` hands `filter(doc, config)` the Config of the document's language
(`language_of(doc)`: langid's label). A filter reads its parameters from that `config`, never
resolves a language itself, and nothing changes `self.config` (the step's top-level Config)
while documents pass. A filter that scores a batch at once (a model predicts faster on one)
does it in `score_batch(docs)`, which runs first and writes the scores onto the documents
(langid: the language, which then picks the Config); `filter` decides on them.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from datatrove.data import Document, DocumentsPipeline
from datatrove.utils.stats import MetricStats

from gristmill.core.configlib import FilterConfig, Strict, language_configs
from gristmill.core.documents import text_bytes
from gristmill.core.parquet_io import ROW_GROUP_DOCS
from gristmill.core.scores import LENGTH_BINS, ScoreRecorder
from gristmill.core.sinks import SAMPLE_ROW_GROUP_BYTES, DroppedSampler
from gristmill.core.step import DOCUMENT_BYTES_PER_BYTE, Step, Workload

FilterResult = bool | tuple[bool, str]

#: characters of text a batch of a batched filter holds: it closes once it reaches this (256 web
#: pages are ~1.3M characters; a count alone let 256 pages of 30 MB make one batch of 7.7 GB)
BATCH_CHARS = 4_000_000


def batched_documents(data: Iterable[Document], size: int, max_chars: int = BATCH_CHARS) -> Iterator[list[Document]]:
    """Batches of at most `size` documents, each closed once its text reaches `max_chars`
    characters (so a batch holds at most that plus one document)."""
    batch: list[Document] = []
    chars = 0
    for doc in data:
        batch.append(doc)
        chars += len(doc.text)
        if len(batch) >= size or chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


#: documents a filter counts in plain numbers before adding them to its datatrove stats
TALLY_DOCS = 4096


class Tally:
    """What a filter's stats count of each document ("total", "bytes_in", "forwarded",
    "bytes_out", "dropped", "dropped_<reason>"), kept in plain numbers and added to the step's
    datatrove stats every `TALLY_DOCS` documents and at the end: a `stat_update` per count, five
    per document at ~2 us each, was a quarter of a curation pass. The totals and counts are what
    per-document updates give; the byte sizes' mean and variance are merged a flush at a time
    (datatrove's own merge of two MetricStats)."""

    __slots__ = ("docs", "kept", "reasons", "sizes_in", "sizes_out")

    def __init__(self):
        self.docs = self.kept = 0
        self.reasons: dict[str, int] = {}  # "dropped_<reason>" -> count, in first-seen order
        self.sizes_in: list[int] = []
        self.sizes_out: list[int] = []

    def add(self, size: int, keep: bool, reason: str | None, size_out: int) -> None:
        self.docs += 1
        self.sizes_in.append(size)
        if keep:
            self.kept += 1
            self.sizes_out.append(size_out)
        else:
            key = f"dropped_{reason or 'unspecified'}"
            self.reasons[key] = self.reasons.get(key, 0) + 1

    def flush(self, stats) -> None:
        if not self.docs:
            return
        dropped = self.docs - self.kept
        for key, count in (("total", self.docs), ("forwarded", self.kept), ("dropped", dropped), *self.reasons.items()):
            if count:
                stats[key] = stats[key] + MetricStats(total=count, n=count, mean=1.0, min=1, max=1)
        for key, sizes in (("bytes_in", self.sizes_in), ("bytes_out", self.sizes_out)):
            if sizes:
                total = sum(sizes)
                mean = total / len(sizes)
                variance = sum((x - mean) ** 2 for x in sizes)
                batch = MetricStats(total=total, n=len(sizes), mean=mean, min=min(sizes), max=max(sizes))
                batch._running_variance = variance
                stats[key] = stats[key] + batch
        self.__init__()


@dataclass(frozen=True)
class Threshold:
    """A parameter of a filter that bounds a statistic the filter computes: documents (or lines)
    below a `min` bound or above a `max` bound are dropped. Declared by the filter
    (`Filter.thresholds`), read by `pipeline calibrate` and the report, which know no step by name."""

    param: str
    kind: Literal["min", "max"]
    #: the n of an n-gram rule: its entry in the parameter's [n, fraction] list
    n: int | None = None
    #: the parameter is an integer
    integer: bool = False
    #: the statistic is per line (the rule removes lines, not documents): a list per document
    lines: bool = False
    #: a count that grows with the document (words, sentences): what share a threshold removes
    #: depends on how a reference text was cut, so calibration scales it instead
    length: bool = False
    #: the bound on the filter's `score_field` (drawn on its score histogram)
    score: bool = False

    @property
    def name(self) -> str:
        return self.param + (f"[{self.n}]" if self.n is not None else "")

    def value(self, config):
        """The bound in a Config of the filter (an [n, fraction] list's fraction for `n`)."""
        value = getattr(config, self.param)
        return dict(value).get(self.n) if self.n is not None else value


class Filter(Step):
    type = "🔻 FILTER"
    #: the parameters that bound what it computes (`statistics`), for calibration and the report
    thresholds: tuple[Threshold, ...] = ()
    #: documents handed to filter_batch at once (models predict faster on batches)
    batch_size: int = 1
    #: metadata field holding the score this filter thresholds on, histogrammed per run
    #: (`<stage>/scores/`); None: the document's length in characters
    score_field: str | None = None
    #: the histogram's fixed bins: {"scale": "linear"|"log" (log10 of the value), "lo", "hi", "n"}
    score_bins: dict = LENGTH_BINS

    #: set by the stage context (when `output.dropped_sample` > 0): a sample of dropped documents
    dropped: DroppedSampler | None = None
    #: set by the stage context to `<stage>/scores/<step>` (in the run folder); None: scores are
    #: kept but not written
    scores_folder: str | None = None

    def statistics(self, text: str, language: str | None, config: Strict) -> dict[str, float | list[float] | None]:
        """{threshold name: the statistic the filter compares with that threshold} for one
        document, computed by the code `filter` decides with (None: the rule does not apply).
        A filter whose thresholds calibration can fit implements it."""
        raise NotImplementedError(f"{type(self).__name__} does not report its statistics")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # checked, never rewritten: a filter whose Config lacked per_language would refuse it
        own = cls.__dict__.get("Config")
        if own is not None and not issubclass(own, FilterConfig):
            raise TypeError(
                f"{cls.__module__}.{cls.__qualname__}.Config: a filter's Config must subclass "
                "gristmill.core.configlib.FilterConfig (it carries `per_language`)"
            )

    def __init__(self, config: Strict | None = None, /, *, step_id: str | None = None, **params):
        super().__init__(config, step_id=step_id, **params)
        self._language_configs, self._other_config = language_configs(self.config)

    def config_for(self, language: str | None) -> Strict:
        """The parameters for a page labelled `language` (`per_language` applied): the
        language's own, else `default`'s, else the top-level ones."""
        return self._language_configs.get(language, self._other_config)

    def language_of(self, doc: Document) -> str | None:
        """The language whose parameters `filter` gets for `doc`: langid's label."""
        return doc.metadata.get("language")

    def memory_bytes(self, work: Workload) -> int:
        """What every filter holds: a batch of documents beyond the one passing (`batch_size` > 1:
        up to `BATCH_CHARS` characters), and the dropped documents its sample buffers for a row
        group (up to `SAMPLE_ROW_GROUP_BYTES`, or ROW_GROUP_DOCS documents)."""
        batch = DOCUMENT_BYTES_PER_BYTE * BATCH_CHARS if self.batch_size > 1 else 0
        if self.dropped is None:
            return batch
        mean = work.text_bytes / max(work.documents, 1)
        return batch + int(DOCUMENT_BYTES_PER_BYTE * min(ROW_GROUP_DOCS * mean, SAMPLE_ROW_GROUP_BYTES))

    def score_batch(self, docs: list[Document]) -> None:
        """Score `docs` at once, before any of them is decided, writing each score onto its
        document's metadata (a model predicts a batch faster than one document at a time)."""

    @abstractmethod
    def filter(self, doc: Document, config: Strict) -> FilterResult:
        """Keep `doc` (True) or drop it (`(False, "reason")`) by `config`: this step's
        parameters for the document's language."""
        raise NotImplementedError

    def filter_batch(self, docs: list[Document]) -> list[FilterResult]:
        """Each document's result, decided with its language's parameters (after `score_batch`)."""
        self.score_batch(docs)
        if not self._language_configs:  # one Config for every language
            config = self._other_config
            return [self.filter(d, config) for d in docs]
        config_for, language_of = self.config_for, self.language_of
        return [self.filter(d, config_for(language_of(d))) for d in docs]

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if self.dropped:
            self.dropped.open(rank, self.run_folder)
        scores = ScoreRecorder(self.name, self.score_field, self.score_bins)
        tally = Tally()
        try:
            for batch in batched_documents(data, self.batch_size):
                sizes = [text_bytes(d.text) for d in batch]
                chars = [len(d.text) for d in batch]
                with self.track_time():
                    results = self.filter_batch(batch)
                for doc, size, length, result in zip(batch, sizes, chars, results):
                    keep, reason = (result, None) if result.__class__ is bool else result
                    size_out = text_bytes(doc.text) if keep else 0
                    # after filtering: langid's own label counts for the documents it saw
                    scores.add(doc, length, keep, reason, size, size_out)
                    tally.add(size, keep, reason, size_out)
                    if keep:
                        yield doc
                    elif self.dropped:
                        self.dropped.offer(doc, reason)
                if tally.docs >= TALLY_DOCS:
                    tally.flush(self.stats)
            tally.flush(self.stats)
            if self.scores_folder is not None:  # the task's input is exhausted: it finished
                scores.write(self.run_folder.path(self.scores_folder), rank)
        except BaseException:  # a later step failed (GeneratorExit) or this one did: no partial sample
            tally.flush(self.stats)
            if self.dropped:
                self.dropped.abort()
            raise
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

    def model_bytes(self, work: Workload) -> int:
        """What the loaded model holds: by default its files (`self.checked`: one or a dict of
        them) twice over, loaded and the buffers of scoring a batch (KenLM binaries are
        memory-mapped, so this is an upper bound)."""
        checked = getattr(self, "checked", None)
        files = checked.values() if isinstance(checked, dict) else [checked] if checked is not None else []
        return sum(2 * c.size for c in files) + (8 << 20)

    def memory_bytes(self, work: Workload) -> int:
        """The model (`model_bytes`) and what every filter holds (`Filter.memory_bytes`)."""
        return self.model_bytes(work) + super().memory_bytes(work)

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
