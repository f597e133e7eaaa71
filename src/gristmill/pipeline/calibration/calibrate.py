"""`pipeline calibrate`: thresholds of the heuristic filters for other languages, FineWeb-2's way.

For each threshold rule of `gopher_quality`, `gopher_repetition` and `c4_lines`, the English
default removes some share p of English reference text; for another language, the threshold
is the one that removes the same share p of that language's reference text (a quantile of the
rule's statistic over its documents). Where the English default removes none of the English
reference (clean text rarely trips a rule), there is no quantile to match: the language's
threshold is the English one scaled by the ratio of the two medians of the statistic (Chinese
words are shorter than English ones: so is the bound on their mean length), then loosened, if
need be, until it removes none of the language's reference either.

The reference text is the Universal Declaration of Human Rights (`udhr2.zip`: one file per
language) cut at its blank lines into its preamble and articles: ~30 documents per language,
the same content in every language, so only the language differs between the two sides of a
comparison. That is thin: a share is known to 1/30 at best; rules whose statistic reflects
the length of a document (fewest/most words) are not calibrated, because a chunk's length is
an artefact of the cutting. Other reference text (one file per language, cut at blank lines)
may be given with `--reference LANG=FILE`, and English text (e.g. WikiText) with `--english`.

Writes the `calibration:` file of a run config: `{step: {per_language: {lang: {param: value}}}}`,
holding only the values that differ from the English defaults. A threshold that would switch
its rule off (unless `--allow-off`), or remove most of its own reference (`MAX_REMOVED_SHARE`),
is never written: a `--reference` file giving one is refused, a UDHR file's odd value is left
out and named. The table is then held to calibration_rules' rules (n-gram bounds falling with
n, top-n-gram bounds at most 0.5, letter-share bounds at least 0.5), each change named.
Reference files are read to a bound (`--max-reference-mb`), and only regular files are read.

`--from-fineweb2 [DIR]` writes FineWeb-2's thresholds instead (fineweb2_calibration.py).
The command itself (arguments, reading the reference files, the summary) is calibrate_cli.py.
"""

from __future__ import annotations

import functools
import math
import statistics
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gristmill.core.configlib import ConfigError
from gristmill.core.filter import Filter, Threshold
from gristmill.core.step import registered_steps
from gristmill.pipeline.calibration.rules import (
    STEP_DEFAULTS,
    not_a_threshold,
    switches_off,
)

__all__ = ["RULES", "UDHR_FILES", "Rule", "calibrate", "chunks", "read_udhr", "refusal"]

#: lid.176 label -> the UDHR file (ISO 639-3 name, in udhr2.zip) of that language
UDHR_FILES = {
    "af": "afr",
    "am": "amh",
    "ar": "arb",
    "ast": "ast",
    "az": "azj_latn",
    "bcl": "bcl",
    "be": "bel",
    "bg": "bul",
    "bn": "ben",
    "bo": "bod",
    "br": "bre",
    "bs": "bos_latn",
    "ca": "cat",
    "ceb": "ceb",
    "ckb": "ckb",
    "co": "cos",
    "cs": "ces",
    "cy": "cym",
    "da": "dan",
    "de": "deu",
    "dv": "div",
    "el": "ell_monotonic",
    "eml": "eml",
    "en": "eng",
    "eo": "epo",
    "es": "spa",
    "et": "est",
    "eu": "eus",
    "fa": "pes_1",
    "fi": "fin",
    "fr": "fra",
    "fy": "fri",
    "ga": "gle",
    "gd": "gla",
    "gl": "glg",
    "gn": "gug",
    "gu": "guj",
    "he": "heb",
    "hi": "hin",
    "hr": "hrv",
    "hsb": "hsb",
    "ht": "hat_kreyol",
    "hu": "hun",
    "hy": "hye",
    "ia": "ina",
    "id": "ind",
    "ilo": "ilo",
    "io": "ido",
    "is": "isl",
    "it": "ita",
    "ja": "jpn",
    "jv": "jav",
    "ka": "kat",
    "kk": "kaz",
    "km": "khm",
    "kn": "kan",
    "ko": "kor",
    "ky": "kir",
    "la": "lat",
    "lb": "ltz",
    "lo": "lao",
    "lt": "lit",
    "lv": "lav",
    "mai": "mai",
    "mg": "plt",
    "min": "min",
    "mk": "mkd",
    "ml": "mal",
    "mn": "khk",
    "mr": "mar",
    "ms": "mly_latn",
    "mt": "mlt",
    "my": "mya",
    "nds": "nds",
    "ne": "nep",
    "nl": "nld",
    "nn": "nno",
    "no": "nob",
    "oc": "prv",
    "os": "oss",
    "pa": "pan",
    "pam": "pam",
    "pl": "pol",
    "pnb": "pnb",
    "ps": "pbu",
    "pt": "por_PT",
    "qu": "quz",
    "rm": "roh",
    "ro": "ron",
    "ru": "rus",
    "sa": "san",
    "sah": "sah",
    "sco": "sco",
    "sk": "slk",
    "sl": "slv",
    "so": "som",
    "sq": "als",
    "sr": "srp_cyrl",
    "su": "sun",
    "sv": "swe",
    "sw": "swh",
    "ta": "tam",
    "tg": "tgk",
    "th": "tha",
    "tk": "tuk_latn",
    "tl": "tgl",
    "tr": "tur",
    "tt": "tat",
    "tyv": "tyv",
    "ug": "uig_arab",
    "uk": "ukr",
    "ur": "urd",
    "uz": "uzn_latn",
    "vec": "vec",
    "vep": "vep",
    "vi": "vie",
    "wa": "wln",
    "war": "war",
    "yi": "ydd",
    "yo": "yor",
    "zh": "cmn_hans",
}


# --- the statistic each rule thresholds: the filter's own ------------------------------


#: the filters calibrated: their thresholds and statistics are their own (`Filter.thresholds`,
#: `Filter.statistics`), computed here by the code each filter decides with
CALIBRATED_STEPS = ("gopher_quality", "gopher_repetition", "c4_lines")


@functools.cache
def _filter(step: str) -> Filter:
    return registered_steps()[step]()  # the step with its defaults: the English thresholds


@functools.lru_cache(maxsize=4096)  # every rule of a step asks for the same document's statistics
def _statistics(step: str, text: str, lang: str) -> dict:
    return _filter(step).statistics(text, lang, STEP_DEFAULTS[step])


@dataclass(frozen=True)
class Rule:
    """One threshold of a calibrated filter: its parameter, whether documents (or lines) below
    (`min`) or above (`max`) it are removed (`Threshold`), and the statistic it is compared with."""

    step: str
    threshold: Threshold

    param = property(lambda self: self.threshold.param)
    kind = property(lambda self: self.threshold.kind)
    n = property(lambda self: self.threshold.n)
    integer = property(lambda self: self.threshold.integer)
    lines = property(lambda self: self.threshold.lines)
    length = property(lambda self: self.threshold.length)

    @property
    def name(self) -> str:
        return f"{self.step}.{self.threshold.name}"

    def default(self):
        return self.threshold.value(STEP_DEFAULTS[self.step])

    def stat(self, text: str, lang: str) -> float | None | list[float]:
        return _statistics(self.step, text, lang)[self.threshold.name]


def _on_by_default(rule: Rule) -> bool:
    value = rule.default()
    return value is not None and value > 0 and switches_off(rule.step, rule.param, value) is None


#: every threshold of the calibrated filters that their English defaults switch on
RULES: tuple[Rule, ...] = tuple(
    rule
    for step in CALIBRATED_STEPS
    for rule in (Rule(step, t) for t in registered_steps()[step].thresholds)
    if _on_by_default(rule)
)


# --- reference text --------------------------------------------------------------------


def chunks(text: str) -> list[str]:
    """Documents of a reference text: its blocks between its least indented blank lines (a text
    file: between empty lines; UDHR: the preamble and each article, whose numbered paragraphs
    are separated by blank lines indented deeper), lines stripped of their indentation."""
    lines = text.splitlines()
    blanks = sorted({len(line) for line in lines if not line.strip()})
    out: list[str] = []
    # some UDHR files indent otherwise: deeper blank lines too, until there are enough blocks
    for outer in blanks or [0]:
        out, block = [], []
        for line in lines + [""]:
            if line.strip():
                block.append(line.strip())
            elif len(line) <= outer and block:
                out.append("\n".join(block))
                block = []
        if len(out) >= MIN_CHUNKS:
            break
    return out


#: languages with fewer reference documents than this are not calibrated
MIN_DOCUMENTS = 10
#: a reference cut into fewer blocks than this at its outer blank lines is cut at deeper ones
MIN_CHUNKS = 20


def read_udhr(path: Path, languages: list[str] | None, max_bytes: int) -> dict[str, str]:
    """{lid.176 label: UDHR text} for the languages of `UDHR_FILES` (or those asked) in the zip;
    a member over `max_bytes` (uncompressed: a zip bomb) is refused, naming it."""
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        out = {}
        for lang, code in UDHR_FILES.items():
            if languages is not None and lang not in languages and lang != "en":
                continue
            name = f"udhr2/{code}.txt"
            if name in names:
                with z.open(name) as f:  # read to the bound, whatever the member's header claims
                    data = f.read(max_bytes + 1)
                if len(data) > max_bytes:
                    raise ConfigError(
                        f"--udhr {path}: {name} is over --max-reference-mb ({max_bytes >> 20} MB uncompressed)"
                    )
                try:
                    out[lang] = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ConfigError(f"--udhr {path}: {name} is not UTF-8 text ({e})") from None
        return out


# --- matching --------------------------------------------------------------------------


def _values(rule: Rule, docs: list[str], lang: str) -> list[float]:
    out: list[float] = []
    for doc in docs:
        v = rule.stat(doc, lang)
        if isinstance(v, list):
            out.extend(v)
        elif v is not None:
            out.append(v)
    return out


def removed_share(rule: Rule, values: list[float], threshold: float) -> float:
    if not values:
        return 0.0
    if rule.kind == "min":
        return sum(v < threshold for v in values) / len(values)
    return sum(v > threshold for v in values) / len(values)


def match(rule: Rule, english: list[float], other: list[float], threshold: float) -> tuple[float, float]:
    """(the language's threshold, the share p of English reference the default removes)."""
    p = removed_share(rule, english, threshold)
    s = sorted(other)
    k = min(round(p * len(s)), len(s) - 1)  # documents of the language to remove
    med_en, med = statistics.median(english), statistics.median(s)
    # a ratio of medians where both are positive: a statistic that is 0 on most documents (a
    # share of repeated lines) says nothing of the language, and a threshold of 0 turns a
    # rule off
    scaled = threshold * med / med_en if med_en > 0 and med > 0 else threshold
    if rule.length:
        t = scaled
    elif k > 0:
        if rule.kind == "min":  # remove the k smallest: a threshold between s[k-1] and s[k]
            t = s[k] if rule.integer else (s[k - 1] + s[k]) / 2
        else:  # remove the k largest
            j = len(s) - 1 - k
            t = s[j] if rule.integer else (s[j] + s[j + 1]) / 2
            if t <= 0:  # fewer than k documents score above 0: remove those that do
                positive = [v for v in s if v > 0]
                t = positive[0] / 2 if positive else threshold
    else:  # as for English (or nearly: under half a document), the rule removes none of it
        t = min(scaled, s[0]) if rule.kind == "min" else max(scaled, s[-1])
    if rule.integer:
        t = max(1, math.floor(t)) if rule.kind == "min" else math.ceil(t)
    else:
        t = round(t, 4)
    return t, p


@dataclass
class Result:
    rule: Rule
    language: str
    default: float
    threshold: float
    english_share: float
    share: float  # of the language's reference the threshold removes
    documents: int


def calibrate(
    references: dict[str, list[str]], english: list[str], rules=RULES, progress: Callable[[str], None] | None = None
) -> list[Result]:
    """One Result per rule and language of `references` ({lid label: documents})."""
    results = []
    english_values = {rule: _values(rule, english, "en") for rule in rules}
    for lang, docs in sorted(references.items()):
        if lang == "en" or len(docs) < MIN_DOCUMENTS:  # no share is known from a handful
            continue
        if progress:
            progress(lang)
        for rule in rules:
            values = _values(rule, docs, lang)
            default = rule.default()
            if not values or not english_values[rule] or default is None:
                continue
            t, p = match(rule, english_values[rule], values, default)
            results.append(Result(rule, lang, default, t, p, removed_share(rule, values, t), len(docs)))
    return results


#: the largest share of a reference's documents a calibrated threshold may remove. Reference
#: text is clean text of its language: on UDHR the English defaults remove at most 19% of the
#: English articles (top_n_grams[4]), and the matched thresholds at most 21% of any language's.
#: One that removes more than half says the reference is not the text the rule was set for
#: (WikiText's `@-@` tokens fail the letter share in 93% of its paragraphs), not that the
#: language needs such a bound: matched, it would drop most of that language's clean pages.
MAX_REMOVED_SHARE = 0.5


def rule_key(rule: Rule, language: str) -> str:
    """The key of a threshold in the calibration file (an n-gram rule: its pair of that n)."""
    return f"{rule.step}.per_language.{language}.{rule.param}" + (f" (n={rule.n})" if rule.n is not None else "")


def english_refusals(results: list[Result]) -> dict[Rule, str]:
    """{rule: why} for the rules whose English default removes more than MAX_REMOVED_SHARE of
    the English reference: no share of such a reference is worth matching, for any language
    (rules of a document's length are scaled, not matched, and not refused here)."""
    return {
        r.rule: f"the English default removes {r.english_share:.0%} of the English reference "
        f"(over {MAX_REMOVED_SHARE:.0%}): it is not the kind of text the default was set for"
        for r in results
        if not r.rule.length and r.english_share > MAX_REMOVED_SHARE
    }


def refusal(r: Result, allow_off: bool = False) -> str | None:
    """Why the calibrated threshold of `r` cannot be used (it would switch its rule off, unless
    `allow_off`, or drop most of the language's own reference), or None."""
    t = r.threshold
    why = not_a_threshold(t) or (None if allow_off else switches_off(r.rule.step, r.rule.param, t))
    if why is not None:
        return why
    if not r.rule.length and r.share > MAX_REMOVED_SHARE:
        return f"removes {r.share:.0%} of the {r.language} reference (over {MAX_REMOVED_SHARE:.0%})"
    return None


def calibration_table(results: list[Result]) -> dict:
    """The `calibration:` file: per step and language, the values that differ from the defaults."""
    table: dict[str, dict] = {}
    for r in results:
        if r.threshold == r.default:
            continue
        per = table.setdefault(r.rule.step, {"per_language": {}})["per_language"].setdefault(r.language, {})
        if r.rule.n is None:
            per[r.rule.param] = r.threshold
        else:
            pairs = per.setdefault(r.rule.param, [list(p) for p in getattr(STEP_DEFAULTS[r.rule.step], r.rule.param)])
            for pair in pairs:
                if pair[0] == r.rule.n:
                    pair[1] = r.threshold
    return table


# --- command line ----------------------------------------------------------------------
