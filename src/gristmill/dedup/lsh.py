"""LSH banding, candidate edges per band, and connected components over sharded edge files.

Bands: the signature's num_perm values are cut into b bands of r rows (b*r <= num_perm), chosen
from the target Jaccard threshold with datasketch's `_optimal_param` (minimising the weighted
false-positive and false-negative areas under the S-curve 1 - (1 - s^r)^b) unless given.
Two documents are candidates when all r values of some band are equal; a band's values are
folded into one 64-bit key (multiply-xorshift), so equal keys are found by sorting.

Edges: per band, records (key, order key) sorted by (key, order key); every run of equal keys
gives the star edges (first document, each other document): the first in the order key is the
anchor, so it is the one a cluster keeps. Edges never leave the band's own files.

Key ranges (`key_range_bounds`): a band's work is cut into R ranges of the 64-bit key space,
range g = [ceil(g*2^64/R), ceil((g+1)*2^64/R)). Equal keys fall in one range, so the edges of a
band are the edges of its ranges; and since ranges are intervals of the sort's first key, the
ranges' edges concatenated in range order are the band's edges in the same order. Keys leave
`band_keys` through a multiply-xorshift, so each range holds ~1/R of a band's records.

Connected components (`components`): one task, in two passes over the edge shards (the reference
the partitioned cluster stages of `dedup/cluster.py` are tested against, and what
`near_dedup_cluster` ran before them):
1. the sorted unique nodes (documents in at least one edge), merged shard by shard;
2. union-find on int64 parent indices over those nodes, the shards' edges hooked in one shard
   at a time (vectorised: hook the larger root under the smaller, compress, repeat until every
   edge of the shard joins one root).
A node's root is the smallest index of its component, i.e. the first document in the order key.

Peak memory of the cluster task: the node keys and parents (16 bytes per node), one shard of
edges as node indices, and the temporaries of the merge (pass 1: old and new node arrays while a
shard's keys are merged in) and of pointer jumping (pass 2: `parent[parent]`, 8 bytes per node):
measured ~41 bytes per node for E ~ 0.7 D in 4 shards (docs/scale.md, "Near dedup memory models"),
i.e. about 40*D + 32*E/S bytes for D documents in duplicate clusters and E candidate edges in
S shards. It holds no per-document state for the documents that have no near duplicate, and
never all edges at once. For a Common Crawl snapshot (3e9 docs, ~1e9 in clusters) that is
~40 GB plus the shard.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

_C1 = np.uint64(0x9E3779B97F4A7C15)
_C2 = np.uint64(0xBF58476D1CE4E5B9)


def optimal_bands(threshold: float, num_perm: int, fp_weight: float = 0.5, fn_weight: float = 0.5) -> tuple[int, int]:
    """datasketch's `_optimal_param` without datasketch (whose import, scipy's, costs ~0.7 s CPU).

    The same search over (b, r), b*r <= num_perm, in the same order (first minimum wins), with
    the false-positive and false-negative areas integrated by Gauss-Legendre quadrature, exact
    for the S-curve, a polynomial of degree b*r <= num_perm (datasketch: scipy's quad).
    """
    br = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)], dtype=np.float64)
    x, w = np.polynomial.legendre.leggauss(num_perm // 2 + 2)

    def area(lo: float, hi: float, fp: bool) -> np.ndarray:
        s = (hi - lo) / 2 * x + (hi + lo) / 2
        p = 1 - (1 - s[None, :] ** br[:, 1:2]) ** br[:, 0:1]  # candidate probability at similarity s
        return ((p if fp else 1 - p) @ w) * (hi - lo) / 2

    err = area(0.0, threshold, True) * fp_weight + area(threshold, 1.0, False) * fn_weight
    b, r = br[int(np.argmin(err))]
    return int(b), int(r)


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64: one key per band of r signature values."""
    n = len(sig)
    keys = np.empty((n, bands), dtype=np.uint64)
    for b in range(bands):
        k = np.full(n, ((b + 1) * int(_C1)) & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
        for v in sig[:, b * rows : (b + 1) * rows].T:
            k ^= v
            k *= _C2
            k ^= k >> np.uint64(29)
        keys[:, b] = k
    return keys


def key_range_bounds(ranges: int) -> list[int]:
    """The R+1 bounds of R equal ranges of the 64-bit key space (Python ints; the last is 2^64):
    range g holds the keys k with bounds[g] <= k < bounds[g+1]."""
    if ranges < 1:
        raise ValueError(f"key ranges must be >= 1, got {ranges}")
    return [-(-(g << 64) // ranges) for g in range(ranges + 1)]


def sort_records(keys: np.ndarray, nodes: np.ndarray) -> None:
    """Sorts (keys, nodes) by (key, node) in place. Peak: the two arrays + the int64 order + one
    8-byte temporary = 32 bytes per record (a sort returning new arrays while the caller still
    holds the old ones would peak at 40)."""
    order = np.lexsort((nodes, keys))
    keys[:] = keys[order]
    nodes[:] = nodes[order]


def sorted_band_edges(keys: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """(E, 2) uint64 star edges (anchor, other) of the documents `nodes` sharing a band key, in
    (key, other) order, from records already sorted by (key, node) (`sort_records`).
    Temporaries: a few bool arrays (1 byte per record each) and the edges; no per-record
    integer array, since in a band most keys are unique."""
    if len(keys) < 2:
        return np.empty((0, 2), dtype=np.uint64)
    same = keys[1:] == keys[:-1]  # same[i]: record i+1 continues the run of record i
    if not same.any():
        return np.empty((0, 2), dtype=np.uint64)
    first = np.flatnonzero(same & ~np.r_[False, same[:-1]])  # first record of each run of >= 2
    member = np.flatnonzero(same) + 1  # every other record of those runs
    del same
    anchor = nodes[first[np.searchsorted(first, member - 1, side="right") - 1]]
    e = np.stack([anchor, nodes[member]], axis=1)
    return e[e[:, 0] != e[:, 1]]  # the same document twice in a bucket is no edge


def shard_of(anchor: np.ndarray, shards: int) -> np.ndarray:
    return ((anchor * _C2) >> np.uint64(40)) % np.uint64(shards)


def _find_all(parent: np.ndarray) -> np.ndarray:
    while True:  # pointer jumping until every node points at its root
        gp = parent[parent]
        if np.array_equal(gp, parent):
            return parent
        parent[:] = gp


def _nodes_of(shards: list) -> np.ndarray:
    """Sorted unique node keys of every edge shard, merged one shard at a time."""
    nodes = np.empty(0, dtype=np.uint64)
    for load in shards:
        e = load()
        if len(e):
            nodes = np.union1d(nodes, e.reshape(-1))
    return nodes


def components(edge_shards: Iterable[callable]) -> tuple[np.ndarray, np.ndarray]:
    """Connected components over edges read shard by shard.

    `edge_shards` are callables returning an (E, 2) uint64 array each (read on demand, twice).
    Returns (nodes, roots): sorted unique node keys and the smallest node key of each one's
    component.
    """
    shards = list(edge_shards)
    nodes = _nodes_of(shards)
    parent = np.arange(len(nodes), dtype=np.int64)
    for load in shards:
        e = load()
        if not len(e):
            continue
        u = np.searchsorted(nodes, e[:, 0])
        v = np.searchsorted(nodes, e[:, 1])
        del e
        while True:
            _find_all(parent)
            ru, rv = parent[u], parent[v]
            diff = ru != rv
            if not diff.any():
                break
            ru, rv = ru[diff], rv[diff]
            u, v = u[diff], v[diff]
            hi, lo = np.maximum(ru, rv), np.minimum(ru, rv)
            np.minimum.at(parent, hi, lo)  # hook larger roots under smaller: no cycles
    _find_all(parent)
    return nodes, nodes[parent]


def kept_neighbour(edge_shards: Iterable[callable], rounds: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Removal for a kept neighbour: in order key, a document is removed when it has an edge to an
    earlier document that is kept, and kept otherwise.

    Unlike `components`, every removed document is joined by an edge (a verified pair: Jaccard >=
    threshold) to the document it is removed for, so no document goes for one it is not close to
    (with A~B and B~C but not A~C, components keep A alone; this keeps A and C). Which documents
    are removed is fixed by the rule; the one each is removed for is a kept earlier neighbour (the
    smallest of those decided in the round it is). Returns (nodes, kept_for): sorted node keys and,
    for each, that neighbour's key, or its own key when it is kept.

    Rounds over the edge shards, each deciding every undecided node whose earlier neighbours are
    all decided (at least the smallest undecided one): removed if one is kept, kept if all are
    removed; read-once per round, vectorised. Chains of near duplicates of near duplicates need
    one round per link, so after `rounds` the undecided rest is finished in order key one node at
    a time. Memory: node keys, state, choice and per-round flags and minima (~27 bytes per node) and
    one edge shard (the node merge of the first pass as in `components`).
    """
    shards = list(edge_shards)
    nodes = _nodes_of(shards)
    n = len(nodes)
    state = np.zeros(n, dtype=np.int8)  # 0 undecided, 1 kept, 2 removed
    kept_for = np.arange(n, dtype=np.int64)

    def edges(load):
        e = load()
        if not len(e):
            return None, None
        e = np.sort(e, axis=1)  # (earlier, later) in order key
        return np.searchsorted(nodes, e[:, 0]), np.searchsorted(nodes, e[:, 1])

    for _ in range(rounds):
        if not (state == 0).any():
            break
        kept_in = np.zeros(n, dtype=bool)
        undecided_in = np.zeros(n, dtype=bool)
        best = np.full(n, n, dtype=np.int64)
        for load in shards:
            u, v = edges(load)
            if u is None:
                continue
            open_ = state[v] == 0
            u, v = u[open_], v[open_]
            k = state[u] == 1
            kept_in[v[k]] = True
            np.minimum.at(best, v[k], u[k])
            undecided_in[v[state[u] == 0]] = True
        todo = state == 0
        gone = todo & kept_in
        state[gone], kept_for[gone] = 2, best[gone]
        state[todo & ~kept_in & ~undecided_in] = 1
    left = np.flatnonzero(state == 0)
    if len(left):  # long chains: finish in order key; every earlier neighbour is decided by then
        us, vs = [], []
        for load in shards:
            u, v = edges(load)
            if u is None:
                continue
            m = state[v] == 0
            us.append(u[m])
            vs.append(v[m])
        u, v = np.concatenate(us), np.concatenate(vs)
        order = np.lexsort((u, v))
        u, v = u[order].tolist(), v[order].tolist()
        starts = dict(zip(*np.unique(np.array(v, dtype=np.int64), return_index=True)))
        for x in left.tolist():
            i = starts.get(x)
            kept_by = None
            while i is not None and i < len(v) and v[i] == x:
                if state[u[i]] == 1:
                    kept_by = u[i]  # u ascending: the smallest kept one
                    break
                i += 1
            if kept_by is None:
                state[x] = 1
            else:
                state[x], kept_for[x] = 2, kept_by
    return nodes, nodes[kept_for]
