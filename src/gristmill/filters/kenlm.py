"""KenLM perplexity filter, as CCNet (Wenzek et al. 2019) does it (`kenlm` in YAML).

Each document is scored by the KenLM model of its language (`doc.metadata["language"]`, set by
`langid`, else `default_language`). Its text is normalised line by line exactly as CCNet does
(`ccnet_normalize`, the same function `pipeline kenlm train` uses), and the document perplexity
is CCNet's token-weighted one:

    10 ** (-sum(log10 P(line)) / sum(tokens(line) + 1))     (+1: the end-of-sentence token)

CCNet tokenises the normalised text with a SentencePiece model trained with its KenLM model.
We have no such SentencePiece models offline, so this step scores the *whitespace tokens* of
the normalised text, and `kenlm train` trains on the same tokens. CCNet's published
`<lang>.arpa.bin` models expect SentencePiece pieces: they load and run here, but their
perplexities come out higher and differ from CCNet's (see docs/models.md).

A document is kept if its perplexity is at most `max_perplexity` and/or its CCNet bucket
(head < cut-off 1 <= middle < cut-off 2 <= tail) is in `keep_buckets`. The cut-offs come from
`cutoffs` in the config, else from the model's sidecar `<model>.stats.json`, written by
training. Documents of a language without a model pass through, counted as `no_model_<lang>`.

A document's lines are normalised and scored one at a time (`iter_normalized_lines`): what a
page holds beyond its text is a (score, length) pair per line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

import pyarrow as pa
from datatrove.data import Document
from pydantic import Field, field_validator

from gristmill.core import storage
from gristmill.core.configlib import FilterConfig
from gristmill.core.filter import FilterResult, ModelFilter, Threshold
from gristmill.filters.ccnet_normalize import iter_normalized_lines
from gristmill.filters.model_check import Checked, ModelError, check_kenlm, unchanged

BUCKETS = ("head", "middle", "tail")


def stats_path(model: str | Path) -> Path | str:
    """The sidecar of a model (a URL beside a model given as a URL)."""
    return f"{model}.stats.json" if storage.is_url(model) else Path(f"{model}.stats.json")


def load_kenlm(path: str | Path | Checked):
    """Load a KenLM model validated by `check_kenlm` (validated now if given a path)."""
    import kenlm  # the installed `kenlm` module; absolute import, not this file

    checked = path if isinstance(path, Checked) else check_kenlm(path)
    try:
        return kenlm.Model(unchanged(checked))
    except Exception as e:  # noqa: BLE001 - kenlm raises OSError with its own message
        raise ModelError(f"{checked.path}: KenLM cannot load it: {e}") from None


def read_cutoffs(model: str | Path) -> tuple[float, float] | None:
    sidecar = stats_path(model)
    if isinstance(sidecar, str):  # beside a model given as a URL
        if not storage.exists(sidecar):
            return None
        text = storage.read_bytes(sidecar).decode("utf-8", "replace")
    elif not sidecar.is_file():
        return None
    else:
        text = sidecar.read_text()
    try:
        c = json.loads(text)["cutoffs"]
        return float(c["head"]), float(c["middle"])
    except (ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{sidecar}: no usable `cutoffs` ({e!r}); re-run `pipeline kenlm train`") from None


def score_lines(model, text: str) -> list[tuple[float, int]]:
    """(log10 probability, tokens + 1) of each non-empty normalised line of `text`."""
    # Whitespace tokens of the normalised line (CCNet: SentencePiece pieces; see module doc).
    # one normalised line at a time: a long page's lines are never all held at once
    return [(model.score(line, bos=True, eos=True), len(line.split()) + 1) for line in iter_normalized_lines(text)]


def perplexity(scores: list[tuple[float, int]]) -> float | None:
    """CCNet's document perplexity from per-line (log10 prob, length) pairs; None without lines."""
    length = sum(n for _, n in scores)
    if not length:
        return None
    return 10.0 ** (-sum(s for s, _ in scores) / length)


def bucket(pp: float, cutoffs: tuple[float, float]) -> str:
    return "head" if pp < cutoffs[0] else "middle" if pp < cutoffs[1] else "tail"


class KenLM(ModelFilter):
    yaml_name = "kenlm"
    drop_reasons = ("perplexity_above_max", "perplexity_bucket_<bucket>")
    output_fields = {"perplexity": pa.float64(), "perplexity_bucket": pa.string()}
    score_field = "perplexity"
    thresholds = (Threshold("max_perplexity", "max", score=True),)
    score_bins = {"scale": "log", "lo": 0.0, "hi": 5.0, "n": 25}  # perplexity 1 to 100,000

    class Config(FilterConfig):
        # models and bucket cut-offs are per language already; only the threshold varies
        language_fixed: ClassVar[tuple[str, ...]] = ("models", "default_language", "cutoffs", "keep_buckets")

        models: dict[str, str] = Field(
            {"en": "models/kenlm/en.arpa.bin"}, description="language -> KenLM .arpa or binary"
        )
        default_language: str | None = Field(None, description="language of documents without langid's `language`")
        max_perplexity: float | None = Field(None, gt=0, description="drop documents with a higher perplexity")
        keep_buckets: list[Literal["head", "middle", "tail"]] | None = Field(None, description="CCNet buckets to keep")
        cutoffs: dict[str, tuple[float, float]] | None = Field(
            None, description="[head, middle] cut-offs per language (default: the model's .stats.json)"
        )

        @field_validator("models")
        @classmethod
        def _not_empty(cls, models):
            if not models:
                raise ValueError("empty; give at least one `language: path`")
            return models

        @field_validator("cutoffs")
        @classmethod
        def _ordered(cls, cutoffs):
            for lang, (head, middle) in (cutoffs or {}).items():
                if not head <= middle:
                    raise ValueError(f"{lang}: expected [head, middle] with head <= middle, got {[head, middle]}")
            return cutoffs

    def __init__(self, config: Config | None = None, /, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        # Validated now, in the planning process, so a bad model fails the run before any
        # document is read.
        self.checked = {lang: check_kenlm(p) for lang, p in c.models.items()}
        self.model_paths = {lang: checked.path for lang, checked in self.checked.items()}
        self.default_language = c.default_language
        self.max_perplexity = c.max_perplexity
        self.keep_buckets = set(c.keep_buckets) if c.keep_buckets is not None else None
        self.cutoffs: dict[str, tuple[float, float]] = {}
        for lang, path in self.model_paths.items():
            given = (c.cutoffs or {}).get(lang)
            cut = (float(given[0]), float(given[1])) if given else read_cutoffs(self.checked[lang].source or path)
            if cut is None and self.keep_buckets is not None:
                raise ModelError(
                    f"kenlm.keep_buckets needs bucket cut-offs for {lang!r}: {stats_path(path)} is "
                    f"missing (written by `pipeline kenlm train`); or give `cutoffs: {{{lang}: [a, b]}}`"
                )
            if cut is not None:
                self.cutoffs[lang] = cut

    #: a (score, length) pair per line, and one normalised piece at a time (measured: 8, 31 and
    #: 83 MB over 2, 8 and 30 MB pages)
    document_factor = 2.5
    document_fixed = 16 << 20

    def load_model(self) -> dict:
        return {lang: load_kenlm(c) for lang, c in self.checked.items()}

    @property
    def models(self) -> dict:
        """KenLM models by language."""
        return self.model

    def language_of(self, doc: Document) -> str | None:
        return doc.metadata.get("language") or self.default_language

    def filter(self, doc: Document, config: Config) -> FilterResult:
        lang = self.language_of(doc)
        model = self.models.get(lang) if lang else None
        if model is None:
            self.stat_update(f"no_model_{lang or 'unknown'}")
            return True
        pp = perplexity(score_lines(model, doc.text))
        if pp is None:
            self.stat_update("no_text")
            return True
        doc.metadata["perplexity"] = pp
        cut = self.cutoffs.get(lang)
        b = bucket(pp, cut) if cut else None
        if b:
            doc.metadata["perplexity_bucket"] = b
            self.stat_update(f"bucket_{b}")
        if config.max_perplexity is not None and pp > config.max_perplexity:
            return False, "perplexity_above_max"
        if self.keep_buckets is not None and b not in self.keep_buckets:
            return False, f"perplexity_bucket_{b}"
        return True
