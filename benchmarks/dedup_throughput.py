"""Dedup throughput and accuracy on the ground-truth corpus, against datatrove and datasketch.

    python benchmarks/dedup_throughput.py --docs 10000 [--corpus DIR] [--bloom-gb 1.2] [--smoke]

One invocation builds (or reuses) the corpus of make_dedup_corpus.py and runs, each in its own
subprocess on one core (tasks=1) so peak RSS (ru_maxrss) and CPU time are its own (with the
processes it waited for: gristmill's executor runs every task in a child process of its own):

* gristmill `near_dedup` (all stages: signature, buckets, shingles, verify, cluster, filter)
  and `exact_dedup` (document level), via gristmill.pipeline.planning.on_parquet.run_on_parquet;
* datatrove's 4-stage MinHash with `MinhashConfig()` (spaCy word tokenizer for English),
  steps driven directly: MinhashDedupSignature, Buckets, Cluster, Filter;
* datasketch `MinHashLSH(threshold=0.8, num_perm=128)`, streaming query-then-insert in corpus
  order, on the same 5-gram shingles as ours (datasketch's sha1 hashing).

It scores each method with dedup_eval.score (recall per true-Jaccard bucket, precision), then
measures the Bloom filter alone: hash (xxh3_128) + test + set of new items on a filter of
--bloom-gb, after a warm-up pass over the file's pages, and projects a Common Crawl snapshot.
datatrove's MinHash needs spaCy (the bench extra, `pip install -e '.[bench]'`); without it that
side is skipped with a line saying so.

`--smoke`: 300 documents, a 10 MB Bloom filter and 50,000 items (seconds; checks that the
benchmark still runs, its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow.parquet as pq  # noqa: E402
from dedup_eval import score  # noqa: E402


def _ids(folder) -> set[str]:
    return set(pq.read_table(folder, columns=["id"]).column("id").to_pylist())


def _gristmill(step, params, corpus, work):
    from gristmill.pipeline.planning.on_parquet import run_on_parquet

    st = run_on_parquet(step, params, corpus / "docs", work / step, tasks=1, workers=1)
    return _ids(corpus / "docs") - _ids(st[-1].output)


def _datatrove(corpus, work):
    from datatrove.data import Document
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from loguru import logger

    logger.remove()
    t = pq.read_table(corpus / "docs", columns=["id", "text"]).to_pydict()

    def docs():
        return (Document(text=x, id=i) for i, x in zip(t["id"], t["text"]))

    def drain(out):  # some steps are generators, some return None
        for _ in out or ():
            pass

    cfg = MinhashConfig()
    drain(MinhashDedupSignature(str(work / "sigs"), config=cfg).run(docs(), 0, 1))
    for b in range(cfg.num_buckets):  # one buckets task per bucket, as datatrove runs it
        drain(MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=cfg).run(None, b, cfg.num_buckets))
    drain(MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=cfg).run(None, 0, 1))
    kept = {d.id for d in MinhashDedupFilter(str(work / "remove")).run(docs(), 0, 1)}
    return set(t["id"]) - kept


def _datasketch(corpus, work):
    from datasketch import MinHash, MinHashLSH

    from gristmill.dedup.text import normalize
    from gristmill.text.words import split_words

    t = pq.read_table(corpus / "docs", columns=["id", "text"]).to_pydict()
    lsh, removed = MinHashLSH(threshold=0.8, num_perm=128), set()
    for i, x in zip(t["id"], t["text"]):
        w = split_words(normalize(x))
        if not w:
            continue
        m = MinHash(num_perm=128)
        m.update_batch([" ".join(w[j : j + 5]).encode() for j in range(max(1, len(w) - 4))])
        if lsh.query(m):
            removed.add(i)
        else:
            lsh.insert(i, m)
    return removed


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (the executor's tasks)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _child(name, fn, args, q):
    c0, w0 = _cpu_s(), time.perf_counter()
    try:
        removed = fn(*args)
    except ImportError as e:  # a peer's dependency (spaCy for datatrove): the bench extra
        q.put({"name": name, "skipped": f"{e} (pip install -e '.[bench]')"})
        return
    q.put(
        {
            "name": name,
            "cpu_s": _cpu_s() - c0,
            "wall_s": time.perf_counter() - w0,
            # the largest of this process and its children (RUSAGE_CHILDREN: the largest child's)
            "maxrss_mb": max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
            / 1024,
            "removed": sorted(removed),
        }
    )


def measure(name, fn, *args) -> dict:
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_child, args=(name, fn, args, q))
    p.start()
    while True:
        try:
            r = q.get(timeout=5)
            break
        except queue.Empty:
            if not p.is_alive():
                raise RuntimeError(f"{name}: the measuring subprocess died (exit code {p.exitcode})") from None
    p.join()
    return r


def bloom_rate(gb: float, n: int) -> dict:
    from gristmill.dedup.bloom import BloomFilter, hash128

    d = Path(tempfile.mkdtemp())
    capacity = int(gb * 8e9 / 10.2)  # ~10.2 bits/item at p = 1e-2
    bf = BloomFilter.create(d / "f.bloom", capacity, 1e-2)
    # the items: real-sized paragraphs (~100 bytes)
    items = [
        b"paragraph %d of the bloom benchmark, about one hundred bytes long like a short web paragraph" % i
        for i in range(2 * n)
    ]
    bf._arr[:] = 0  # touch every page once: steady state of a long run, not first-touch page faults
    c0 = time.process_time()
    for s in range(0, n, 1 << 16):
        bf.test_and_set(hash128(items[s : s + (1 << 16)]))
    cold = n / (time.process_time() - c0)
    c0 = time.process_time()
    th = 0.0
    for s in range(n, 2 * n, 1 << 16):
        t = time.process_time()
        h = hash128(items[s : s + (1 << 16)])
        th += time.process_time() - t
        bf.test_and_set(h)
    total = time.process_time() - c0
    out = {
        "filter_gb": bf.size_bytes / 1e9,
        "k": bf.meta.k,
        "items_per_s": n / total,
        "hash_only_per_s": n / th,
        "test_and_set_only_per_s": n / (total - th),
        "first_pass_per_s": cold,
    }
    shutil.rmtree(d)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--bloom-gb", type=float, default=1.2)
    ap.add_argument("--bloom-items", type=int, default=4_000_000, help="new items timed on the Bloom filter")
    ap.add_argument("--skip", nargs="*", default=[], help="methods to skip: datatrove datasketch")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--smoke", action="store_true", help="300 documents, a small Bloom filter: checks that it runs")
    a = ap.parse_args()
    if a.smoke:
        a.docs, a.bloom_gb, a.bloom_items = 300, 0.01, 50_000
    corpus = a.corpus or Path(tempfile.gettempdir()) / f"gristmill-dedup-corpus-{a.docs}"
    if not (corpus / "truth.parquet").is_file():
        from make_dedup_corpus import build

        build(corpus, a.docs)
    n_docs = len(_ids(corpus / "docs"))
    mb = sum(len(x.encode()) for x in pq.read_table(corpus / "docs", columns=["text"]).column("text").to_pylist()) / 1e6
    work = Path(tempfile.mkdtemp())
    results = {}
    runs = [
        ("gristmill near_dedup", _gristmill, "near_dedup", {"threshold": 0.8}, corpus, work),
        ("gristmill exact_dedup", _gristmill, "exact_dedup", {"capacity": 10 * n_docs}, corpus, work),
    ]
    if "datatrove" not in a.skip:
        runs.append(("datatrove minhash (4 stages)", _datatrove, corpus, work / "dt"))
    if "datasketch" not in a.skip:
        runs.append(("datasketch MinHashLSH", _datasketch, corpus, work))
    for name, fn, *args in runs:
        r = measure(name, fn, *args)
        if "skipped" in r:
            print(f"{name} skipped: {r['skipped']}", flush=True)
            continue
        s = score(corpus, set(r["removed"]))
        results[name] = {
            **{k: v for k, v in r.items() if k != "removed"},
            **s,
            "docs_per_s_per_core": n_docs / r["cpu_s"],
            "mb_per_s_per_core": mb / r["cpu_s"],
        }
        print(
            f"{name}: {n_docs / r['cpu_s']:,.0f} docs/s/core, {mb / r['cpu_s']:.2f} MB/s, peak RSS "
            f"{r['maxrss_mb']:.0f} MB, removed {s['removed']}, recall(J>=0.85) {s['recall_j>=0.85']:.4f}, "
            f"precision {s['precision']:.4f}",
            flush=True,
        )
    shutil.rmtree(work, ignore_errors=True)
    print("\nrecall by true-Jaccard bucket (pairs):")
    buckets = next(iter(results.values()))["recall_by_bucket"]
    print(f"{'bucket':>10} {'pairs':>6} " + " ".join(f"{n[:24]:>24}" for n in results))
    for b in buckets:
        print(
            f"{b:>10} {buckets[b][1]:>6} " + " ".join(f"{results[n]['recall_by_bucket'][b][0]:>24.3f}" for n in results)
        )
    ours = results["gristmill near_dedup"]
    for peer in ("datatrove minhash (4 stages)", "datasketch MinHashLSH"):
        if peer in results:
            print(
                f"near_dedup vs {peer}: {ours['docs_per_s_per_core'] / results[peer]['docs_per_s_per_core']:.1f}x "
                f"docs/s per core, recall(J>=0.85) {ours['recall_j>=0.85']:.3f} vs "
                f"{results[peer]['recall_j>=0.85']:.3f}, "
                f"precision {ours['precision']:.3f} vs {results[peer]['precision']:.3f}"
            )
    bl = bloom_rate(a.bloom_gb, a.bloom_items)
    results["bloom"] = bl
    print(
        f"\nBloom filter {bl['filter_gb']:.2f} GB, k={bl['k']}: {bl['items_per_s']:,.0f} items/s/core hash+test+set "
        f"(hash {bl['hash_only_per_s']:,.0f}/s, test+set {bl['test_and_set_only_per_s']:,.0f}/s; "
        f"first pass over fresh pages {bl['first_pass_per_s']:,.0f}/s)"
    )
    # projection: one snapshot, ~3e9 documents, ~30 paragraphs each
    docs, paras = 3e9, 3e9 * 30
    near_h = docs / ours["docs_per_s_per_core"] / 3600
    ex_h = docs / results["gristmill exact_dedup"]["docs_per_s_per_core"] / 3600
    dup_share = ours["removed"] / n_docs
    print(
        f"\nprojection for ~3e9 documents: near_dedup {near_h:,.0f} CPU-hours; exact_dedup (documents) "
        f"{ex_h:,.0f} CPU-hours; Bloom at p=1e-4 for 3e9 docs {3e9 * 22.9 / 8e9:.1f} GB, for 9e10 paragraphs "
        f"{paras * 22.9 / 8e9:,.0f} GB (sliced over tasks); near_dedup cluster task ~16 B x documents in "
        f"clusters: {16 * docs * min(1, 2 * dup_share) / 1e9:.0f} GB at this corpus's duplicate share "
        f"({dup_share:.1%})."
    )
    results["projection"] = {"near_cpu_hours": near_h, "exact_doc_cpu_hours": ex_h}
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
