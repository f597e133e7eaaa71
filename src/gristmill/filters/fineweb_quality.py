"""FineWeb's own quality rules (Penedo et al. 2024, "The FineWeb Datasets",
https://arxiv.org/abs/2406.17557), as datatrove 0.10.1's FineWebQualityFilter (datatrove is the
library FineWeb was made with): same parameters, defaults, order of rules, drop reasons and
decisions, with our word splitter in the last rule.

FineWeb runs them after Gopher's repetition and quality rules and C4's line rules, the C4 rule
that drops lines without terminal punctuation switched off (`c4_lines:
{filter_no_terminal_punct: false}`; datatrove's examples/fineweb.py): the first rule below
replaces it at document level. A document without a non-blank line is dropped as `empty`; on
its non-blank lines (split on "\\n" only, not stripped):

* `line_punct_ratio`: fewer than `line_punct_thr` of the lines end with a terminal
  punctuation mark (datatrove's TERMINAL_PUNCTUATION, 159 marks of many scripts; earlier
  datatrove releases used . ' " ! ? only: give those as `stop_chars` for that behaviour); with
  `line_punct_exclude_zero`, a document none of whose lines ends so is kept by this rule;
* `short_line_ratio`: more than `short_line_thr` of the lines are at most `short_line_length`
  characters long;
* `char_dup_ratio`: the characters of the lines that repeat an earlier line (each repeat
  counted) are more than `char_duplicates_ratio` of the document's characters other than "\\n";
* `list_ratio`: the document has more than `new_line_ratio` newlines per word.

Words are our `split_words` (the page's language's), where datatrove counts spaCy's tokens
(English: `spacy.blank("en")`, no model download). The two counts differ ("don't" is one word to
us, two to spaCy; spaCy keeps a URL whole where we split it at its punctuation), so a page near
the threshold may be decided differently: tests/filters/test_fineweb_quality.py compares every
English page of the sample and explains each page where the decisions differ.

Faster than datatrove's in three ways: the line rules are counted with C-level map/sum instead of
generators (the terminal-mark test is one set lookup of a line's last character, as every mark
is one character); the duplicated characters come from a set, as in gopher_repetition; and the
words are counted only when it can matter: a page has at least as many words as
whitespace-separated chunks (no word holds whitespace, and every chunk holds one), so a page whose
newlines per chunk are within the limit is within it per word too, and is kept without splitting.
"""

from __future__ import annotations

from operator import methodcaller

from datatrove.data import Document
from datatrove.utils.text import TERMINAL_PUNCTUATION
from pydantic import Field

from gristmill.core.configlib import FilterConfig, Fraction
from gristmill.core.filter import Filter, FilterResult
from gristmill.text.words import split_words

_last_char = methodcaller("__getitem__", -1)


class FineWebQuality(Filter):
    yaml_name = "fineweb_quality"
    drop_reasons = ("empty", "line_punct_ratio", "short_line_ratio", "char_dup_ratio", "list_ratio")
    #: the page's non-blank lines and its words, as lists of strings, all at once (measured:
    #: 28, 104 and 427 MB over pages of 2, 8 and 30 MB, docs/scale.md "Large records")
    document_factor = 15.0
    document_fixed = 4 << 20

    class Config(FilterConfig):
        """datatrove's parameter names and defaults, so that configs carry over."""

        line_punct_thr: Fraction = Field(
            0.12, description="least share of non-blank lines ending with terminal punctuation (0 disables)"
        )
        line_punct_exclude_zero: bool = Field(
            False, description="keep documents none of whose lines ends with terminal punctuation (by this rule)"
        )
        stop_chars: list[str] | None = Field(
            None,
            description="what counts as terminal punctuation at a line's end (default: datatrove's "
            "TERMINAL_PUNCTUATION, 159 marks of many scripts: . ! ? 。 ؟ । ...)",
        )
        short_line_thr: Fraction = Field(0.67, description="most share of lines that are short (1 disables)")
        short_line_length: int = Field(30, ge=0, description="a line this many characters long or shorter is short")
        char_duplicates_ratio: Fraction = Field(
            0.01, description="most share of characters (newlines not counted) in lines repeating an earlier line"
        )
        new_line_ratio: float = Field(0.3, ge=0, description="most newlines per word (words: split_words)")

    def __init__(self, config: Config | None = None, /, **kwargs):
        super().__init__(config, **kwargs)
        # the terminal marks as a set of characters, per stop_chars list (per_language may give one)
        self._marks: dict[tuple[str, ...] | None, frozenset[str] | tuple[str, ...]] = {}

    def marks_for(self, c: Config) -> frozenset[str] | tuple[str, ...]:
        """The terminal marks of `c`: a set of characters, or a tuple for `str.endswith` when
        one of them is longer than a character."""
        key = tuple(c.stop_chars) if c.stop_chars is not None else None
        marks = self._marks.get(key)
        if marks is None:
            given = TERMINAL_PUNCTUATION if key is None else key
            marks = frozenset(given) if all(len(m) == 1 for m in given) else tuple(given)
            self._marks[key] = marks
        return marks

    def filter(self, doc: Document, c: Config) -> FilterResult:
        text = doc.text
        lines = list(filter(str.strip, text.split("\n")))  # a blank line strips to "": dropped
        n_lines = len(lines)
        if not n_lines:
            return False, "empty"

        marks = self.marks_for(c)
        if isinstance(marks, frozenset):
            ending = sum(map(marks.__contains__, map(_last_char, lines)))
        else:
            ending = sum(map(methodcaller("endswith", marks), lines))
        ratio = ending / n_lines
        if ratio < c.line_punct_thr and not (ratio == 0 and c.line_punct_exclude_zero):
            return False, "line_punct_ratio"

        lengths = list(map(len, lines))
        if sum(map(c.short_line_length.__ge__, lengths)) / n_lines > c.short_line_thr:
            return False, "short_line_ratio"

        # each repeat of a line counts its characters (datatrove's find_duplicates): all lines'
        # characters minus those of the distinct lines
        distinct = set(lines)
        dup_chars = sum(lengths) - sum(map(len, distinct)) if len(distinct) < n_lines else 0
        newlines = text.count("\n")
        # non-blank lines hold a character other than "\n": never a division by zero
        if dup_chars / (len(text) - newlines) > c.char_duplicates_ratio:
            return False, "char_dup_ratio"

        # words >= whitespace-separated chunks: within the limit per chunk, within it per word
        if not newlines or newlines / len(text.split()) <= c.new_line_ratio:
            return True
        n_words = len(split_words(text, doc.metadata.get("language")))
        # a page with non-blank lines has a word (a token for every non-space character)
        if newlines / n_words > c.new_line_ratio:
            return False, "list_ratio"
        return True
