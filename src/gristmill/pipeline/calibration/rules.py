"""What every calibration file keeps to, whatever its source (`pipeline calibrate` from reference
text, or from FineWeb-2's thresholds), and the file's layout.

A calibration sets each language's bounds from a few dozen documents (UDHR) or from another
pipeline's tokenizers and text (FineWeb-2): where its evidence is thin, a bound comes out where
no clean page could trip it, or in an order no statistic has. `guard_table` holds a table to
these rules and names each value it changes or leaves out:

* [n, bound] lists fall as n rises (top_n_grams, dup_n_grams);
* a top-n-gram bound is at most MAX_TOP_NGRAM, a letter-share bound at least MIN_LETTER_SHARE;
* a value that is no threshold (null, NaN, negative) is left out, and so is one that switches
  its rule off (0; a share's `max` bound of 1 or more; a mean word length of at most 1) unless
  asked (`--allow-off`): the language then keeps the step's default;
* no rule that no page could pass: `min_stop_words` at most the distinct words of the
  language's `stop_words` (an empty list left out), a lower bound (`min_doc_words`,
  `min_avg_word_length`) at most its upper bound (both left out otherwise).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import yaml

from gristmill.core.step import registered_steps
from gristmill.filters.c4_lines import C4Lines
from gristmill.filters.gopher_quality import GopherQuality
from gristmill.filters.gopher_repetition import GopherRepetition

__all__ = [
    "BOUNDS",
    "FINEWEB_QUALITY_DEFAULTS",
    "MAX_TOP_NGRAM",
    "MIN_LETTER_SHARE",
    "STEP_DEFAULTS",
    "Change",
    "changes_comment",
    "comment",
    "default_value",
    "dump_table",
    "grouped_changes",
    "guard_table",
    "not_a_threshold",
    "prune_defaults",
    "switches_off",
]

#: the Configs whose defaults calibrated values replace
STEP_DEFAULTS = {
    "gopher_quality": GopherQuality.Config(),
    "gopher_repetition": GopherRepetition.Config(),
    "c4_lines": C4Lines.Config(),
}

#: each threshold a calibration file may carry: (`min` or `max` bound, whether its statistic is
#: a share, 0 to 1); what is not here (a stop-word list) is no threshold
BOUNDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("gopher_quality", "min_doc_words"): ("min", False),
    ("gopher_quality", "max_doc_words"): ("max", False),
    ("gopher_quality", "min_avg_word_length"): ("min", False),
    ("gopher_quality", "max_avg_word_length"): ("max", False),
    ("gopher_quality", "max_non_alpha_words_ratio"): ("min", True),  # the least share of words with a letter
    ("gopher_quality", "min_stop_words"): ("min", False),
    ("gopher_quality", "max_bullet_lines_ratio"): ("max", True),
    ("gopher_quality", "max_ellipsis_lines_ratio"): ("max", True),
    ("gopher_repetition", "dup_line_frac"): ("max", True),
    ("gopher_repetition", "dup_para_frac"): ("max", True),
    ("gopher_repetition", "dup_line_char_frac"): ("max", True),
    ("gopher_repetition", "dup_para_char_frac"): ("max", True),
    ("gopher_repetition", "top_n_grams"): ("max", True),
    ("gopher_repetition", "dup_n_grams"): ("max", True),
    ("c4_lines", "min_words_per_line"): ("min", False),
    ("c4_lines", "min_num_sentences"): ("min", False),
    ("fineweb_quality", "line_punct_thr"): ("min", True),
    ("fineweb_quality", "short_line_thr"): ("max", True),
    ("fineweb_quality", "char_duplicates_ratio"): ("max", True),
    ("fineweb_quality", "new_line_ratio"): ("max", False),  # newlines per word: may exceed 1
}

# --- what every calibration file keeps to ----------------------------------------------
#
# A calibration sets each language's bounds from a few dozen documents (UDHR) or from another
# pipeline's tokenizers and text (FineWeb-2): where its evidence is thin, a bound comes out
# where no clean page could trip it, or in an order no statistic has. Whatever its source, a
# calibration file written here keeps to these rules; each value they change is named.

#: the loosest bound on the share of a document's characters in its most common n-gram: at
#: 0.5, half a page would be one phrase repeated; above, the rule is off in all but name
#: (English's bounds are 0.2, 0.18, 0.16; UDHR gave Georgian 0.68 for 2-grams, and FineWeb-2
#: 0.5 to 1.6 to 59 of the lid.176 languages, mostly of little text)
MAX_TOP_NGRAM = 0.5
#: the loosest bound on the share of words holding a letter: below half, a page of numbers and
#: symbols passes (English's is 0.8; FineWeb-2's lowest for a lid.176 language is 0.59; UDHR
#: gave Maithili 0.25)
MIN_LETTER_SHARE = 0.5
#: the parameters holding `[n, bound]` pairs: the statistic falls as n rises (repeated 10-grams
#: are made of repeated 5-grams; the most common 4-gram is rarer than the most common 2-gram
#: by more than it is longer), so a bound above the one for a shorter n only says how thin
#: the evidence was
NGRAM_PARAMS = ("top_n_grams", "dup_n_grams")

#: datatrove's FineWebQualityFilter defaults (FineWeb's English ones): a calibration file may
#: carry `fineweb_quality` values, and leaves out those equal to these
FINEWEB_QUALITY_DEFAULTS: dict[str, float | int | bool] = {
    "line_punct_thr": 0.12,
    "line_punct_exclude_zero": False,
    "short_line_thr": 0.67,
    "short_line_length": 30,
    "char_duplicates_ratio": 0.01,
    "new_line_ratio": 0.3,
}


def not_a_threshold(value) -> str | None:
    """Why `value` is no threshold at all (null, NaN, infinite, negative), or None."""
    if value is None:
        return "null is no threshold"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return f"{value} is no threshold"
    return None


def switches_off(step: str, param: str, value: float) -> str | None:
    """Why `value` of `step.param` would switch its rule off (the rule could never fire), or None."""
    bound = BOUNDS.get((step, param))
    if bound is None:
        return None
    if value == 0:
        return "0 switches the rule off"
    kind, share = bound
    if kind == "max" and share and value >= 1:
        return "a share never exceeds 1: the rule would never fire"
    if (step, param) == ("gopher_quality", "min_avg_word_length") and value <= 1:
        return "no word is shorter than one character: the rule would never fire"
    return None


@dataclass(frozen=True)
class Change:
    """A value of a calibration table that `guard_table` changed (`new`) or left out (None)."""

    step: str
    language: str
    param: str
    n: int | None
    old: float
    new: float | None
    why: str


def _guard_ngrams(step: str, lang: str, param: str, pairs: list, allow_off: bool, changes: list[Change]) -> list:
    default = {n: v for n, v in default_value(step, param) or ()}
    out, floor = [], math.inf
    for n, v in sorted((list(p) for p in pairs), key=lambda p: p[0]):
        # a top-n-gram bound above the cap (at 1 or more, one that never fires) is capped, not
        # dropped: it says the language's text repeats more than English's, up to a point
        if param == "top_n_grams" and not_a_threshold(v) is None and v > MAX_TOP_NGRAM:
            changes.append(Change(step, lang, param, n, v, MAX_TOP_NGRAM, f"above {MAX_TOP_NGRAM}, the loosest bound"))
            v = MAX_TOP_NGRAM
        why = not_a_threshold(v) or (None if allow_off else switches_off(step, param, v))
        if why is not None:
            if n not in default:
                changes.append(Change(step, lang, param, n, v, None, why))
                continue
            changes.append(Change(step, lang, param, n, v, default[n], f"{why}; the default instead"))
            v = default[n]
        if v > floor:
            changes.append(Change(step, lang, param, n, v, floor, "above the bound of a shorter n-gram"))
            v = floor
        floor = v
        out.append([n, v])
    return out


def guard_table(table: dict, allow_off: bool = False) -> tuple[dict, list[Change]]:
    """`table` (a calibration file's `{step: {per_language: {lang: {param: value}}}}`) held to the
    rules above, and what was changed: [n, bound] lists falling with n, top-n-gram bounds at
    most MAX_TOP_NGRAM, letter-share bounds at least MIN_LETTER_SHARE, values that are no
    threshold left out, and so are those that switch a rule off unless `allow_off`."""
    changes: list[Change] = []
    out: dict = {}
    for step, section in table.items():
        per = out.setdefault(step, {"per_language": {}})["per_language"]
        for lang, params in section["per_language"].items():
            kept = per.setdefault(lang, {})
            for param, value in params.items():
                if param in NGRAM_PARAMS and isinstance(value, list):
                    kept[param] = _guard_ngrams(step, lang, param, value, allow_off, changes)
                    continue
                if BOUNDS.get((step, param)) is None:
                    kept[param] = value
                    continue
                why = not_a_threshold(value) or (None if allow_off else switches_off(step, param, value))
                if why is not None:
                    changes.append(Change(step, lang, param, None, value, None, why))
                    continue
                if (step, param) == ("gopher_quality", "max_non_alpha_words_ratio") and value < MIN_LETTER_SHARE:
                    changes.append(
                        Change(
                            step,
                            lang,
                            param,
                            None,
                            value,
                            MIN_LETTER_SHARE,
                            f"below {MIN_LETTER_SHARE}, the loosest bound",
                        )
                    )
                    value = MIN_LETTER_SHARE
                kept[param] = value
            _guard_satisfiable(step, lang, kept, changes)
    return out, changes


#: (lower bound, upper bound) of one statistic: a lower above the upper is a rule no page passes
_RANGES = (("min_doc_words", "max_doc_words"), ("min_avg_word_length", "max_avg_word_length"))


def _guard_satisfiable(step: str, lang: str, kept: dict, changes: list[Change]) -> None:
    """A language's values that together no page could satisfy, made satisfiable: a stop-word rule
    asking for more distinct stop words than its list holds is lowered to the list's (FineWeb-2's
    Tibetan list keeps one word that gristmill's tokenizer leaves whole; it asks for 2); an empty
    list is left out (the language's own list, or none, applies); a lower bound above its upper
    bound leaves both out (the defaults apply). Each is a Change, named in the file and on the
    console."""
    if step != "gopher_quality":
        return
    words = kept.get("stop_words")
    if isinstance(words, list):
        distinct = len(set(words))
        least = kept.get("min_stop_words", default_value(step, "min_stop_words"))
        if distinct == 0:
            del kept["stop_words"]
            why = "an empty list: no page could hold one of its words; the language's own list, if any, applies"
            changes.append(Change(step, lang, "stop_words", None, 0, None, why))
        elif least is not None and least > distinct:
            why = f"more than the {distinct} distinct words of its stop_words: no page could pass"
            changes.append(Change(step, lang, "min_stop_words", None, least, distinct, why))
            kept["min_stop_words"] = distinct
    for lo_key, hi_key in _RANGES:
        lo = kept.get(lo_key, default_value(step, lo_key))
        hi = kept.get(hi_key, default_value(step, hi_key))
        if lo is None or hi is None or lo <= hi or (lo_key not in kept and hi_key not in kept):
            continue
        for key, value in ((lo_key, lo), (hi_key, hi)):
            if key in kept:
                why = f"{lo_key} {lo:g} above {hi_key} {hi:g}: no page could pass"
                changes.append(Change(step, lang, key, None, value, None, why))
                del kept[key]


def comment(text: str, indent: str = "") -> str:
    """`text` as YAML comment lines of at most ~110 characters."""
    lines = textwrap.wrap(text, 108 - len(indent), break_long_words=False, break_on_hyphens=False)
    return "".join(f"# {indent}{line}\n" if i == 0 else f"# {indent}  {line}\n" for i, line in enumerate(lines))


def grouped_changes(changes: list[Change]) -> list[str]:
    """One line per (key, reason), listing its languages and values."""
    groups: dict[tuple, list[Change]] = {}
    for c in changes:
        reason = c.why if c.new is None else c.why.split(";")[0]
        groups.setdefault((c.step, c.param, c.n, c.new is None, reason), []).append(c)
    out = []
    for (step, param, n, left_out, reason), group in groups.items():
        key = f"{step}.{param}" + (f"[{n}]" if n else "")
        what = "left out (the default applies)" if left_out else "changed"
        values = ", ".join(
            f"{c.language} {c.old:g}" + ("" if left_out else f"->{c.new:g}")
            for c in sorted(group, key=lambda c: c.language)
        )
        out.append(f"{key} {what}, {reason} ({len(group)}): {values}")
    return out


def changes_comment(changes: list[Change]) -> str:
    return "".join(comment(line, "  ") for line in grouped_changes(changes))


def dump_table(table: dict) -> str:
    """A calibration table as YAML: [n, bound] pairs and stop-word lists on a line or a few."""
    return yaml.safe_dump(table, sort_keys=True, allow_unicode=True, default_flow_style=None, width=110)


_NO_DEFAULT = object()


def default_value(step: str, param: str):
    """A step's default for `param` as YAML holds it (tuples as lists), or None if unknown."""
    if step in STEP_DEFAULTS:
        value = getattr(STEP_DEFAULTS[step], param, _NO_DEFAULT)
    elif step == "fineweb_quality" and step not in registered_steps():
        value = FINEWEB_QUALITY_DEFAULTS.get(param, _NO_DEFAULT)
    else:
        cls = registered_steps().get(step)
        field = getattr(getattr(cls, "Config", None), "model_fields", {}).get(param)
        value = field.get_default(call_default_factory=True) if field is not None else _NO_DEFAULT
    if value is _NO_DEFAULT:
        return None
    if isinstance(value, (list, tuple)):
        return [list(v) if isinstance(v, (list, tuple)) else v for v in value]
    return value


def prune_defaults(table: dict) -> dict:
    """`table` without the values equal to their step's default, nor the languages and steps
    left empty: a calibration file holds what differs from the defaults."""
    out: dict = {}
    for step, section in table.items():
        per = {}
        for lang, params in section["per_language"].items():
            kept = {p: v for p, v in params.items() if v != default_value(step, p)}
            if kept:
                per[lang] = kept
        if per:
            out[step] = {"per_language": per}
    return out
