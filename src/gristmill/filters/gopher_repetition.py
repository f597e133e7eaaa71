"""Gopher's repetition rules (Rae et al. 2021, table A1), as datatrove's GopherRepetitionFilter:
same parameters, defaults, order of rules, drop reasons and decisions.

datatrove's rules, including their quirks, which we keep so that decisions are identical:

* duplicate paragraphs/lines: an element counts (with its characters) once per repeat;
* top n-gram: the n-grams are `" ".join`ed; the most common one (the first seen among equally
  common ones) scores `len(joined) * count`;
* duplicate n-grams: scanning left to right, an n-gram already seen adds its characters and the
  scan jumps past it (the n-grams it overlaps are neither counted nor remembered); n-grams are
  joined WITHOUT spaces, so ("ab", "c") repeats ("a", "bc").

All fractions are of len(text). datatrove builds a string per paragraph, line and n-gram and
loops in Python once per word for each n; we count in C (`gristmill/native/words.c`): the
paragraphs and lines in place (`paragraph_duplicates`, `line_duplicates`), the n-grams over the
page's numbered words (`page_words`, shared with gopher_quality), comparing candidates exactly
(words for the " ".join-ed n-grams, characters for the "".join-ed ones), so the counts are
datatrove's.

Long pages (`CHUNK_CHARS` characters and more): no list of their lines or words is made; the
words are numbered a piece at a time. What a page costs is then the distinct paragraphs' and
lines' positions, 28 bytes per word and its distinct words, and a rule's n-gram table of up to
64 bytes per word (docs/scale.md "Large records"); the decisions are the whole text's. A scan
of repeated n-grams stops once its count breaks the rule (the count only grows).
"""

from __future__ import annotations

import math

from datatrove.data import Document
from pydantic import Field, field_validator

from gristmill.core.configlib import FilterConfig
from gristmill.core.filter import Filter, FilterResult, Threshold
from gristmill.text.words import line_duplicates, page_words, paragraph_duplicates


class GopherRepetition(Filter):
    yaml_name = "gopher_repetition"
    drop_reasons = (
        "empty",
        "dup_para_frac",
        "dup_para_char_frac",
        "dup_line_frac",
        "dup_line_char_frac",
        "top_<n>_gram",
        "duplicated_<n>_n_grams",
    )

    class Config(FilterConfig):
        """Fractions, when null or 0, disable their rule (as in datatrove); the n-gram rules are
        [n, max fraction] pairs, applied in the order given."""

        dup_line_frac: float | None = Field(0.3, ge=0, description="most share of lines that repeat an earlier line")
        dup_para_frac: float | None = Field(0.3, ge=0, description="most share of paragraphs that repeat one")
        dup_line_char_frac: float | None = Field(0.2, ge=0, description="most share of characters in repeated lines")
        dup_para_char_frac: float | None = Field(
            0.2, ge=0, description="most share of characters in repeated paragraphs"
        )
        top_n_grams: tuple[tuple[int, float], ...] = Field(
            ((2, 0.2), (3, 0.18), (4, 0.16)), description="[n, most share of characters in the top n-gram]"
        )
        dup_n_grams: tuple[tuple[int, float], ...] = Field(
            ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)),
            description="[n, most share of characters in repeated n-grams]",
        )

        @field_validator("top_n_grams", "dup_n_grams")
        @classmethod
        def _positive_n(cls, rules):
            if any(n < 1 for n, _ in rules):
                raise ValueError("n-gram rules need n >= 1")
            if any(frac < 0 for _, frac in rules):  # a negative share drops every document
                raise ValueError("n-gram rules need a fraction >= 0")
            return rules

    thresholds = (
        Threshold("dup_line_frac", "max"),
        Threshold("dup_para_frac", "max"),
        Threshold("dup_line_char_frac", "max"),
        Threshold("dup_para_char_frac", "max"),
        *(Threshold("top_n_grams", "max", n=n) for n in (2, 3, 4)),
        *(Threshold("dup_n_grams", "max", n=n) for n in range(5, 11)),
    )

    #: the distinct paragraphs and lines, then `Words` (4 bytes a word, the distinct words, a
    #: rule's table of up to 64 bytes a word; ~6 bytes a word of text; measured with
    #: benchmarks/large_record_steps.py: 51, 133 and 401 MB over 2, 8 and 30 MB pages)
    document_factor = 12.0
    document_fixed = 72 << 20

    def statistics(self, text: str, language: str | None, c: Config) -> dict[str, float | None]:
        """Each rule's statistic, from the counts `filter` decides on; the repeated n-grams'
        share counted whole (`filter` stops a scan once its rule is broken)."""
        if not text:
            return {t.name: None for t in self.thresholds}
        n_chars = len(text)
        n_para, para_dups, para_chars = paragraph_duplicates(text)
        n_line, line_dups, line_chars = line_duplicates(text)
        words = page_words(text, language)
        out = {
            "dup_para_frac": para_dups / n_para,
            "dup_para_char_frac": para_chars / n_chars,
            "dup_line_frac": line_dups / n_line,
            "dup_line_char_frac": line_chars / n_chars,
        }
        for n in range(2, 5):
            top = words.top_chars(n)
            out[f"top_n_grams[{n}]"] = top / n_chars if top is not None else None
        for n in range(5, 11):
            out[f"dup_n_grams[{n}]"] = words.repeated_chars(n, n_chars, math.inf) / n_chars
        return out

    def filter(self, doc: Document, c: Config) -> FilterResult:
        language = doc.metadata.get("language")
        text = doc.text
        if not text:
            return False, "empty"
        n_chars = len(text)
        # datatrove's find_duplicates over split_paragraphs and split_lines, counted in place
        n, dups, dup_chars = paragraph_duplicates(text)
        if c.dup_para_frac and dups / n > c.dup_para_frac:
            return False, "dup_para_frac"
        if c.dup_para_char_frac and dup_chars / n_chars > c.dup_para_char_frac:
            return False, "dup_para_char_frac"

        n, dups, dup_chars = line_duplicates(text)
        if c.dup_line_frac and dups / n > c.dup_line_frac:
            return False, "dup_line_frac"
        if c.dup_line_char_frac and dup_chars / n_chars > c.dup_line_char_frac:
            return False, "dup_line_char_frac"

        words = page_words(text, language)  # as gopher_quality's (made once for both); long: a piece at a time
        for n, max_frac in c.top_n_grams:
            top_chars = words.top_chars(n)
            if top_chars is not None and top_chars / n_chars > max_frac:
                return False, f"top_{n}_gram"
        for n, max_frac in c.dup_n_grams:
            if words.repeated_chars(n, n_chars, max_frac) / n_chars > max_frac:
                return False, f"duplicated_{n}_n_grams"
        return True
