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
* characters beyond U+FFFF (emoji, rare ideographs, historic scripts) are one token each;
* whitespace (str.isspace) is never part of a token; spaCy emits runs of extra spaces and
  newlines as tokens.

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


def _bmp_class(unicode_class: str) -> str:
    """The BMP members of a `regex` class (which knows Unicode scripts) as `re` class ranges.

    The stdlib `re` runs our pattern ~4x faster than `regex` does, but only for classes it can
    compile to a bitmap, which means no characters beyond U+FFFF (those become a linear list
    of ranges): hence their separate one-per-token rule above.
    """
    ranges = []
    for m in regex.finditer(unicode_class + "+", _BMP, flags=regex.V1):
        first, last = re.escape(m.group()[0]), re.escape(m.group()[-1])
        ranges.append(first if m.end() - m.start() == 1 else f"{first}-{last}")
    return "".join(ranges)


_BMP = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x10000)))
_IDEOGRAPHIC = r"[\p{Han}\p{Hiragana}\p{Katakana}]"
_SYLLABIC = r"[\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]"
IDEOGRAPHIC_CHARS = _bmp_class(_IDEOGRAPHIC)
SYLLABIC_CHARS = _bmp_class(_SYLLABIC)
_MARK = _bmp_class(r"\p{M}")
# letters, digits and marks of the scripts that separate words with spaces
_ALNUM = _bmp_class(rf"[[\p{{L}}\p{{N}}\p{{M}}]--{_IDEOGRAPHIC}--{_SYLLABIC}]")
ASTRAL_CHARS = "\U00010000-\U0010ffff"
del _BMP

WORD_TOKEN = re.compile(
    rf"""
      \d+(?:[.,]\d+)+
    | [{_ALNUM}]+(?:['’\-][{_ALNUM}]+)*
    | [^\s{_ALNUM}{IDEOGRAPHIC_CHARS}{SYLLABIC_CHARS}{ASTRAL_CHARS}]+
    | [{IDEOGRAPHIC_CHARS}{ASTRAL_CHARS}]
    | [{SYLLABIC_CHARS}][{_MARK}]*
    """,
    re.VERBOSE,
)

# A sentence ends at "." "!" or "?" (repeated, possibly followed by closing quotes or
# brackets) when whitespace and then a capital letter (possibly after opening quotes or
# brackets) follow; the end of the text ends the last one. punkt also knows abbreviations
# ("Mr. Smith" is one sentence to it, two here) and splits "end. next" less predictably, so
# sentence counts may differ from datatrove's by a few; C4 uses them only for its
# min-sentences rule.
_SENTENCE_BREAK = regex.compile(r"[.!?]+[\"'”’)\]]*(\s+)(?=[\"'“‘(\[]*\p{Lu})")

_PARAGRAPH_BREAK = re.compile(r"\n{2,}")

# The Gopher filters run one after the other on the same text: keep the last split. The text
# is held, so `is` cannot match a new string at a recycled address.
_last: tuple[str, list[str]] = ("", [])


def split_words(text: str) -> list[str]:
    """Words and punctuation/symbol tokens of `text` (see the module docstring).

    The list may be shared with the previous caller on the same text: do not modify it.
    """
    global _last
    last = _last
    if last[0] is text:
        return last[1]
    words = WORD_TOKEN.findall(text)
    _last = (text, words)
    return words


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
    text = text.strip()
    # WET text rarely has blank lines; "in" is much faster than a regex scan
    return _PARAGRAPH_BREAK.split(text) if "\n\n" in text else [text]


def split_lines(text: str) -> list[str]:
    """Lines as Gopher's repetition rules see them: re.split("\\n+", text), but at str.split
    speed (a run of newlines leaves empty strings between them, which we drop, except the
    first and last piece, which re.split keeps too)."""
    parts = text.split("\n")
    if len(parts) < 3:
        return parts
    return [parts[0], *filter(None, parts[1:-1]), parts[-1]]
