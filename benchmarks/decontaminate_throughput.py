"""Benchmark decontamination: gristmill's `decontaminate` against datatrove's n-gram
decontamination (`NGramsDecontIndexer`'s hashes, `NGramsDecontFilter`), one core, same input.

    python benchmarks/decontaminate_throughput.py [--repeat 3] [--scale 10] [--smoke]

Benchmark texts: real text of the shared corpus, one text per line: WikiText-2 (valid and
test), tiny Shakespeare and the 389 translations of the Universal Declaration of Human Rights
(udhr2.zip). Documents: every conversion record of the shared WET sample (609), labelled by
langid (lid.176.ftz), so that Chinese and Japanese pages take ICU's words as in a run.

Both sides use 13-grams and look up the same documents:

- gristmill: `Decontaminate` (`action: drop`, default settings), its index built into a fresh
  folder (the time of `prepare_index`: reading the file, words, hashing, sorting, writing);
  per document, the step's `run` over all documents (batches of 32, the filter's bookkeeping
  included).
- datatrove 0.10.1: its indexer's `compute_hashes` over the same texts (its run() needs
  lighteval's task registry; the hashes are written as its run writes them), then
  `NGramsDecontFilter` loads them into a Python dict (its memory measured with tracemalloc)
  and filters the documents. Its word tokenizer is spaCy's English one for every page.

Prints CPU seconds (time.process_time, best of --repeat), microseconds per document, the
index's build time and bytes per million benchmark n-grams, and the ratio of documents per CPU
second. `--scale N` adds generated benchmark texts (words drawn from the corpus's vocabulary by
frequency) until the index holds N million n-grams, and measures gristmill's build time, size
and lookup cost at that size (datatrove's dict would need ~100 bytes per n-gram: not run).
The peer needs spaCy (the bench extra: `pip install -e '.[bench]'`); without it its side is
skipped with a line saying so.

`--smoke`: the smaller WET file, 2,000 lines of the UDHR, one pass (seconds; checks that the benchmark
still runs, its figures mean nothing).
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import os
import sys
import tempfile
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
LID = REPO / "models" / "lid.176.ftz"
N = 13


def benchmark_texts(smoke: bool) -> list[str]:
    """One text per non-blank line of the shared corpus (2,000 lines of the UDHR with `smoke`)."""
    texts = []
    if not smoke:
        for name in ("wikitext-2.valid.txt", "wikitext-2.test.txt", "tinyshakespeare.txt"):
            texts += [t for t in (DATA / "corpus" / "en" / name).read_text().splitlines() if t.strip()]
    with zipfile.ZipFile(DATA / "corpus" / "multi" / "udhr2.zip") as z:
        for name in sorted(z.namelist()):
            if name.endswith(".txt"):
                texts += [t for t in z.read(name).decode("utf-8", "replace").splitlines() if t.strip()]
    return texts[:2000] if smoke else texts


def generated_texts(texts: list[str], ngrams: int, seed: int = 0) -> list[str]:
    """Texts of 40 words drawn from the vocabulary of `texts` by frequency, about `ngrams`
    n-grams in all (as good as distinct: 40 random words rarely repeat a 13-gram)."""
    from collections import Counter

    counts = Counter(w for t in texts for w in t.split())
    vocab = np.array(list(counts))
    p = np.array(list(counts.values()), dtype=np.float64)
    rng = np.random.default_rng(seed)
    rows = max(1, ngrams // (40 - N + 1))
    picks = rng.choice(len(vocab), size=(rows, 40), p=p / p.sum())
    return [" ".join(vocab[r]) for r in picks]


def documents(files):
    from gristmill.filters.langid import LangId
    from gristmill.input.wet import WetReader

    lid = LangId(model=str(LID), languages=None, min_score=0.0)
    return list(lid.run(WetReader([str(f) for f in files]).run()))


def copies(docs):
    out = [copy.copy(d) for d in docs]
    for d in out:
        d.metadata = dict(d.metadata)
    return out


def ours(bench: Path, index_dir: Path, docs, repeat: int) -> dict:
    from gristmill.dedup.decontaminate import Decontaminate

    t0 = time.process_time()
    step = Decontaminate(benchmarks=[{"path": str(bench), "field": "text"}], index_dir=str(index_dir))
    build = time.process_time() - t0
    best, kept = float("inf"), None
    for _ in range(repeat):
        step = Decontaminate(benchmarks=[{"path": str(bench), "field": "text"}], index_dir=str(index_dir))
        step.tables()  # mapped before the timer, as a task maps it before its first document
        batch = copies(docs)
        gc.collect()
        t0 = time.process_time()
        kept = sum(1 for _ in step.run(iter(batch), 0, 1))
        best = min(best, time.process_time() - t0)
    return {
        "build_s": build,
        "ngrams": step.index.ngrams,
        "bytes": step.index.bytes,
        "cpu_s": best,
        "dropped": len(docs) - kept,
    }


def datatrove(texts: list[str], folder: Path, docs, repeat: int) -> dict:
    from datatrove.pipeline.decont.n_grams import NGramsDecontConfig, NGramsDecontFilter, NGramsDecontIndexer
    from loguru import logger

    logger.remove()  # datatrove adds its own sink when imported

    config = NGramsDecontConfig(n_grams=N, find_query_ngrams=True, find_overlap_ngrams=False)
    NGramsDecontIndexer._requires_dependencies = []  # lighteval: only its run() reads task registries
    t0 = time.process_time()
    indexer = NGramsDecontIndexer(output_folder=str(folder), config=config)
    hashes = set()
    for text in texts:  # as its run() does for a task's documents: the n-grams of each text
        hashes.update(indexer.compute_hashes(text))
    array = np.array(list(hashes), dtype=config.hash_config.np_descr)
    with indexer.output_folder.open("bench.index.hashes", mode="wb") as f:
        array.tofile(f)
    build = time.process_time() - t0
    best, kept, dict_bytes = float("inf"), None, 0
    for _ in range(repeat):
        flt = NGramsDecontFilter(index_folder=str(folder), config=config)
        gc.collect()
        tracemalloc.start()
        flt.load_index_hashes()
        dict_bytes = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        batch = copies(docs)
        gc.collect()
        t0 = time.process_time()
        kept = sum(1 for _ in flt.run(iter(batch), 0, 1))
        best = min(best, time.process_time() - t0)
    return {"build_s": build, "ngrams": len(array), "bytes": dict_bytes, "cpu_s": best, "dropped": len(docs) - kept}


def line(name: str, r: dict, docs: int) -> str:
    per_m = r["bytes"] / max(r["ngrams"], 1) * 1e6
    return (
        f"{name}: documents {docs}, dropped {r['dropped']}, {r['cpu_s']:.3f} CPU s, "
        f"{r['cpu_s'] / docs * 1e6:,.0f} us per document; index of {r['ngrams']:,} n-grams built in "
        f"{r['build_s']:.2f} CPU s, {r['bytes'] / 1e6:.1f} MB, bytes per million n-grams: {per_m / 1e6:.2f} MB"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", type=float, default=10.0, help="millions of n-grams for the scale run (0: none)")
    ap.add_argument("--smoke", action="store_true", help="the smaller WET file, 2,000 UDHR lines, one pass")
    args = ap.parse_args()
    files = sorted((DATA / "cc" / "wet").glob("*.warc.wet.gz"))
    if args.smoke:
        files, args.repeat, args.scale = sorted(files, key=lambda f: f.stat().st_size)[:1], 1, 0
    if not files or not LID.is_file():
        print(f"need the WET sample ({DATA}/cc/wet) and {LID} (make models)", file=sys.stderr)
        return 2
    from loguru import logger

    logger.remove()
    texts = benchmark_texts(args.smoke)
    docs = documents(files)
    with tempfile.TemporaryDirectory() as tmp:
        bench = Path(tmp) / "bench.jsonl"
        bench.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        print(f"benchmark texts: {len(texts):,} ({bench.stat().st_size / 1e6:.1f} MB of JSONL); documents: {len(docs)}")
        a = ours(bench, Path(tmp) / "index", docs, args.repeat)
        print(line("gristmill decontaminate", a, len(docs)))
        if importlib.util.find_spec("spacy") is None:
            print("datatrove NGramsDecontFilter: skipped (needs spaCy: pip install -e '.[bench]')")
        else:
            (Path(tmp) / "dt").mkdir()
            b = datatrove(texts, Path(tmp) / "dt", docs, args.repeat)
            print(line("datatrove NGramsDecontFilter", b, len(docs)))
            print(f"ratio gristmill/datatrove (documents per CPU second): {b['cpu_s'] / a['cpu_s']:.2f}")
            size = b["bytes"] / b["ngrams"] / (a["bytes"] / a["ngrams"])
            print(f"ratio datatrove/gristmill (index bytes per n-gram): {size:.1f}")
        if args.scale > 0:
            big = Path(tmp) / "scale.jsonl"
            extra = generated_texts(texts, int(args.scale * 1e6) - a["ngrams"])
            big.write_text("".join(json.dumps({"text": t}) + "\n" for t in [*texts, *extra]))
            s = ours(big, Path(tmp) / "index", docs, args.repeat)
            print(line(f"gristmill decontaminate at scale ({len(texts) + len(extra):,} texts)", s, len(docs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
