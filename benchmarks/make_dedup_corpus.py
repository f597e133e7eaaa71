"""Ground-truth corpus for dedup: real text with planted exact and near duplicates.

    python benchmarks/make_dedup_corpus.py OUT_DIR --docs 10000 [--seed 0] [--smoke]

Base documents are random draws of lines (pieces of at most 40 words, distinct after
normalisation; 80-400 words in all) from the real texts in
../shared/data: the Common Crawl WET records (read with gristmill's WET reader), WikiText-2,
the UDHR in 389 languages and Shakespeare. Two base documents share a line only by chance, so
their Jaccard similarity is ~0. On top of them we plant:

* exact duplicates (6% of documents): a copy with case, whitespace and punctuation changes that
  `gristmill.dedup.text.normalize` removes;
* near duplicates (18%), at a target Jaccard drawn uniformly from [0.5, 1.0): word edits
  (replacing a share of words), boilerplate added (real lines from a fixed pool of 40 WET lines,
  prepended/appended), or lines shuffled plus word edits; the edit rate is bisected until the
  true Jaccard of the 5-gram shingle sets (`text.shingles`, the same shingles near dedup uses)
  is within 0.02 of the target.

Documents are shuffled and written as `docs/NNNNN.parquet` (10,000 per file) with the pipeline's
document columns (text, id, url, date, crawl, cc_language, source, offset; `source` is the part
name and `offset` the row, so the order key is the shuffled order). `truth.parquet` lists every
planted duplicate: id, original id, kind (exact/edit/boilerplate/shuffle) and true Jaccard.

`--smoke`: 300 documents (seconds; checks that the generator still runs).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.core.documents import schema_for
from gristmill.dedup.text import jaccard, normalize, shingles
from gristmill.input.wet import WetRecord, iter_wet_records

DATA = Path(os.environ.get("GRISTMILL_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
PER_FILE = 10_000


def load_lines(data: Path = DATA) -> tuple[list[str], list[str]]:
    """(pool of real lines with >= 4 words, boilerplate lines)."""
    lines: list[str] = []
    boiler: list[str] = []
    for wet in sorted((data / "cc" / "wet").glob("*.wet.gz")):
        for rec in iter_wet_records(wet):
            if isinstance(rec, WetRecord):
                ls = [l.strip() for l in rec.text.split("\n") if len(l.split()) >= 4]
                lines.extend(ls)
                if len(boiler) < 40:
                    boiler.extend(ls[:1])
    for name in ("wikitext-2.valid.txt", "wikitext-2.test.txt"):
        for l in (data / "corpus" / "en" / name).read_text().split("\n"):
            if len(l.split()) >= 4 and not l.strip().startswith("="):
                lines.append(l.strip())
    sh = (data / "corpus" / "en" / "tinyshakespeare.txt").read_text().split("\n")
    lines.extend(l.strip() for l in sh if len(l.split()) >= 4)
    with zipfile.ZipFile(data / "corpus" / "multi" / "udhr2.zip") as z:
        for n in sorted(z.namelist()):
            if n.endswith(".txt"):
                text = z.read(n).decode("utf-8", errors="replace")
                lines.extend(l.strip() for l in text.split("\n") if len(l.split()) >= 4)
    # pieces of at most 40 words, distinct after normalisation: a base document is then several
    # pieces, and two base documents share more than a small part only by a negligible chance
    pieces, seen = [], set()
    for l in lines:
        ws = l.split()
        for i in range(0, len(ws), 40):
            piece = " ".join(ws[i : i + 40])
            key = normalize(piece)
            if len(ws[i : i + 40]) >= 4 and key not in seen:
                seen.add(key)
                pieces.append(piece)
    return pieces, boiler


def _base_doc(rng: random.Random, lines: list[str]) -> str:
    target, out, words = rng.randint(80, 400), [], 0
    while words < target:
        l = lines[rng.randrange(len(lines))]
        out.append(l)
        words += len(l.split())
    return "\n".join(out)


def _exact_copy(rng: random.Random, text: str) -> str:
    ls = text.split("\n")
    i = rng.randrange(len(ls))
    ls[i] = ls[i].upper() + " !!"  # normalisation removes case and punctuation
    return "\n".join(l.replace(" ", "  ", 1) for l in ls) + "\n"


def _edit(rng: random.Random, text: str, q: float, vocab: list[str], seed: int) -> str:
    r = random.Random(seed)
    lines = []
    for l in text.split("\n"):
        ws = l.split(" ")
        lines.append(" ".join(vocab[r.randrange(len(vocab))] if r.random() < q else w for w in ws))
    return "\n".join(lines)


def _variant(
    rng: random.Random, text: str, target: float, kind: str, vocab: list[str], boiler: list[str]
) -> tuple[str, float]:
    base = shingles(text)
    seed = rng.getrandbits(32)
    if kind == "boilerplate":
        pre, post = [], []
        extra = list(boiler)
        rng.shuffle(extra)
        cand, j = text, 1.0
        for l in extra:  # add boilerplate lines until the similarity falls to the target
            (pre if rng.random() < 0.5 else post).append(l)
            cand = "\n".join(pre + [text] + post)
            j = jaccard(base, shingles(cand))
            if j <= target + 0.02:
                break
        if j > target + 0.02:  # not enough boilerplate: finish with word edits
            kind = "edit"
            text = cand
        else:
            return cand, j
    if kind == "shuffle":
        ls = text.split("\n")
        rng.shuffle(ls)
        text = "\n".join(ls)
    lo, hi, best = 0.0, 0.6, (text, jaccard(base, shingles(text)))
    for _ in range(12):  # bisect the word-edit rate
        q = (lo + hi) / 2
        cand = _edit(rng, text, q, vocab, seed)
        j = jaccard(base, shingles(cand))
        if abs(j - target) < abs(best[1] - target):
            best = (cand, j)
        if abs(j - target) <= 0.02:
            break
        lo, hi = (q, hi) if j > target else (lo, q)
    return best


def build(
    out: Path,
    n_docs: int,
    seed: int = 0,
    exact_share: float = 0.06,
    near_share: float = 0.18,
    data: Path = DATA,
    progress: bool = True,
    per_file: int = PER_FILE,
) -> dict:
    rng = random.Random(seed)
    lines, boiler = load_lines(data)
    vocab = sorted({w for l in lines[:20000] for w in l.split(" ") if w.isalpha()})
    n_exact, n_near = int(n_docs * exact_share), int(n_docs * near_share)
    n_base = n_docs - n_exact - n_near
    docs = [(f"doc-{i:08d}", _base_doc(rng, lines)) for i in range(n_base)]
    truth = {"id": [], "original": [], "kind": [], "jaccard": []}
    t0 = time.time()
    for i in range(n_exact + n_near):
        oid, otext = docs[rng.randrange(n_base)]
        if i < n_exact:
            kind, text, j = "exact", _exact_copy(rng, otext), 1.0
        else:
            kind = rng.choice(["edit", "boilerplate", "shuffle"])
            text, j = _variant(rng, otext, rng.uniform(0.5, 1.0), kind, vocab, boiler)
        did = f"doc-{n_base + i:08d}"
        docs.append((did, text))
        for k, v in zip(truth, (did, oid, kind, j)):
            truth[k].append(v)
        if progress and i % 5000 == 4999:
            print(f"  planted {i + 1:,}/{n_exact + n_near:,} ({time.time() - t0:.0f} s)", file=sys.stderr)
    rng.shuffle(docs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "docs").mkdir(exist_ok=True)
    schema = schema_for({})
    for p in range(0, len(docs), per_file):
        part = docs[p : p + per_file]
        name = f"dedup-corpus/part-{p // per_file:05d}"
        cols = {f.name: [None] * len(part) for f in schema}
        cols["text"] = [t for _, t in part]
        cols["id"] = [i for i, _ in part]
        cols["source"] = [name] * len(part)
        cols["offset"] = list(range(len(part)))
        pq.write_table(pa.table(cols, schema=schema), out / "docs" / f"{p // per_file:05d}.parquet", compression="zstd")
    pq.write_table(pa.table(truth), out / "truth.parquet")
    return {"docs": len(docs), "exact": n_exact, "near": n_near, "lines": len(lines)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="300 documents: checks that it runs")
    a = ap.parse_args()
    if a.smoke:
        a.docs = 300
    t = time.time()
    info = build(a.out, a.docs, a.seed)
    print(
        f"wrote {info['docs']:,} documents ({info['exact']:,} exact and {info['near']:,} near duplicates planted, "
        f"{info['lines']:,} distinct source lines) to {a.out} in {time.time() - t:.1f} s"
    )


if __name__ == "__main__":
    main()
