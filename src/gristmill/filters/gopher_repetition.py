"""Gopher's repetition rules (Rae et al. 2021, table A1), as datatrove's GopherRepetitionFilter:
same parameters, defaults, order of rules, drop reasons and decisions.

datatrove's rules, including their quirks, which we keep so that decisions are identical:

* duplicate paragraphs/lines: an element counts (with its characters) once per repeat;
* top n-gram: the n-grams are `" ".join`ed; the most common one (the first seen among equally
  common ones) scores `len(joined) * count`;
* duplicate n-grams: scanning left to right, an n-gram already seen adds its characters and the
  scan jumps past it (the n-grams it overlaps are neither counted nor remembered); n-grams are
  joined WITHOUT spaces, so ("ab", "c") repeats ("a", "bc").

All fractions are of len(text). datatrove builds a string per n-gram and loops in Python once
per word for each n; we number the page's words once and count its n-grams in C
(`gristmill/native/ngrams.c`, `Words`), which compares candidates exactly (words for the
" ".join-ed n-grams, characters for the "".join-ed ones), so the counts are datatrove's.

Long pages (`CHUNK_CHARS` characters and more) are read a piece at a time: paragraphs and lines
as they come (only the distinct ones held), words into `Words` a piece at a time, without a list
of them all. What a page costs is then 4 bytes per word, its distinct words, and a rule's n-gram
table of up to 64 bytes per word (docs/scale.md "Large records"); the decisions are the whole
text's. A scan of repeated n-grams stops once its count breaks the rule (the count only grows).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from datatrove.data import Document
from pydantic import Field, field_validator

from gristmill.core.configlib import FilterConfig
from gristmill.core.filter import Filter, FilterResult
from gristmill.native._ngrams import Words
from gristmill.text.words import CHUNK_CHARS, line_chunks, split_lines, split_paragraphs, split_words, word_chunks

_NON_SPACE = re.compile(r"\S")
_PARAGRAPH_BREAK = re.compile(r"\n{2,}")  # as text.words.split_paragraphs


def _duplicates(parts: Iterable[str]) -> tuple[int, int, int]:
    """(elements, repeated elements, their characters): datatrove's find_duplicates, over the
    parts as they come (only the distinct ones are held)."""
    seen: set[str] = set()
    n = dups = dup_chars = 0
    for part in parts:
        n += 1
        if part in seen:
            dups += 1
            dup_chars += len(part)
        else:
            seen.add(part)
    return n, dups, dup_chars


def _paragraphs(text: str) -> Iterator[str]:
    """split_paragraphs(text), one paragraph at a time, without a stripped copy of the text."""
    m = _NON_SPACE.search(text)
    if m is None:
        yield ""
        return
    start, end = m.start(), len(text)
    while text[end - 1].isspace():  # str.strip's whitespace (re's \s is the same set)
        end -= 1
    for m in _PARAGRAPH_BREAK.finditer(text, start, end):
        yield text[start : m.start()]
        start = m.end()
    yield text[start:end]


def _lines(text: str) -> Iterator[str]:
    """split_lines(text), one line at a time: the "\\n"-split pieces, empty ones dropped but
    the first and the last, read a `line_chunks` piece at a time."""
    pending = None  # the last piece seen: yielded once it is known not to be the text's last
    first = True
    for chunk in line_chunks(text):
        parts = chunk.split("\n")
        if pending is not None:
            parts[0] = pending + parts[0]  # never: a chunk ends right after a newline
        pending = parts.pop()
        for part in parts:
            if first or part:
                yield part
            first = False
    yield pending


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

    #: the distinct paragraphs and lines, then `Words` (4 bytes a word, the distinct words, a
    #: rule's table of up to 64 bytes a word; ~6 bytes a word of text; measured with
    #: benchmarks/large_record_steps.py: 51, 133 and 401 MB over 2, 8 and 30 MB pages)
    document_factor = 12.0
    document_fixed = 72 << 20

    def filter(self, doc: Document, c: Config) -> FilterResult:
        language = doc.metadata.get("language")
        text = doc.text
        if not text:
            return False, "empty"
        n_chars = len(text)
        long = n_chars >= CHUNK_CHARS  # a long page: its parts a piece at a time, no list of them

        n, dups, dup_chars = _duplicates(_paragraphs(text) if long else split_paragraphs(text))
        if c.dup_para_frac and dups / n > c.dup_para_frac:
            return False, "dup_para_frac"
        if c.dup_para_char_frac and dup_chars / n_chars > c.dup_para_char_frac:
            return False, "dup_para_char_frac"

        n, dups, dup_chars = _duplicates(_lines(text) if long else split_lines(text))
        if c.dup_line_frac and dups / n > c.dup_line_frac:
            return False, "dup_line_frac"
        if c.dup_line_char_frac and dup_chars / n_chars > c.dup_line_char_frac:
            return False, "dup_line_char_frac"

        words = Words()
        if long:  # words as in gopher_quality, a piece at a time
            for chunk in word_chunks(text, language):
                words.add(chunk)
        else:
            words.add(split_words(text, language))
        for n, max_frac in c.top_n_grams:
            top_chars = words.top_chars(n)
            if top_chars is not None and top_chars / n_chars > max_frac:
                return False, f"top_{n}_gram"
        for n, max_frac in c.dup_n_grams:
            if words.repeated_chars(n, n_chars, max_frac) / n_chars > max_frac:
                return False, f"duplicated_{n}_n_grams"
        return True
