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
per word for each n; we group n-grams with numpy (see _NGrams), except in short documents, and
loop in Python only over repeats.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import numpy as np
from datatrove.data import Document
from pydantic import Field, field_validator

from gristmill.core.configlib import FilterConfig
from gristmill.core.filter import Filter, FilterResult
from gristmill.text.words import split_lines, split_paragraphs, split_words

_U64 = np.uint64
# Polynomial hashing of strings modulo 2**64 (numpy's uint64 array arithmetic wraps, without
# warnings): an odd base and its inverse.
_BASE = 0x9E3779B97F4A7C15
_BASE_INV = pow(_BASE, -1, 2**64)
# Below this many words, numpy's per-call overhead costs more than it saves (measured on WET).
_NUMPY_MIN_WORDS = 200
_powers_cache: dict[int, np.ndarray] = {}
_POWERS_KEPT = 1 << 22  # kept for the next documents up to this many (32 MiB per base)


def _powers(base: int, count: int) -> np.ndarray:
    """At least `count` powers base**0, base**1, ... modulo 2**64, reused across documents."""
    powers = _powers_cache.get(base)
    if powers is None or powers.size < count:
        size = max(count, 1024, min(_POWERS_KEPT, 2 * (0 if powers is None else powers.size)))
        powers = np.full(size, base, dtype=_U64)
        powers[0] = 1
        powers = np.cumprod(powers, dtype=_U64)
        if size <= _POWERS_KEPT:
            _powers_cache[base] = powers
    return powers


def _duplicates(parts: list[str]) -> tuple[int, int]:
    """(number of repeated elements, their characters): datatrove's find_duplicates."""
    distinct = set(parts)
    return len(parts) - len(distinct), sum(map(len, parts)) - sum(map(len, distinct))


class _NGrams:
    """One document's n-grams, grouped with numpy instead of as Python strings.

    An n-gram's key is a polynomial hash (mod 2**64) of its word numbers, for datatrove's
    " ".join-ed n-grams, or of its characters, for its "".join-ed ones: from prefix sums, O(1)
    per n-gram for any n. Sorting the keys, with each position packed into the low bits, lines
    up equal keys in text order. We then check that all n-grams a key groups are the same
    words; if so, the groups are exactly the word tuples, and exactly the joined strings
    (equal tuples join equal; equal strings hash equal). Otherwise (distinct tuples that join
    equal, such as ("so", "mean") and ("some", "an"), or a hash collision) the caller falls
    back to the strings.
    """

    def __init__(self, words: list[str]):
        self.words = words
        index = dict(zip(dict.fromkeys(words), range(1, len(words) + 1)))
        self.ids = np.fromiter(map(index.__getitem__, words), dtype=np.int64, count=len(words))
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        self.offsets = np.concatenate(([0], np.cumsum(lengths)))  # word starts in "".join(words)
        self.word_prefix = _prefix_hashes(self.ids.astype(_U64))
        self.char_prefix = None  # computed when a "".join rule is reached

    def _groups(self, prefix: np.ndarray, start: np.ndarray, end: np.ndarray, n: int):
        """(positions sorted by group then position, whether each is in its predecessor's group)
        for the n-grams hashed over prefix[start:end]; False when a group mixes word tuples."""
        m = start.size
        keys = _window_hashes(prefix, start, end)
        bits = _U64(max(1, (m - 1).bit_length()))
        packed = np.sort((keys >> bits << bits) | np.arange(m, dtype=_U64))
        order = (packed & _U64((1 << int(bits)) - 1)).astype(np.int64)
        packed >>= bits
        same = packed[1:] == packed[:-1]
        if same.any():
            window = np.arange(n)
            a, b = order[:-1][same, None] + window, order[1:][same, None] + window
            if not (self.ids[a] == self.ids[b]).all():
                return False
        return order, same

    def top_chars(self, n: int) -> int | None:
        """datatrove's find_top_duplicate(get_n_grams(words, n)); None when there are no n-grams."""
        m = len(self.words) - n + 1
        if m <= 0:
            return None
        positions = np.arange(m)
        grouped = self._groups(self.word_prefix, positions, positions + n, n)
        if not grouped:
            return _top_chars_of_strings(self.words, n)
        order, same = grouped
        bounds = np.concatenate(([True], ~same, [True])).nonzero()[0]  # of groups in `order`
        starts, counts = bounds[:-1], bounds[1:] - bounds[:-1]
        top = counts.max()
        first = order[starts[counts == top]].min()  # Counter.most_common: first seen wins ties
        return int(self.offsets[first + n] - self.offsets[first] + n - 1) * int(top)

    def repeated_chars(self, n: int) -> int:
        """datatrove's find_all_duplicate(words, n)."""
        m = len(self.words) - n + 1
        if m <= 0:
            return 0
        if self.char_prefix is None:
            joined = "".join(self.words).encode("utf-32-le", "surrogatepass")
            self.char_prefix = _prefix_hashes(np.frombuffer(joined, dtype=np.uint32).astype(_U64))
        grouped = self._groups(self.char_prefix, self.offsets[:m], self.offsets[n:], n)
        if not grouped:
            return _repeated_chars_of_strings(self.words, n)
        order, same = grouped
        if not same.any():
            return 0
        is_start = np.concatenate(([True], ~same))
        first_of = order[np.maximum.accumulate(np.where(is_start, np.arange(m), 0))]
        repeats, first_of = order[~is_start], first_of[~is_start]
        in_text_order = repeats.argsort()
        repeats, first_of = repeats[in_text_order], first_of[in_text_order].tolist()
        chars = (self.offsets[repeats + n] - self.offsets[repeats]).tolist()
        return _scan(repeats.tolist(), first_of, chars, n)


def _prefix_hashes(values: np.ndarray) -> np.ndarray:
    """prefix[i] = sum over j < i of (values[j] + 1) * BASE_INV**(j+1) (mod 2**64): the +1s keep
    zeros counting and make every value move the high bits, which are the ones we sort on."""
    terms = (values + _U64(1)) * _powers(_BASE_INV, values.size + 1)[1 : values.size + 1]
    return np.concatenate((np.zeros(1, _U64), np.cumsum(terms, dtype=_U64)))


def _window_hashes(prefix: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Hash of each window [start, end): (prefix[end] - prefix[start]) * BASE**start, which is
    sum over k of (values[start+k] + 1) * BASE_INV**(k+1), the same wherever the window is."""
    return (prefix[end] - prefix[start]) * _powers(_BASE, prefix.size)[start]


def _scan(repeats: list[int], first_of: list[int], chars: list[int], n: int) -> int:
    """datatrove's left-to-right scan, visiting only positions whose n-gram occurred before
    (ascending, with the first position of their n-gram, which names it, and its length).

    The scan visits every position except the n-1 after each repeat found. An n-gram is
    "already seen" at a visited position iff one of its earlier occurrences was visited: its
    first occurrence (visited unless inside a jump: jumps before it are known by then) or an
    earlier visited repeat.
    """
    skipped = bytearray(repeats[-1] + n + 1)  # room for the last jump without resizing
    jump = b"\x01" * (n - 1)
    seen_again = set()  # n-grams visited at a repeat position without counting
    total = 0
    for p, first, length in zip(repeats, first_of, chars):
        if skipped[p]:
            continue
        if first in seen_again or not skipped[first]:
            total += length
            skipped[p + 1 : p + n] = jump
        else:
            seen_again.add(first)
    return total


def _top_chars_of_strings(words: list[str], n: int) -> int | None:
    """_NGrams.top_chars as datatrove computes it (words hold no spaces: tuples for strings)."""
    counts = Counter(zip(*(words[i:] for i in range(n))))
    if not counts:
        return None
    gram, count = counts.most_common(1)[0]
    return (sum(map(len, gram)) + n - 1) * count


def _repeated_chars_of_strings(words: list[str], n: int) -> int:
    """_NGrams.repeated_chars on datatrove's "".join-ed n-grams."""
    grams = list(map("".join, zip(*(words[i:] for i in range(n)))))
    first = dict(zip(reversed(grams), range(len(grams) - 1, -1, -1)))  # last write: first index
    repeats = [p for p, gram in enumerate(grams) if first[gram] != p]
    if not repeats:
        return 0
    return _scan(repeats, [first[grams[p]] for p in repeats], [len(grams[p]) for p in repeats], n)


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

    def filter(self, doc: Document, c: Config) -> FilterResult:
        language = doc.metadata.get("language")
        text = doc.text
        if not text:
            return False, "empty"
        n_chars = len(text)

        paragraphs = split_paragraphs(text)
        dups, dup_chars = _duplicates(paragraphs)
        if c.dup_para_frac and dups / len(paragraphs) > c.dup_para_frac:
            return False, "dup_para_frac"
        if c.dup_para_char_frac and dup_chars / n_chars > c.dup_para_char_frac:
            return False, "dup_para_char_frac"

        lines = split_lines(text)
        dups, dup_chars = _duplicates(lines)
        if c.dup_line_frac and dups / len(lines) > c.dup_line_frac:
            return False, "dup_line_frac"
        if c.dup_line_char_frac and dup_chars / n_chars > c.dup_line_char_frac:
            return False, "dup_line_char_frac"

        words = split_words(text, language)  # as in gopher_quality
        if len(words) < _NUMPY_MIN_WORDS:
            top_chars_of = partial(_top_chars_of_strings, words)
            repeated_chars_of = partial(_repeated_chars_of_strings, words)
        else:
            ngrams = _NGrams(words)
            top_chars_of, repeated_chars_of = ngrams.top_chars, ngrams.repeated_chars
        for n, max_frac in c.top_n_grams:
            top_chars = top_chars_of(n)
            if top_chars is not None and top_chars / n_chars > max_frac:
                return False, f"top_{n}_gram"
        for n, max_frac in c.dup_n_grams:
            if repeated_chars_of(n) / n_chars > max_frac:
                return False, f"duplicated_{n}_n_grams"
        return True
