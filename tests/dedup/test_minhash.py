"""MinHash signatures: exact modular arithmetic, and Jaccard estimates against datasketch's."""

from __future__ import annotations

import random

import numpy as np
import pyarrow.parquet as pq
from datasketch import MinHash

from gristmill.dedup.lsh import band_edges, components
from gristmill.dedup.minhash import MinHasher, estimate_jaccard, universal_hash
from gristmill.dedup.text import jaccard, normalize, shingles
from gristmill.filters.words import split_words


def test_universal_hash_equals_python_big_integers():
    h = MinHasher(32, seed=5)
    p = (1 << 61) - 1
    x = np.random.default_rng(1).integers(0, p, size=500, dtype=np.uint64)
    x[:3] = [0, p - 1, 1 << 60]
    got = universal_hash(x, h.a, h.b)
    want = [[(int(a) * int(v) + int(b)) % p for a, b in zip(h.a, h.b)] for v in x]
    assert got.tolist() == want


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
        ours.append(estimate_jaccard(sig[0], sig[1]))
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
    keys = np.array([4, 4, 9, 4], dtype=np.uint64)
    assert band_edges(keys, np.array([7, 3, 1, 5], dtype=np.uint64)).tolist() == [[3, 5], [3, 7]]
