"""Text splitting shared by the heuristic filters: words, sentences, paragraphs and lines.

datatrove tokenizes words with spaCy (per language) and sentences with nltk punkt; on web
text spaCy takes >90% of the Gopher filters' time. We split with one precompiled regex each,
close enough to spaCy for the Gopher statistics (word counts, mean word length, share of
symbol and alphabetic words, stop words, n-gram repetition):

* a word is a run of letters, digits and combining marks, joined across internal apostrophes
  and hyphens ("don't", "state-of-the-art" are one word; spaCy splits them into "do" "n't"
  and "state" "-" "of" ...), or a number with internal "." or "," ("3.14", "1,000", as spaCy);
* every run of punctuation or symbols is one token ("...", "?!", "$"), so Gopher's "symbol
  words" exist as in spaCy's output (spaCy splits some runs such as "?!" further, and keeps
  URLs and e-mail addresses whole where we split them at their punctuation);
* Han, Hiragana and Katakana characters are one token each, as are Thai, Lao, Khmer and
  Myanmar letters (with their combining marks): these scripts write no spaces between words,
  and per-character counts keep length and repetition statistics meaningful, where a
  whitespace split would see a paragraph as one "word";
* whitespace is never a token (spaCy emits runs of extra spaces and newlines as tokens).

No token ever contains whitespace, which the repetition filter relies on (see there).
"""

from __future__ import annotations

import re

import regex
from datatrove.utils.text import PUNCTUATION_SET

__all__ = [
    "PUNCTUATION_SET",
    "PUNCTUATION_CHARS",
    "split_words",
    "split_sentences",
    "split_paragraphs",
    "split_lines",
]

#: every punctuation character as one string, for `word.strip(PUNCTUATION_CHARS)`: the result
#: is empty exactly when all of the word's characters are punctuation, tested at C speed.
PUNCTUATION_CHARS = "".join(sorted(PUNCTUATION_SET))

_IDEOGRAPHIC = r"\p{Han}\p{Hiragana}\p{Katakana}"
_SYLLABIC = r"\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}"
# letters, digits and marks of the scripts that separate words with spaces (V1 set difference)
_ALNUM = rf"[[\p{{L}}\p{{N}}\p{{M}}]--[{_IDEOGRAPHIC}{_SYLLABIC}]]"

_WORD = regex.compile(
    rf"""
      [{_IDEOGRAPHIC}]
    | [{_SYLLABIC}]\p{{M}}*
    | \p{{Nd}}+(?:[.,]\p{{Nd}}+)+
    | {_ALNUM}+(?:['’\-]{_ALNUM}+)*
    | [^\s\p{{L}}\p{{N}}\p{{M}}]+
    """,
    regex.V1 | regex.VERBOSE,
)

# A sentence ends at "." "!" or "?" (repeated, possibly followed by closing quotes or
# brackets) when whitespace and then a capital letter (possibly after opening quotes or
# brackets) follow; the end of the text ends the last one. punkt also knows abbreviations
# ("Mr. Smith" is one sentence to it, two here) and splits "end. next" less predictably, so
# sentence counts may differ from datatrove's by a few; C4 uses them only for its
# min-sentences rule.
_SENTENCE_BREAK = regex.compile(r"[.!?]+[\"'”’)\]]*(\s+)(?=[\"'“‘(\[]*\p{Lu})")

_PARAGRAPH_BREAK = re.compile(r"\n{2,}")
_LINE_BREAK = re.compile(r"\n+")


def split_words(text: str) -> list[str]:
    """Words and punctuation/symbol tokens of `text` (see the module docstring)."""
    return _WORD.findall(text)


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, stripped; [] for blank text."""
    text = text.strip()
    if not text:
        return []
    sentences, start = [], 0
    for m in _SENTENCE_BREAK.finditer(text):
        sentences.append(text[start : m.start(1)])
        start = m.end(1)
    sentences.append(text[start:])
    return sentences


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs as Gopher's repetition rules see them (datatrove: split on 2+ newlines)."""
    return _PARAGRAPH_BREAK.split(text.strip())


def split_lines(text: str) -> list[str]:
    """Lines as Gopher's repetition rules see them (datatrove: split on newline runs)."""
    return _LINE_BREAK.split(text)
