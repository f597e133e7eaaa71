"""CCNet's text normalisation, used both to train KenLM models and to score with them.

As cc_net/text_normalizer.py `normalize(line)` with its defaults (accent, case, numbers,
punct=1): strip, lower-case, strip accents (NFD minus combining marks), every digit to 0,
unicode punctuation to its ASCII form, non-printing characters removed. A model scores well
only text normalised exactly as its training text was, so `kenlm train` and the `kenlm` step
share this one function.

CCNet normalises line by line; a line is a paragraph of a WET document. (datatrove's
`KenlmModel.normalize` applies it to the whole document, which deletes the newlines — control
characters — and scores the document as one line.)
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator

from gristmill.text.words import CHUNK_CHARS, line_chunks

UNICODE_PUNCT = {
    "，": ",",
    "。": ".",
    "、": ",",
    "„": '"',
    "”": '"',
    "“": '"',
    "«": '"',
    "»": '"',
    "１": '"',
    "」": '"',
    "「": '"',
    "《": '"',
    "》": '"',
    "´": "'",
    "∶": ":",
    "：": ":",
    "？": "?",
    "！": "!",
    "（": "(",
    "）": ")",
    "；": ";",
    "–": "-",
    "—": " - ",
    "．": ". ",
    "～": "~",
    "’": "'",
    "…": "...",
    "━": "-",
    "〈": "<",
    "〉": ">",
    "【": "[",
    "】": "]",
    "％": "%",
    "►": "-",
}
_NON_PRINTING = list(range(0, 32)) + list(range(127, 160))


def strip_accents(line: str) -> str:
    """CCNet's: NFD, then drop combining marks (category Mn)."""
    nfd = unicodedata.normalize("NFD", line)
    if nfd.isascii():
        return nfd
    return "".join(c for c in nfd if unicodedata.category(c) != "Mn")


class _CharMap(dict):
    """str.translate table for the per-character steps after lower-casing and NFD: drop Mn, digits
    (Unicode Nd, what `re`'s \\d matches) to 0, unicode punctuation to ASCII, drop non-printing.
    One pass instead of CCNet's four; equal, since no replacement is itself subject to a later step.
    Filled lazily, one entry per distinct character seen."""

    def __missing__(self, cp: int):
        c = chr(cp)
        cat = unicodedata.category(c)
        value = None if cat == "Mn" or cp in _NON_PRINTING_SET else "0" if cat == "Nd" else UNICODE_PUNCT.get(c, c)
        self[cp] = value
        return value


_NON_PRINTING_SET = frozenset(_NON_PRINTING)
_CHARS = _CharMap()
_ASCII = str.maketrans({**{str(d): "0" for d in range(10)}, **{chr(cp): None for cp in _NON_PRINTING if cp < 128}})


def normalize(line: str) -> str:
    """One line (paragraph), normalised as CCNet does before SentencePiece and KenLM."""
    line = line.strip()
    if not line:
        return line
    line = line.lower()
    if line.isascii():  # most lines: no accents, no unicode punctuation
        return line.translate(_ASCII)
    return unicodedata.normalize("NFD", line).translate(_CHARS)


def normalize_lines(text: str) -> list[str]:
    """The document's non-empty normalised lines: the units KenLM scores."""
    return list(iter_normalized_lines(text))


def iter_normalized_lines(text: str) -> Iterator[str]:
    """`normalize_lines(text)` one line at a time; a long text's lines are split a piece at a
    time (`line_chunks`), so no list of its raw lines is held."""
    for piece in line_chunks(text) if len(text) >= CHUNK_CHARS else (text,):
        for line in piece.split("\n"):
            line = normalize(line)
            if line:
                yield line
