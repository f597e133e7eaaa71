"""Tokenization, gristmill's encode step against datatrove's DocumentTokenizer, same tokenizer file.

    python benchmarks/tokenize_throughput.py [--tokenizer PATH] [--repeat 3] [--copies 4] [--smoke]

Both run in this one process on the same documents (the shared WET sample's records, repeated
`--copies` times with distinct ids) and the same tokenizer.json (GPT-2's files, converted once).
datatrove runs as its users run it: `DocumentTokenizer(output_folder, tokenizer_name_or_path=<local
tokenizer.json>, eos_token="<|endoftext|>")`, encoding with HF `encode_batch` and writing its
.ds/.index files with the in-file shuffle. gristmill runs its `EncodeStep`: encode (tiktoken, the
engine the run picks after checking it gives HF's ids) and write the intermediate Arrow file.
Both with one encoding thread (TOKENIZERS_PARALLELISM=false; tiktoken num_threads=1), timed in
CPU seconds of this process, so MB/s is per core. Prints each and the ratio.

`--smoke`: the first 100 documents, one copy, one run of each (seconds; checks that the
benchmark still runs, its figures mean nothing).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core for HF too: per-core figures

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))


def documents(copies: int, limit: int | None = None):
    from datatrove.data import Document

    from gristmill.input.wet import WetReader

    base = list(WetReader([str(f) for f in sorted((DATA / "cc" / "wet").glob("*.warc.wet.gz"))]).run(None, 0, 1))
    base = base[:limit]
    return [Document(text=d.text, id=f"{d.id}#{c}", metadata={}) for c in range(copies) for d in base]


def run_datatrove(docs, tokenizer_json: Path, work: Path) -> dict:
    from datatrove.pipeline.tokens import DocumentTokenizer

    step = DocumentTokenizer(
        output_folder=str(work), tokenizer_name_or_path=str(tokenizer_json), eos_token="<|endoftext|>", seed=0
    )
    list(step.run(iter(docs), 0, 1) or [])
    return {"tokens": int(step.stats["tokens"].total)}


def run_gristmill(docs, tokenizer_folder: Path, work: Path) -> dict:
    from gristmill.tokenize.stages import EncodeStep

    step = EncodeStep(tokenizer_folder, seed=0, val_fraction=0.01, threads=1, batch_docs=1000)
    step.stage_folder = work  # as the planner sets it: the Arrow files go to <work>/output/
    list(step.run(iter(docs), 0, 1))
    return {"tokens": int(step.stats["tokens"].total)}


def measure(name, fn, docs, arg, repeat) -> dict:
    best = None
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as work:
            gc.collect()
            c0, w0 = time.process_time(), time.perf_counter()
            out = fn(docs, arg, Path(work))
            res = {"name": name, "cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0, **out}
        if best is None or res["cpu_s"] < best["cpu_s"]:
            best = res
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tokenizer",
        type=Path,
        default=DATA / "tokenizers" / "gpt2",
        help="tokenizer.json, GPT-2 folder or .tiktoken file (converted to tokenizer.json)",
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--copies", type=int, default=4, help="repeat the sample's documents this many times")
    ap.add_argument("--smoke", action="store_true", help="100 documents, one run each: checks that it runs")
    args = ap.parse_args()
    limit = None
    if args.smoke:
        args.copies, args.repeat, limit = 1, 1, 100
    if not (DATA / "cc" / "wet").is_dir():
        print(f"need the WET sample in {DATA}/cc/wet", file=sys.stderr)
        return 2
    from loguru import logger

    from gristmill.tokenize import encode, tokenizer

    logger.remove()
    docs = documents(args.copies, limit)
    mb = sum(len(d.text.encode("utf-8")) for d in docs) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tok = tokenizer.load(args.tokenizer)
        tok.save(str(folder / "tokenizer.json"))
        info = tokenizer.special_ids(tok)
        fast = encode.tiktoken_from_hf(tok)
        engine = "hf"
        if fast.encoding is not None and encode.compare(tok, fast.encoding, [d.text for d in docs[:1000]])[1] is None:
            engine = "tiktoken"
        (folder / "engine.json").write_text(
            json.dumps({"engine": engine, "vocab_size": info.vocab_size, "eos_id": info.eos_id})
        )
        ours = measure(f"gristmill ({engine})", run_gristmill, docs, folder, args.repeat)
        theirs = measure("datatrove", run_datatrove, docs, folder / "tokenizer.json", args.repeat)
    print(
        f"input: {len(docs)} documents, {mb:.2f} MB of text; tokenizer {args.tokenizer}; one process, one"
        " encoding thread, CPU time (best of runs)"
    )
    print(f"{'tokenizer':<22} {'tokens':>10} {'cpu s':>8} {'wall s':>8} {'MB/s/core':>10} {'Mtok/s/core':>12}")
    for r in (ours, theirs):
        print(
            f"{r['name']:<22} {r['tokens']:>10,} {r['cpu_s']:>8.2f} {r['wall_s']:>8.2f} {mb / r['cpu_s']:>10.2f}"
            f" {r['tokens'] / r['cpu_s'] / 1e6:>12.2f}"
        )
    if ours["tokens"] != theirs["tokens"]:
        print(f"note: token counts differ ({ours['tokens']} vs {theirs['tokens']})")
    print(f"ratio gristmill/datatrove (MB/s per core): {theirs['cpu_s'] / ours['cpu_s']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
