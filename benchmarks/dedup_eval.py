"""Scoring dedup results against the ground truth of make_dedup_corpus.py.

Uniform for every method, from the set of removed document ids only:
* recall of a similarity bucket: share of planted (duplicate, original) pairs whose true Jaccard
  is in the bucket and of which at least one document was removed;
* precision: share of removed documents that are a planted duplicate of a document kept in
  their planted group, with true Jaccard >= `floor` to it (default 0.7; the threshold is 0.8).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from gristmill.dedup.text import jaccard, shingles

BUCKETS = [
    (0.0, 0.5),
    (0.5, 0.6),
    (0.6, 0.7),
    (0.7, 0.8),
    (0.8, 0.85),
    (0.85, 0.9),
    (0.9, 0.95),
    (0.95, 1.0),
    (1.0, 1.01),
]


def load_truth(corpus: Path) -> dict:
    return pq.read_table(Path(corpus) / "truth.parquet").to_pydict()


def score(corpus: Path, removed: set[str], floor: float = 0.7) -> dict:
    truth = load_truth(corpus)
    rec = {}
    for lo, hi in BUCKETS:
        pairs = [(d, o) for d, o, j in zip(truth["id"], truth["original"], truth["jaccard"]) if lo <= j < hi]
        if pairs:
            rec[f"{lo:.2f}-{min(hi, 1.0):.2f}"] = (
                sum(d in removed or o in removed for d, o in pairs) / len(pairs),
                len(pairs),
            )
    hi_pairs = [(d, o) for d, o, j in zip(truth["id"], truth["original"], truth["jaccard"]) if j >= 0.85]
    recall_085 = sum(d in removed or o in removed for d, o in hi_pairs) / max(1, len(hi_pairs))
    group = {}
    for d, o in zip(truth["id"], truth["original"]):
        group[d] = o
        group.setdefault(o, o)
    members = defaultdict(list)
    for d, g in group.items():
        members[g].append(d)
    texts = {}
    need = {m for d in removed if d in group for m in members[group[d]]}
    if need:
        t = pq.read_table(Path(corpus) / "docs", columns=["id", "text"]).to_pydict()
        texts = {i: x for i, x in zip(t["id"], t["text"]) if i in need}
    good = 0
    for d in removed:
        if d not in group:
            continue
        kept = [m for m in members[group[d]] if m not in removed and m != d]
        sd = shingles(texts[d])
        if any(jaccard(sd, shingles(texts[m])) >= floor for m in kept):
            good += 1
    return {
        "removed": len(removed),
        "precision": good / max(1, len(removed)),
        "recall_j>=0.85": recall_085,
        "recall_by_bucket": rec,
        "unrelated_removed": sum(d not in group for d in removed),
    }


def kept_ids(folder: Path) -> set[str]:
    return set(pq.read_table(folder, columns=["id"]).column("id").to_pylist())
