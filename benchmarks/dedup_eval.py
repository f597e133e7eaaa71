"""Scoring dedup results against the ground truth of make_dedup_corpus.py.

    python benchmarks/dedup_eval.py [--corpus DIR] [--docs 10000] [--removed IDS.txt] [--smoke]

Imported by dedup_throughput.py (`score`), and on its own scores a removal list (one document id
a line, from any tool) against a corpus's truth; without `--removed` it scores the two bounds,
every planted duplicate removed and nothing removed. Without `--corpus` it builds (or reuses) the
corpus of `--docs` documents in the temporary directory, as dedup_throughput.py does. `--smoke`:
300 documents (seconds; checks that the scorer still runs).

Uniform for every method, from the set of removed document ids only:
* recall of a similarity bucket: share of planted (duplicate, original) pairs whose true Jaccard
  is in the bucket and of which at least one document was removed;
* precision: share of removed documents that are a planted duplicate of a document kept in
  their planted group, with true Jaccard >= `floor` to it (default 0.7; the threshold is 0.8).
"""

from __future__ import annotations

import argparse
import tempfile
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, help="a make_dedup_corpus.py folder (default: built in the temp dir)")
    ap.add_argument("--docs", type=int, default=10_000, help="documents of the corpus built without --corpus")
    ap.add_argument("--removed", type=Path, help="ids of the removed documents, one a line")
    ap.add_argument("--smoke", action="store_true", help="300 documents: checks that it runs")
    a = ap.parse_args()
    if a.smoke:
        a.docs = 300
    corpus = a.corpus or Path(tempfile.gettempdir()) / f"gristmill-dedup-corpus-{a.docs}"
    if not (corpus / "truth.parquet").is_file():
        from make_dedup_corpus import build

        build(corpus, a.docs)
    if a.removed:
        lists = {str(a.removed): {x.strip() for x in a.removed.read_text().splitlines() if x.strip()}}
    else:
        truth = load_truth(corpus)
        lists = {"every planted duplicate removed": set(truth["id"]), "nothing removed": set()}
    for name, removed in lists.items():
        s = score(corpus, removed)
        print(
            f"{name}: removed {s['removed']:,}, recall(J>=0.85) {s['recall_j>=0.85']:.4f}, "
            f"precision {s['precision']:.4f}, not planted {s['unrelated_removed']:,}; recall by true Jaccard: "
            + ", ".join(f"{b} {r:.3f} ({n})" for b, (r, n) in s["recall_by_bucket"].items())
        )


if __name__ == "__main__":
    main()
