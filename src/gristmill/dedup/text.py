"""Text normalisation and hashing shared by exact and near dedup.

`normalize` lower-cases (str.casefold: like lower(), but "STRASSE" and "Straße" match, which
lower() misses: upper-cased re-crawls would otherwise escape dedup), deletes every character of datatrove's PUNCTUATION_SET
(ASCII and Unicode punctuation and symbols, the set the Gopher filters use) and collapses runs
of whitespace to one space, stripping both ends. So "Hello,  World!" and "hello world" hash
alike; digits, letters of every script and emoji are kept.
"""

from __future__ import annotations

import numpy as np
import xxhash

from gristmill.filters.words import PUNCTUATION_SET, split_words

_DELETE = str.maketrans("", "", "".join(PUNCTUATION_SET))


def normalize(text: str) -> str:
    return " ".join(text.casefold().translate(_DELETE).split())


def shingles(text: str, n: int = 5) -> np.ndarray:
    """Sorted unique xxh3_64 hashes of the word n-grams of normalize(text) (uint64).

    Words are `split_words` tokens; a text of 1..n-1 words is one shingle; an empty one has none.
    """
    words = split_words(normalize(text))
    if not words:
        return np.empty(0, dtype=np.uint64)
    h = xxhash.xxh3_64_intdigest
    if len(words) <= n:
        grams = [h(" ".join(words))]
    else:
        grams = [h(" ".join(words[i : i + n])) for i in range(len(words) - n + 1)]
    return np.unique(np.array(grams, dtype=np.uint64))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted unique uint64 arrays."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)
