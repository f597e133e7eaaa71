"""Text normalisation and hashing shared by exact and near dedup.

`normalize` lower-cases (str.casefold: like lower(), but "STRASSE" and "Straße" match, which
lower() misses: upper-cased re-crawls would otherwise escape dedup), deletes every character of datatrove's
PUNCTUATION_SET (ASCII and Unicode punctuation and symbols, the set the Gopher filters use) and collapses runs
of whitespace to one space, stripping both ends. So "Hello,  World!" and "hello world" hash
alike; digits, letters of every script and emoji are kept.

Shingles (near dedup) are word n-grams of `words(text, language)` = `split_words(normalize(text), language)`
(the page's lid label picks ICU's words for Chinese, Japanese, Thai, Lao, Khmer and Burmese,
as in the Gopher filters; every other page, English included, the regex), hashed without
building their strings: each word is hashed once (xxh3_64 of its UTF-8), and the n-gram
w_i .. w_{i+n-1} hashes to fmix64(sum_k M_k h(w_{i+k}) mod 2^64), M_k fixed odd 64-bit
constants (one per position, so word order counts) and fmix64 murmur3's finaliser; a text of
1..n-1 words is one shingle (the same sum over its words), an empty one has none. Distinct
n-grams collide with probability ~2^-64, so the Jaccard of shingle sets is that of n-gram sets.

Long texts (`CHUNK_CHARS` characters and more) are shingled a piece at a time
(`shingle_chunks`: the words of `text_chunks` pieces, each piece's shingles with the last n-1
words of the one before), so a page of megabytes never has all its words or shingle hashes in
memory at once; the shingles are those of the whole text, in the same order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import chain

import numpy as np
import xxhash

from gristmill.text.words import (
    ASTRAL_CHARS,
    CHUNK_CHARS,
    IDEOGRAPHIC_CHARS,
    PUNCTUATION_SET,
    SYLLABIC_CHARS,
    UNSPACED_LANGUAGES,
    split_words,
    text_chunks,
)

_DELETE = str.maketrans("", "", "".join(PUNCTUATION_SET))
_PUNCT = "".join(sorted(PUNCTUATION_SET))
# punctuation that str.split() also treats as whitespace (or that isalnum() accepts): where a
# text has one, deleting it before splitting differs from splitting first
_SPECIAL = "".join(re.escape(c) for c in sorted(PUNCTUATION_SET) if c.isspace() or c.isalnum())
# characters split_words makes one token each (Han, kana, Thai... and beyond U+FFFF): where a
# text has none, a str.isalnum() token is exactly one split_words token (checked for every code
# point in tests/dedup/test_minhash.py)
_OWN_TOKEN = re.compile(f"[{IDEOGRAPHIC_CHARS}{SYLLABIC_CHARS}{ASTRAL_CHARS}]")
_SLOW = re.compile(f"[{_SPECIAL}{IDEOGRAPHIC_CHARS}{SYLLABIC_CHARS}{ASTRAL_CHARS}]")  # texts for translate-then-split


def normalize(text: str) -> str:
    t = text.casefold()
    if _SLOW.search(t):
        return " ".join(t.translate(_DELETE).split())
    # str.translate costs ~60 ns per character on non-ASCII text: only tokens that are not all
    # letters and digits can hold punctuation (same result as translate-then-split)
    return " ".join(filter(None, [w if w.isalnum() else w.translate(_DELETE) for w in t.split()]))


def words(text: str, language: str | None = None) -> list[str]:
    """split_words(normalize(text), language), the words shingles are made of, in one pass over
    the tokens.

    For a language written without spaces, ICU segments the normalised page (a near-duplicate
    of it gets the same label, so the same segmentation); per character, a 5-gram of Chinese
    would be a short phrase, not five words.

    split_words' matches never span whitespace, so it can run per whitespace token, and most
    tokens are all letters and digits (one word each, no regex), or become so once their leading
    and trailing punctuation is stripped ("end." -> "end"). 2x faster than the composition.
    """
    t = text.casefold()
    if language in UNSPACED_LANGUAGES:
        return split_words(" ".join(t.translate(_DELETE).split()), language)
    if _SLOW.search(t):
        return split_words(" ".join(t.translate(_DELETE).split()))
    out: list[str] = []
    for w in t.split():
        if w.isalnum():
            out.append(w)
            continue
        w = w.strip(_PUNCT)  # alnum after stripping: no punctuation inside either
        if w.isalnum():
            out.append(w)
        elif w:
            w = w.translate(_DELETE)
            if w.isalnum():
                out.append(w)
            elif w:
                out += split_words(w)
    return out


def _fmix64(x: np.ndarray) -> np.ndarray:
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return x


_MULT: dict[int, np.ndarray] = {}


def _multipliers(n: int) -> np.ndarray:
    m = _MULT.get(n)
    if m is None:
        m = np.random.Generator(np.random.PCG64(0x5EED)).integers(
            0, 1 << 64, size=max(n, 1), dtype=np.uint64
        ) | np.uint64(1)
        _MULT[n] = m
    return m


def shingle_hashes(word_lists: list[list[str]], n: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes of several documents' words, back to back: (hashes uint64, count per document).

    Not deduplicated within a document (MinHash minima do not care); a document of 1..n-1 words
    has one shingle, one without words none.
    """
    lens = np.fromiter(map(len, word_lists), dtype=np.int64, count=len(word_lists))
    total = int(lens.sum())
    m = _multipliers(n)
    hv = np.zeros(total + n - 1, dtype=np.uint64)
    hv[:total] = np.fromiter(
        map(xxhash.xxh3_64_intdigest, chain.from_iterable(word_lists)), dtype=np.uint64, count=total
    )
    g = hv[:total] * m[0]
    for k in range(1, n):
        g += hv[k : k + total] * m[k]
    cnt = np.where(lens >= n, lens - n + 1, (lens > 0).astype(np.int64))
    offs = np.cumsum(lens) - lens
    first = np.cumsum(cnt) - cnt
    idx = np.repeat(offs - first, cnt) + np.arange(int(cnt.sum()))
    x = g[idx]
    for i in np.flatnonzero((lens > 0) & (lens < n)).tolist():  # short texts: their words only
        o, L = int(offs[i]), int(lens[i])
        x[first[i]] = (hv[o : o + L] * m[:L]).sum(dtype=np.uint64)
    return _fmix64(x), cnt


def shingles(text: str, n: int = 5, language: str | None = None) -> np.ndarray:
    """Sorted unique shingle hashes of normalize(text) (uint64); see the module docstring.

    Words are `words(text, language)`; a text of 1..n-1 words is one shingle; an empty one has none.
    """
    if len(text) >= CHUNK_CHARS:
        parts = [np.unique(h) for h in shingle_chunks(text, n, language)]
        return np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.uint64)
    w = words(text, language)
    if not w:
        return np.empty(0, dtype=np.uint64)
    return np.unique(shingle_hashes([w], n)[0])


def shingle_chunks(text: str, n: int = 5, language: str | None = None, size: int | None = None) -> Iterator[np.ndarray]:
    """`shingle_hashes([words(text, language)], n)[0]` in consecutive parts (concatenated, the
    same array), from the text a `text_chunks` piece at a time: each piece's words after the
    last n-1 words of the pieces before, so the n-grams across a cut are made once."""
    carry: list[str] = []
    made = False
    for piece in text_chunks(text, size):
        w = carry + words(piece, language)
        if len(w) >= n:
            yield shingle_hashes([w], n)[0]
            made = True
            carry = w[len(w) - n + 1 :] if n > 1 else []
        else:
            carry = w
    if not made and carry:  # fewer than n words in all: one shingle of them
        yield shingle_hashes([carry], n)[0]


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted unique uint64 arrays."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)
