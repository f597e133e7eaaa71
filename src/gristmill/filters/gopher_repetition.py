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

Long pages (`CHUNK_CHARS` characters and more) are read a piece at a time: paragraphs and lines
as they come (only the distinct ones held), words into `_NGrams` without a list of them. What a
page costs is then a few numbers per word (measured: ~12 bytes per byte of a 30 MB page, against
68 before, docs/scale.md "Large records"), and the decisions are the whole text's. A scan of
repeated n-grams stops once its count breaks the rule (the count only grows).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from functools import partial

import numpy as np
from datatrove.data import Document
from pydantic import Field, field_validator

from gristmill.core.configlib import FilterConfig
from gristmill.core.filter import Filter, FilterResult
from gristmill.text.words import CHUNK_CHARS, line_chunks, split_lines, split_paragraphs, split_words, word_chunks

_U64 = np.uint64
# Polynomial hashing of strings modulo 2**64 (numpy's uint64 array arithmetic wraps, without
# warnings): an odd base and its inverse.
_BASE = 0x9E3779B97F4A7C15
_BASE_INV = pow(_BASE, -1, 2**64)
# Below this many words, numpy's per-call overhead costs more than it saves (measured on WET).
_NUMPY_MIN_WORDS = 200
_powers_cache: dict[int, np.ndarray] = {}
_NON_SPACE = re.compile(r"\S")
_PARAGRAPH_BREAK = re.compile(r"\n{2,}")  # as text.words.split_paragraphs
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


class _NGrams:
    """One document's n-grams, grouped with numpy instead of as Python strings.

    An n-gram's key is a polynomial hash (mod 2**64) of its word numbers, for datatrove's
    " ".join-ed n-grams, or of its characters, for its "".join-ed ones: from prefix sums, O(1)
    per n-gram for any n. A stable sort of the keys lines up equal keys in text order. We then
    check that all n-grams a key groups are the same words, or, for "".join-ed n-grams, the
    same string (distinct tuples such as ("so", "mean") and ("some", "an") join equal: their
    strings are compared, for those pairs only); if so, the groups are exactly the joined
    strings (equal strings hash equal). Otherwise (a 64-bit hash collision) the caller falls
    back to the strings. (Keys used to be sorted with the position packed into their low bits,
    which left ~40 bits of hash for a page of millions of words: collisions, and so the string
    fallback, became likely there.)

    Memory is a few arrays of one number per word, never per character: the character hash of
    a position is built from each distinct word's own hash (`_local_hashes`) and the powers of
    the base at the word starts, which gives exactly the character-prefix hashes at word
    boundaries; pairs are checked, and repeats scanned, a block at a time. Built from a page's
    words a piece at a time (`from_chunks`), no list of its words is held.
    """

    def __init__(self, words: list[str] | None = None):
        self.index: dict[str, int] = {}  # word -> its number, 1.. in order of first occurrence
        self.vocab: list[str] = [""]  # number -> word (0: none)
        if words is not None:
            self._add([words])

    @classmethod
    def from_chunks(cls, chunks) -> _NGrams:
        """From the word lists of consecutive pieces of a text (`text.words.word_chunks`)."""
        ngrams = cls()
        ngrams._add(chunks)
        return ngrams

    def _add(self, chunks) -> None:
        index, vocab = self.index, self.vocab
        ids, lengths = [], []
        for words in chunks:
            for w in dict.fromkeys(words):
                if w not in index:
                    index[w] = len(vocab)
                    vocab.append(w)
            ids.append(np.fromiter(map(index.__getitem__, words), dtype=np.int32, count=len(words)))
            lengths.append(np.fromiter(map(len, words), dtype=np.int32, count=len(words)))
        self.ids = np.concatenate(ids) if ids else np.empty(0, np.int32)
        del ids
        self.lengths = np.concatenate(lengths) if lengths else np.empty(0, np.int32)
        del lengths
        # word starts in "".join(words): int32 while they fit (a document of < 2**31 characters)
        total = int(self.lengths.sum(dtype=np.int64))
        self.offsets = np.zeros(len(self.lengths) + 1, dtype=np.int32 if total < 2**31 else np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        self.local = None  # each distinct word's character hash, when a "".join rule is reached

    @property
    def words(self) -> list[str]:
        """The document's words (for the string fallbacks only)."""
        vocab = self.vocab
        return [vocab[i] for i in self.ids.tolist()]

    def __len__(self) -> int:
        return len(self.ids)

    def _word_keys(self, n: int) -> np.ndarray:
        """Hash of each " ".join-ed n-gram: of its word numbers (`_prefix_hashes`, `_window_hashes`)."""
        size, m = len(self.ids), len(self.ids) - n + 1
        terms = self.ids.astype(_U64)
        terms += _U64(1)
        terms *= _powers(_BASE_INV, size + 1)[1 : size + 1]
        prefix = np.zeros(size + 1, dtype=_U64)
        np.cumsum(terms, out=prefix[1:])
        del terms
        keys = prefix[n : n + m] - prefix[:m]
        del prefix
        keys *= _powers(_BASE, m)[:m]
        return keys

    def _char_keys(self, n: int) -> np.ndarray:
        """Hash of each "".join-ed n-gram: of its characters, as `_prefix_hashes` over the whole
        text's characters would give it (exactly: sums and products modulo 2**64)."""
        if self.local is None:
            self.local = _local_hashes(self.vocab)
        size, m = len(self.ids), len(self.ids) - n + 1
        uniq, inverse = np.unique(self.lengths, return_inverse=True)
        inverse = inverse.astype(np.int32)
        # BASE_INV to the power of each word's start (in characters) is the product of the
        # earlier words' BASE_INV**length: a cumulative product, wrapping mod 2**64
        scale = _pow_u64(_BASE_INV, uniq)[inverse]
        np.cumprod(scale, out=scale)  # scale[i] = BASE_INV ** start(i + 1)
        terms = self.local[self.ids]
        terms[1:] *= scale[:-1]
        del scale
        prefix = np.zeros(size + 1, dtype=_U64)  # the characters' prefix hashes at word starts
        np.cumsum(terms, out=prefix[1:])
        del terms
        keys = prefix[n : n + m] - prefix[:m]
        del prefix
        scale = _pow_u64(_BASE, uniq)[inverse[: m - 1]]
        del inverse
        np.cumprod(scale, out=scale)  # BASE ** start(i + 1)
        keys[1:] *= scale
        return keys

    def _groups(self, keys: np.ndarray, n: int, joined: bool):
        """(positions sorted by group then position, whether each is in its predecessor's group)
        for the n-grams of `keys`; False when a group mixes distinct n-grams (a collision)."""
        order = np.argsort(keys, kind="stable").astype(np.int32)  # equal keys in text order
        keys = keys[order]
        same = keys[1:] == keys[:-1]
        del keys
        for s in range(0, len(same), _BLOCK):
            pairs = np.flatnonzero(same[s : s + _BLOCK]) + s
            if not len(pairs):
                continue
            a, b = order[pairs], order[pairs + 1]
            differ = np.zeros(len(pairs), dtype=bool)
            for k in range(n):
                differ |= self.ids[a + k] != self.ids[b + k]
            if differ.any() and not (joined and self._join_equal(a[differ], b[differ], n)):
                return False
        return order, same

    def _join_equal(self, a: np.ndarray, b: np.ndarray, n: int) -> bool:
        """Whether the "".join-ed n-grams at positions a[i] and b[i] are equal strings, for all i."""
        vocab, ids = self.vocab, self.ids
        for p, q in zip(a.tolist(), b.tolist()):
            if "".join(vocab[i] for i in ids[p : p + n].tolist()) != "".join(vocab[i] for i in ids[q : q + n].tolist()):
                return False
        return True

    def top_chars(self, n: int) -> int | None:
        """datatrove's find_top_duplicate(get_n_grams(words, n)); None when there are no n-grams."""
        m = len(self.ids) - n + 1
        if m <= 0:
            return None
        grouped = self._groups(self._word_keys(n), n, joined=False)
        if not grouped:
            return _top_chars_of_strings(self.words, n)
        order, same = grouped
        bounds = np.concatenate(([True], ~same, [True])).nonzero()[0]  # of groups in `order`
        del same
        starts, counts = bounds[:-1], bounds[1:] - bounds[:-1]
        top = counts.max()
        first = int(order[starts[counts == top]].min())  # Counter.most_common: first seen wins ties
        return int(self.offsets[first + n] - self.offsets[first] + n - 1) * int(top)

    def repeated_chars(self, n: int, stop: Callable[[int], bool] | None = None) -> int:
        """datatrove's find_all_duplicate(words, n); or the count so far once `stop(count)`
        holds (the caller only tests it with `stop`)."""
        m = len(self.ids) - n + 1
        if m <= 0:
            return 0
        grouped = self._groups(self._char_keys(n), n, joined=True)
        if not grouped:
            return _repeated_chars_of_strings(self.words, n, stop)
        order, same = grouped
        if not same.any():
            return 0
        # each sorted position's group's first one, kept for the repeats only
        first = np.arange(m, dtype=np.int32)
        first[1:][same] = 0
        np.maximum.accumulate(first, out=first)
        repeat = np.concatenate(([False], same))
        del same
        repeats, first_of = order[repeat], order[first[repeat]]
        del first, repeat, order
        in_text_order = repeats.argsort()
        repeats, first_of = repeats[in_text_order], first_of[in_text_order]
        del in_text_order
        chars = self.offsets[repeats + n] - self.offsets[repeats]
        return _scan(repeats, first_of, chars, n, stop)


#: pairs checked, and repeats scanned, at a time
_BLOCK = 1 << 16


def _pow_u64(base: int, exps: np.ndarray) -> np.ndarray:
    """base ** exps (mod 2**64) of each exponent, by squaring."""
    out = np.ones(exps.shape, dtype=_U64)
    e = exps.astype(np.int64, copy=True)
    b = base
    while e.any():
        odd = (e & 1).astype(bool)
        out[odd] *= _U64(b)
        e >>= 1
        b = b * b % 2**64
    return out


def _local_hashes(vocab: list[str]) -> np.ndarray:
    """Each word's own character hash, sum over k of (c_k + 1) * BASE_INV**(k+1) (mod 2**64), as
    `_window_hashes` gives it anywhere in a text; computed ~2**20 characters of words at a time.
    (`vocab[0]`, the empty word, hashes to 0.)"""
    out = np.empty(len(vocab), dtype=_U64)
    i = 0
    while i < len(vocab):
        j, chars = i, 0
        while j < len(vocab) and (chars < 1 << 20 or j == i):
            chars += len(vocab[j])
            j += 1
        part = vocab[i:j]
        joined = "".join(part).encode("utf-32-le", "surrogatepass")
        prefix = _prefix_hashes(np.frombuffer(joined, dtype=np.uint32).astype(_U64))
        lengths = np.fromiter(map(len, part), dtype=np.int64, count=len(part))
        ends = np.cumsum(lengths)
        out[i:j] = _window_hashes(prefix, ends - lengths, ends)
        i = j
    return out


def _prefix_hashes(values: np.ndarray) -> np.ndarray:
    """prefix[i] = sum over j < i of (values[j] + 1) * BASE_INV**(j+1) (mod 2**64): the +1s keep
    zeros counting and make every value move the high bits, which are the ones we sort on."""
    terms = (values + _U64(1)) * _powers(_BASE_INV, values.size + 1)[1 : values.size + 1]
    return np.concatenate((np.zeros(1, _U64), np.cumsum(terms, dtype=_U64)))


def _window_hashes(prefix: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Hash of each window [start, end): (prefix[end] - prefix[start]) * BASE**start, which is
    sum over k of (values[start+k] + 1) * BASE_INV**(k+1), the same wherever the window is."""
    return (prefix[end] - prefix[start]) * _powers(_BASE, prefix.size)[start]


def _scan(repeats, first_of, chars, n: int, stop: Callable[[int], bool] | None = None) -> int:
    """datatrove's left-to-right scan, visiting only positions whose n-gram occurred before
    (ascending, with the first position of their n-gram, which names it, and its length).

    The scan visits every position except the n-1 after each repeat found. An n-gram is
    "already seen" at a visited position iff one of its earlier occurrences was visited: its
    first occurrence (visited unless inside a jump: jumps before it are known by then) or an
    earlier visited repeat. Arrays are turned into Python numbers a block at a time; the scan
    stops after a block once `stop(total)` holds.
    """
    skipped = bytearray(int(repeats[-1]) + n + 1)  # room for the last jump without resizing
    jump = b"\x01" * (n - 1)
    seen_again = set()  # n-grams visited at a repeat position without counting
    total = 0
    for s in range(0, len(repeats), _BLOCK):
        block = zip(
            _as_list(repeats[s : s + _BLOCK]), _as_list(first_of[s : s + _BLOCK]), _as_list(chars[s : s + _BLOCK])
        )
        for p, first, length in block:
            if skipped[p]:
                continue
            if first in seen_again or not skipped[first]:
                total += length
                skipped[p + 1 : p + n] = jump
            else:
                seen_again.add(first)
        if stop is not None and stop(total):
            break
    return total


def _as_list(values) -> list[int]:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _top_chars_of_strings(words: list[str], n: int) -> int | None:
    """_NGrams.top_chars as datatrove computes it (words hold no spaces: tuples for strings)."""
    counts = Counter(zip(*(words[i:] for i in range(n))))
    if not counts:
        return None
    gram, count = counts.most_common(1)[0]
    return (sum(map(len, gram)) + n - 1) * count


def _repeated_chars_of_strings(words: list[str], n: int, stop: Callable[[int], bool] | None = None) -> int:
    """_NGrams.repeated_chars on datatrove's "".join-ed n-grams."""
    grams = list(map("".join, zip(*(words[i:] for i in range(n)))))
    first = dict(zip(reversed(grams), range(len(grams) - 1, -1, -1)))  # last write: first index
    repeats = [p for p, gram in enumerate(grams) if first[gram] != p]
    if not repeats:
        return 0
    return _scan(repeats, [first[grams[p]] for p in repeats], [len(grams[p]) for p in repeats], n, stop)


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

    #: the distinct paragraphs and lines, then a few numbers per word (`_NGrams`: ~60 bytes a
    #: word at the peak, ~6 bytes a word of text; measured: 70, 158 and 369 MB over 2, 8 and
    #: 30 MB pages)
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

        if long:  # words as in gopher_quality
            ngrams = _NGrams.from_chunks(word_chunks(text, language))
        else:
            words = split_words(text, language)
            ngrams = _NGrams(words) if len(words) >= _NUMPY_MIN_WORDS else None
        if ngrams is None:
            top_chars_of = partial(_top_chars_of_strings, words)
            repeated_chars_of = partial(_repeated_chars_of_strings, words)
        else:
            top_chars_of, repeated_chars_of = ngrams.top_chars, ngrams.repeated_chars
        for n, max_frac in c.top_n_grams:
            top_chars = top_chars_of(n)
            if top_chars is not None and top_chars / n_chars > max_frac:
                return False, f"top_{n}_gram"
        for n, max_frac in c.dup_n_grams:
            over = _over(n_chars, max_frac)
            if over(repeated_chars_of(n, over)):
                return False, f"duplicated_{n}_n_grams"
        return True


def _over(n_chars: int, max_frac: float) -> Callable[[int], bool]:
    """The rule's test on a count of repeated characters (a scan may stop once it holds: the
    count only grows, and so does count / n_chars)."""
    return lambda chars: chars / n_chars > max_frac
