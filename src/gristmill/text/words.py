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
  Myanmar letters (with their combining marks), unless the page is labelled with their
  language (below): these scripts write no spaces between words, and a whitespace split would
  see a paragraph as one "word";
* characters beyond U+FFFF (emoji, rare ideographs, historic scripts) are one token each;
* whitespace (str.isspace) is never part of a token; spaCy emits runs of extra spaces and
  newlines as tokens.

No token ever contains whitespace, which the repetition filter relies on (see there).

Long texts (`CHUNK_CHARS` and more: pages of megabytes) can be split a piece at a time:
`text_chunks` cuts a text right after a space or newline that a letter or digit follows, where
neither the regex's tokens nor ICU's words continue, so the words of the pieces, one after the
other, are the words of the text (`word_chunks`); `line_chunks` cuts after newlines only. The
filters that can count words or lines without holding them all use these (a list of a 30 MB
page's words holds ~60 bytes per word), and `split_words` does not keep such a text's words
for the next caller.

Pages whose language label (fastText lid.176, `doc.metadata["language"]`) is one of
`UNSPACED_LANGUAGES` (zh, ja, th, lo, km, my) get real words in those scripts instead of
characters: ICU's word break iterator (`icu4py`, which bundles ICU 78.3 and its dictionaries)
segments the page, and every segment holding a Han/kana/Thai/Lao/Khmer/Myanmar character is
one word ("我们是中国人" -> "我们" "是" "中国人"); the rest of the page (Latin, digits,
punctuation) is tokenized by the regex above, so those parts follow the same conventions on
every page. Per-character counts made Gopher see a Chinese page of 800 words as 2,000 words
of length 1 (docs/segmenters.md measures the segmenters). Every other page, English first,
takes the regex path unchanged: the language is checked against a set, the text is never
scanned for script (that scan would cost English pages ~10%).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import regex
from datatrove.utils.text import PUNCTUATION_SET

from gristmill.native import _words as _native
from gristmill.native._words import Words, line_counts, spaced_word_counts, utf8_length

__all__ = [
    "PUNCTUATION_SET",
    "PUNCTUATION_CHARS",
    "split_words",
    "page_words",
    "Words",
    "spaced_word_counts",
    "line_counts",
    "utf8_length",
    "paragraph_duplicates",
    "line_duplicates",
    "UNSPACED_LANGUAGES",
    "split_sentences",
    "split_paragraphs",
    "split_lines",
    "CHUNK_CHARS",
    "text_chunks",
    "line_chunks",
    "word_chunks",
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
    bmp = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x10000)))  # no surrogates
    ranges = []
    for m in regex.finditer(unicode_class + "+", bmp, flags=regex.V1):
        first, last = re.escape(m.group()[0]), re.escape(m.group()[-1])
        ranges.append(first if m.end() - m.start() == 1 else f"{first}-{last}")
    return "".join(ranges)


_IDEOGRAPHIC = r"[\p{Han}\p{Hiragana}\p{Katakana}]"
_SYLLABIC = r"[\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]"
IDEOGRAPHIC_CHARS = _bmp_class(_IDEOGRAPHIC)
SYLLABIC_CHARS = _bmp_class(_SYLLABIC)
_MARK = _bmp_class(r"\p{M}")
# letters, digits and marks of the scripts that separate words with spaces
_ALNUM = _bmp_class(rf"[[\p{{L}}\p{{N}}\p{{M}}]--{_IDEOGRAPHIC}--{_SYLLABIC}]")
# what a word of an unspaced script is made of (see _SCRIPT_RUNS): its script's characters and
# the Common/Inherited letters and marks written inside such words (the katakana length mark
# "ー" of "ページ", the half-width voicing mark "ﾞ")
_SCRIPT_WORD_CHARS = _bmp_class(rf"[{_IDEOGRAPHIC}{_SYLLABIC}[[\p{{L}}\p{{M}}]&&[\p{{Common}}\p{{Inherited}}]]]")
ASTRAL_CHARS = "\U00010000-\U0010ffff"

#: What a word is: the tokens of this regex, as `re.findall` gives them. It is the specification;
#: the tokenizer that runs is its C scanner (`gristmill/native/words.c`: the same five
#: alternatives tried in the same order over the same character classes, 10x faster; tested
#: equal to the regex on the sample and on every code point, tests/text/test_words.py).
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


def _class_table() -> bytes:
    """The C scanner's classes of every BMP code point (bits: ALNUM 1, IDEOGRAPHIC 2, SYLLABIC 4,
    MARK 8), from the class strings WORD_TOKEN is compiled from."""
    every = "".join(map(chr, range(0x10000)))  # surrogates included: they are in no class
    table = np.zeros(0x10000, dtype=np.uint8)
    for bit, chars in ((1, _ALNUM), (2, IDEOGRAPHIC_CHARS), (4, SYLLABIC_CHARS), (8, _MARK)):
        for m in re.finditer(f"[{chars}]+", every):
            table[m.start() : m.end()] |= bit
    return table.tobytes()


_native.set_tables(_class_table(), PUNCTUATION_CHARS)
_tokenize = _native.tokenize

#: lid.176 labels of the languages written without spaces between words, segmented with ICU.
#: (Korean is written with spaces: ICU and the regex agree exactly on it.)
UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "km", "my"})

# an ICU segment holding one of these is a word of an unspaced script; ideographs beyond
# U+FFFF (CJK extensions B..H, planes 2 and 3) are Han too
_UNSPACED_CHAR = re.compile(f"[{IDEOGRAPHIC_CHARS}{SYLLABIC_CHARS}\U00020000-\U0003ffff]")
_SPACE = re.compile(r"\s")
# ICU joins letters and digits of any script into one word where no space separates them
# ("ฝนAnna", "2004การ", "3.14ก็ได้" on a Thai page); such a segment is cut into runs of
# _SCRIPT_WORD_CHARS, which stay words, and runs of the rest, which get the regex's tokens.
_SCRIPT_CHARS_ALL = f"{_SCRIPT_WORD_CHARS}\U00020000-\U0003ffff"
_HAS_OTHER_CHAR = re.compile(f"[^{_SCRIPT_CHARS_ALL}]")
_SCRIPT_RUNS = re.compile(f"[{_SCRIPT_CHARS_ALL}]+|[^{_SCRIPT_CHARS_ALL}]+")

# A sentence ends at "." "!" or "?" (repeated, possibly followed by closing quotes or
# brackets) when whitespace and then a capital letter (possibly after opening quotes or
# brackets) follow; the end of the text ends the last one. punkt also knows abbreviations
# ("Mr. Smith" is one sentence to it, two here) and splits "end. next" less predictably, so
# sentence counts may differ from datatrove's by a few; C4 uses them only for its
# min-sentences rule.
_SENTENCE_BREAK = regex.compile(r"[.!?]+[\"'”’)\]]*(\s+)(?=[\"'“‘(\[]*\p{Lu})")

_PARAGRAPH_BREAK = re.compile(r"\n{2,}")

# The Gopher filters run one after the other on the same text: `page_words` keeps the last
# page's Words, with the language it was split for (None: the regex). The text is held, so `is`
# cannot match a new string at a recycled address. Texts of CHUNK_CHARS and more are not kept:
# their callers read them a piece at a time, and a kept page would outlive the document's visit.
_last: tuple[str, str | None, Words | None] = ("", None, None)

#: texts this long or longer are split a piece of about this many characters at a time by the
#: callers that can (`text_chunks`); shorter ones in one go, as before
CHUNK_CHARS = 1 << 20
# a place to cut: right after a space or newline that a letter or digit follows
_CUT = re.compile(r"(?<=[ \n])[^\W_]")
_LINE_CUT = re.compile(r"(?<=\n)")

# icu4py builds an ICU BreakIterator per text (its API has no setText), so no iterator can be
# kept per language; ICU itself caches the compiled rules and dictionaries, so that a new one
# costs ~6 us after the first of each process (~5 ms: the dictionary loads), measured with
# `WordBreaker("", "zh")`; a cached icu4py Locale instead of the language string saves nothing.
# Imported on first use: English-only runs never load ICU.
_WordBreaker = None


def _word_breaker():
    global _WordBreaker
    if _WordBreaker is None:
        try:
            from icu4py.breakers import WordBreaker
        except ImportError as e:
            raise ImportError(
                "gristmill.text.words: pages labelled zh/ja/th/lo/km/my need ICU word segmentation: "
                f"pip install icu4py==1.2.0 (pinned in pyproject.toml) ({e})"
            ) from None
        _WordBreaker = WordBreaker
    return _WordBreaker


def _split_unspaced(text: str, language: str) -> list[str]:
    """ICU's words where they hold an unspaced-script character; the regex's tokens between.

    One breaker over the whole page (a breaker per run of script costs 4-8x more, see
    docs/segmenters.md). ICU segments tile the text, so the text between two kept segments is
    handed to the regex by position, without copying.
    """
    breaker = _word_breaker()
    findall, is_unspaced, has_space = _tokenize, _UNSPACED_CHAR.search, _SPACE.search
    has_other_char = _HAS_OTHER_CHAR.search
    words: list[str] = []
    pending = pos = 0  # text[pending:pos] is not tokenized yet
    for segment in breaker(text, language):
        end = pos + len(segment)
        # a segment with whitespace inside (a space carrying a combining mark) goes to the
        # regex, so that no token ever holds whitespace
        if is_unspaced(segment) and not has_space(segment):
            if pending < pos:
                words += findall(text, pending, pos)
            if has_other_char(segment):
                for run in _SCRIPT_RUNS.findall(segment):
                    if is_unspaced(run):
                        words.append(run)
                    else:
                        words += findall(run)
            else:
                words.append(segment)
            pending = end
        pos = end
    if pending < len(text):
        words += findall(text, pending, len(text))
    return words


def split_words(text: str, language: str | None = None) -> list[str]:
    """Words and punctuation/symbol tokens of `text` (see the module docstring).

    `language` is the page's lid label: one of UNSPACED_LANGUAGES selects ICU segmentation for
    its script; anything else (None included) the tokenizer alone (WORD_TOKEN's tokens).
    """
    if language in UNSPACED_LANGUAGES:
        return _split_unspaced(text, language)
    return _tokenize(text)


def page_words(text: str, language: str | None = None) -> Words:
    """The words of `text` as `Words` (numbered, counted: what the Gopher filters count), made
    once for the filters that run one after the other on a page (not kept for texts of
    CHUNK_CHARS and more). A long text is read a `text_chunks` piece at a time: no list of its
    words is ever made. Do not add to the result."""
    global _last
    if language not in UNSPACED_LANGUAGES:
        language = None
    last = _last
    if last[0] is text and last[1] == language:
        return last[2]
    words = Words()
    for piece in text_chunks(text) if len(text) >= CHUNK_CHARS else (text,):
        if language is None:
            words.add_text(piece)
        else:
            words.add(_split_unspaced(piece, language))
    if len(text) < CHUNK_CHARS:
        _last = (text, language, words)
    return words


def _chunks(text: str, size: int | None, cut: re.Pattern) -> Iterator[str]:
    size = CHUNK_CHARS if size is None else size
    start, n = 0, len(text)
    while n - start > size:
        m = cut.search(text, start + size)
        if m is None:
            break
        yield text[start : m.start()]
        start = m.start()
    yield text[start:] if start else text


def text_chunks(text: str, size: int | None = None) -> Iterator[str]:
    """`text` in consecutive pieces of at least `size` (default `CHUNK_CHARS`) characters (the
    last may be shorter), each cut right after a space or newline that a letter or digit
    follows: no regex token spans whitespace, and ICU breaks a word before a letter that
    follows whitespace, so the words of the pieces are the text's words. A stretch of more than
    `size` characters without such a place stays in one piece."""
    return _chunks(text, size, _CUT)


def line_chunks(text: str, size: int | None = None) -> Iterator[str]:
    """`text` in consecutive pieces of at least `size` characters, each cut right after a newline:
    the pieces' lines (str.splitlines, "\\n"-splits) are the text's."""
    return _chunks(text, size, _LINE_CUT)


def word_chunks(text: str, language: str | None = None, size: int | None = None) -> Iterator[list[str]]:
    """`split_words(text, language)` a `text_chunks` piece at a time: the lists, one after the
    other, are the text's words; none is kept for the next caller."""
    if language not in UNSPACED_LANGUAGES:
        language = None
    for piece in text_chunks(text, size):
        yield _tokenize(piece) if language is None else _split_unspaced(piece, language)


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


def paragraph_duplicates(text: str) -> tuple[int, int, int]:
    """(paragraphs, repeated paragraphs, their characters): datatrove's find_duplicates over
    `split_paragraphs(text)`, counted in place (C: no list of the paragraphs is made)."""
    return _native.duplicate_parts(text, True)


def line_duplicates(text: str) -> tuple[int, int, int]:
    """(lines, repeated lines, their characters): datatrove's find_duplicates over
    `split_lines(text)`, counted in place (C: no list of the lines is made)."""
    return _native.duplicate_parts(text, False)


def split_lines(text: str) -> list[str]:
    """Lines as Gopher's repetition rules see them: re.split("\\n+", text), but at str.split
    speed (a run of newlines leaves empty strings between them, which we drop, except the
    first and last piece, which re.split keeps too)."""
    parts = text.split("\n")
    if len(parts) < 3:
        return parts
    return [parts[0], *filter(None, parts[1:-1]), parts[-1]]
