"""Near dedup's two removal rules on the same verified edges of a finished run.

    python benchmarks/near_removal_rules.py RUN_DIR [--truth WET_DIR/truth.jsonl] [--smoke]

RUN_DIR: a run with `near_dedup` (verify on). Reads the verify stage's edges, applies
`lsh.components` (every document of a connected component but its first goes) and
`lsh.kept_neighbour` (a document goes only for a kept earlier document it is a verified pair
with), and prints for each: documents removed, CPU seconds, and, checked on the text, the share
of a random sample of removals whose shingle Jaccard (the stage's own shingles, with the
document's language) with the document they were removed for is >= the threshold; with a truth
file from `make_wet_corpus.py`, the recall on its planted near pairs (J >= 0.85).

`--smoke`: a sample of 200 removals; without RUN_DIR, the run is made first as `scale_run.py
--smoke` makes it (a 2 MB generated corpus, the permissive config, one task) in a temporary
directory (a minute; checks that the benchmark still runs, its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from scale_run import (
    CONFIGS,
    SMOKE_GB,
    _stage_folder,
    corpus,
    jaccard_to_kept,
    keys_by_id,
    run_pipeline,
    shingles_by_key,
)

from gristmill.dedup.lsh import components, kept_neighbour
from gristmill.dedup.near import _shard_edges


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, nargs="?", help="a finished run (with --smoke: made when not given)")
    ap.add_argument("--truth", type=Path)
    ap.add_argument("--sample", type=int, default=20000)
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--smoke", action="store_true", help="200 removals checked, a small run made: checks that it runs")
    args = ap.parse_args()
    if args.run is None and not args.smoke:
        ap.error("RUN_DIR is required (or --smoke)")
    work = None
    if args.smoke:
        args.sample = min(args.sample, 200)
    if args.run is None:
        work = Path(tempfile.mkdtemp(prefix="gristmill-near-rules-"))
        wet = corpus(work, SMOKE_GB, seed=1)
        args.run, args.truth = work / "run", args.truth or wet / "truth.jsonl"
        run_pipeline(CONFIGS["permissive"], wet, args.run, tasks=1, workers=1)
    try:
        compare(args)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def compare(args) -> None:
    verified = _stage_folder(args.run, "near_dedup_verify") / "verified"
    shards = len(list(verified.glob("shard_*"))) or 1
    loaders = [(lambda s=s: _shard_edges(verified, s)) for s in range(shards)]
    rules = {}
    for name, rule in (("components", components), ("kept_neighbour", kept_neighbour)):
        t = time.process_time()
        nodes, kept_for = rule(loaders)
        rules[name] = (dict(zip(nodes.tolist(), kept_for.tolist())), time.process_time() - t)
    rng = random.Random(0)
    samples = {}
    for name, (root, _) in rules.items():
        removed = sorted(k for k, r in root.items() if k != r)
        samples[name] = rng.sample(removed, min(args.sample, len(removed)))
    # both rules' samples and the documents kept in their place, read in one pass
    sh = shingles_by_key(args.run, {x for name, s in samples.items() for k in s for x in (k, rules[name][0][k])})
    key_of, pairs = keys_by_id(args.run), []
    if args.truth:
        truth = [json.loads(x) for x in args.truth.read_text().splitlines()]
        pairs = [
            r
            for r in truth
            if r["kind"] == "near" and r["jaccard"] >= 0.85 and r["original"] in key_of and r["copy"] in key_of
        ]
    for name, (root, cpu) in rules.items():
        removed = {k for k, r in root.items() if k != r}
        js = np.array(jaccard_to_kept(sh, root, samples[name]))
        line = (
            f"{name}: {len(root):,} documents in some pair, {len(removed):,} removed, {cpu:.2f} CPU s; "
            f"{len(js):,} removals checked: Jaccard >= {args.threshold} with the document kept in their place "
            f"{np.mean(js >= args.threshold):.2%} (min {js.min():.3f})"
        )
        if pairs:
            found = sum(key_of[r["original"]] in removed or key_of[r["copy"]] in removed for r in pairs)
            line += f"; recall {found / len(pairs):.4f} on {len(pairs):,} planted pairs"
        print(line)


if __name__ == "__main__":
    main()
