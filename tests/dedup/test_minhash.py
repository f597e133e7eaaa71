"""MinHash signatures: exact modular arithmetic, and Jaccard estimates against datasketch's."""

from __future__ import annotations

import random

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasketch import MinHash

from gristmill.dedup.lsh import components, kept_neighbour, optimal_bands, sort_records, sorted_band_edges
from gristmill.dedup.minhash import MinHasher, universal_hash
from gristmill.dedup.text import jaccard, normalize, shingle_hashes, shingles
from gristmill.text.words import split_words


def test_universal_hash_equals_python_big_integers():
    h = MinHasher(32, seed=5)
    p = 1 << 64
    assert all(int(a) % 2 == 1 for a in h.a)  # odd multipliers: a bijection of 64-bit values
    x = np.random.default_rng(1).integers(0, p, size=500, dtype=np.uint64)
    x[:3] = [0, p - 1, 1 << 63]
    got = universal_hash(x, h.a, h.b)
    want = [[(int(a) * int(v) + int(b)) % p for a, b in zip(h.a, h.b)] for v in x]
    assert got.tolist() == want


def test_shingle_hashes_batch_equals_per_text_and_word_ngrams():
    texts = [
        "",
        "one",
        "two words",
        "the quick brown fox jumps over the lazy dog",
        "a b c d e f a b c d e f",
        "Hello,  World! hello world",
    ]
    words = [split_words(normalize(t)) for t in texts]
    x, counts = shingle_hashes(words, 5)
    assert counts.tolist() == [0, 1, 1, 5, 8, 1]
    for part, t in zip(np.split(x, np.cumsum(counts)[:-1]), texts):
        assert np.array_equal(np.unique(part), shingles(t))
    # one hash per distinct n-gram: "a b c d e f a b c d e f" has 6 distinct 5-grams of 8
    assert len(shingles(texts[4])) == 6
    assert len(np.unique(shingle_hashes([["a", "b"], ["b", "a"], ["a", "b", "c"]], 5)[0])) == 3


def test_normalize_fast_path_equals_translate_then_split():
    from gristmill.dedup.text import _DELETE

    for t in [
        "Hello,  World!",
        "x\ry z",
        "１２ab",
        "a\x0bb",
        "-- -- a",
        "don't stop-me now 3.14",
        "Straße «quoted» — ok",
        "日本語、テキスト。",
        "",
        "   ",
    ]:
        assert normalize(t) == " ".join(t.casefold().translate(_DELETE).split())


def test_signature_is_per_document_minimum_whatever_the_batching():
    rng = np.random.default_rng(2)
    sets = [np.unique(rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64)) for n in (1, 700, 3, 1500, 0, 40)]
    big, small = MinHasher(64, 3, chunk=4096), MinHasher(64, 3, chunk=100)
    s1, s2 = big.signatures(sets), small.signatures(sets)
    assert np.array_equal(s1, s2)
    one = [big.signatures([s])[0] for s in sets]
    assert np.array_equal(s1, np.array(one))


def test_jaccard_estimates_agree_with_datasketch_and_truth(dedup_corpus):
    t = pq.read_table(dedup_corpus / "truth.parquet").to_pydict()
    docs = dict(zip(*pq.read_table(dedup_corpus / "docs", columns=["id", "text"]).to_pydict().values()))
    pairs = [(d, o) for d, o, k in zip(t["id"], t["original"], t["kind"]) if k != "exact"][:150]
    hasher = MinHasher(256, seed=11)
    ours, theirs, true = [], [], []
    for d, o in pairs:
        sd, so = shingles(docs[d]), shingles(docs[o])
        sig = hasher.signatures([sd, so])
        ours.append(np.mean(sig[0] == sig[1]))  # the share of equal minima estimates the Jaccard
        m = []
        for text in (docs[d], docs[o]):
            words = split_words(normalize(text))
            mh = MinHash(num_perm=256, seed=11)
            mh.update_batch([" ".join(words[i : i + 5]).encode() for i in range(max(1, len(words) - 4))])
            m.append(mh)
        theirs.append(m[0].jaccard(m[1]))
        true.append(jaccard(sd, so))
    ours, theirs, true = map(np.array, (ours, theirs, true))
    assert true.std() > 0.1  # the pairs span a range of similarities
    err_ours, err_theirs = np.abs(ours - true).mean(), np.abs(theirs - true).mean()
    assert err_ours < 0.04 and err_theirs < 0.04  # ~ sqrt(J(1-J)/256) = 0.025
    assert err_ours < 1.3 * err_theirs
    assert np.abs(ours - theirs).mean() < 0.05


def test_components_keep_smallest_key_and_stream_shards():
    rng = random.Random(3)
    edges = np.array([(rng.randrange(300), rng.randrange(300)) for _ in range(400)], dtype=np.uint64)
    edges = np.sort(edges, axis=1)
    nodes, roots = components([lambda s=s: edges[s::4] for s in range(4)])
    parent = {}

    def find(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for a, b in edges.tolist():
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    assert [find(n) for n in nodes.tolist()] == roots.tolist()
    keys, nodes = np.array([4, 4, 9, 4], dtype=np.uint64), np.array([7, 3, 1, 5], dtype=np.uint64)
    sort_records(keys, nodes)
    assert sorted_band_edges(keys, nodes).tolist() == [[3, 5], [3, 7]]


def _kept_neighbour_reference(edges):
    """In order key, one node at a time: removed for its smallest kept earlier neighbour."""
    earlier = {}
    for a, b in edges.tolist():
        a, b = min(a, b), max(a, b)
        if a != b:
            earlier.setdefault(b, set()).add(a)
    kept_for = {}
    for x in sorted({n for e in edges.tolist() for n in e}):
        kept = sorted(u for u in earlier.get(x, ()) if kept_for[u] == u)
        kept_for[x] = kept[0] if kept else x
    return kept_for


@pytest.mark.parametrize("rounds", [1, 2, 64])
def test_kept_neighbour_removes_only_for_a_kept_neighbour(rounds):
    """Against a one-node-at-a-time reference, whether rounds decide everything or the sequential
    finish does (rounds=1); a chain A~B~C keeps A and C, where components keep A alone."""
    rng = random.Random(5)
    edges = np.array([(rng.randrange(200), rng.randrange(200)) for _ in range(300)], dtype=np.uint64)
    # a long chain: one round per link, more than `rounds` allows
    edges = np.concatenate([edges, np.array([(1000 + i, 1001 + i) for i in range(100)], dtype=np.uint64)])
    edges = edges[edges[:, 0] != edges[:, 1]]
    ref = _kept_neighbour_reference(edges)
    nodes, kept_for = kept_neighbour([lambda s=s: edges[s::3] for s in range(3)], rounds=rounds)
    assert sorted(nodes.tolist()) == sorted(ref) and nodes.tolist() == sorted(ref)
    # the same documents removed; each for one of its kept earlier neighbours
    assert [n for n, k in zip(nodes.tolist(), kept_for.tolist()) if n != k] == sorted(
        n for n, k in ref.items() if n != k
    )
    pairs = {tuple(sorted(e)) for e in edges.tolist()}
    for n, k in zip(nodes.tolist(), kept_for.tolist()):
        assert n == k or (k < n and (k, n) in pairs and ref[k] == k)
    assert [ref[1000 + i] for i in range(5)] == [1000, 1000, 1002, 1002, 1004]
    chain = np.array([[1, 2], [2, 3]], dtype=np.uint64)
    assert kept_neighbour([lambda: chain])[1].tolist() == [1, 1, 3]
    assert components([lambda: chain])[1].tolist() == [1, 1, 1]


def test_optimal_bands_equal_datasketch():
    from datasketch.lsh import _optimal_param

    for num_perm in (16, 128, 256):
        for threshold in (0.5, 0.7, 0.8, 0.9):
            for w in ((0.5, 0.5), (0.1, 0.9)):
                assert optimal_bands(threshold, num_perm, *w) == _optimal_param(threshold, num_perm, *w)


def test_words_fast_path_equals_split_words_of_normalize(dedup_corpus):
    import re

    from gristmill.dedup.text import _OWN_TOKEN, words
    from gristmill.text import words as w

    # the fast path's premise: outside _OWN_TOKEN, an isalnum() character is in split_words' word class
    alnum = re.compile(f"[{w._ALNUM}]")
    for cp in range(0x110000):
        c = chr(cp)
        if c.isalnum() and not _OWN_TOKEN.match(c):
            assert alnum.match(c), hex(cp)
    texts = pq.read_table(dedup_corpus / "docs", columns=["text"]).column("text").to_pylist()[:1500]
    texts += [
        "",
        "Hello,  World!",
        "x\ry z",
        "１２ab",
        "don't stop-me now 3.14",
        "日本語 text",
        "€5 a+b ½ ok",
        "नमस्ते दुनिया",
    ]
    for t in texts:
        assert words(t) == split_words(normalize(t))
