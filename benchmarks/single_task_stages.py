"""The tokenizer's single-task stages at snapshot-like sizes: `shard_plan`, `manifest` and the
`tokenizer` stage's reading of the sample tasks' files, on generated metadata, timed in CPU
seconds (`time.process_time`) of the real functions.

    python benchmarks/single_task_stages.py [--files 2000] [--docs 1000000] [--shards 10000]
        [--buckets 4000] [--sample-files 4000] [--json OUT] [--write-calibration] [--smoke]

What grows with a crawl in these stages, and what is measured for each:
* `shard_lengths` (B tasks; before it was divided, `shard_plan`'s one task did this) opens every
  encode output, one file per (encode task, bucket): T x B files (4,000 x 4,000 for
  `configs/slurm-crawl.yaml`), and sorts every document's key (`tokenize.shards.bucket_cumsums`).
  Two bucket folders: `--files` files of 10 documents each (the per-file cost), and 4 files
  holding `--docs` documents (the per-document cost); CPU = per file x files + per document x
  documents.
* `shard_plan` (1 task) cuts the shards from the B buckets' running sums, memory-mapped
  (`--buckets` of them holding `--docs` documents in all): per bucket.
* `manifest` (`ManifestStep.run`) reads one list per shard task (`--buckets`) and links every
  shard (`--shards`) into `tokens/`: per list and per shard.
* `tokenizer` reads the run's sample merged from one file per sample task (`--sample-files`,
  each a share of the 100 MB `sample_bytes`): per sample file, at most `sample_bytes` in all.
  Its training (a config that trains a BPE) is on at most `sample_bytes`: bounded; measured by
  the scale run (`tokenizer` stage of `configs/scale-permissive.yaml`, full sample at every size).

`--write-calibration` stores the per-unit costs in `pipeline plan`'s calibration
(`scale_calibration.json`, key `single_task`). `--smoke`: tiny sizes (seconds; checks that the
benchmark still runs, its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def _encode_file(path: Path, docs: int, rng: np.random.Generator) -> None:
    """An encode output as `IntermediateWriter` writes it (one record batch), with 1-4 tokens a
    document: `shard_plan` reads keys, ties, flags and offsets, never the token values."""
    from gristmill.tokenize.shards import intermediate_schema

    lengths = rng.integers(1, 5, docs)
    offsets = np.zeros(docs + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.ones(int(offsets[-1]), np.uint16)))
    schema = intermediate_schema(pa.uint16())
    batch = pa.record_batch(
        [
            tokens,
            pa.array([f"d{i}" for i in range(docs)], pa.string()),
            pa.array(rng.random(docs) < 0.001, pa.bool_()),
            pa.array(rng.integers(0, 2**63, docs, dtype=np.uint64), pa.uint64()),
            pa.array(rng.integers(0, 2**63, docs, dtype=np.uint64), pa.uint64()),
        ],
        schema=schema,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as w:
        w.write_batch(batch)


def _lengths_cpu(root: Path) -> float:
    """A `shard_lengths` task's work on one bucket: `bucket_cumsums` and the two files written."""
    from gristmill.core.files import save_npy_atomic
    from gristmill.tokenize.shards import bucket_cumsums, bucket_dir

    c0 = time.process_time()
    for split, cum in bucket_cumsums(bucket_dir(root, 0)).items():
        save_npy_atomic(root / "lengths" / f"{split}_00000.npy", cum)
    return time.process_time() - c0


def plan_from_lengths(work: Path, buckets: int, docs: int, shard_tokens: int) -> dict:
    """`shard_plan`'s one task over `buckets` buckets' running sums (`docs` documents each),
    memory-mapped as `ShardPlanStep` reads them; shards of ~`shard_tokens`."""
    from gristmill.core.files import save_npy_atomic
    from gristmill.tokenize.shards import plan_shards
    from gristmill.tokenize.stages import _lengths_of

    rng = np.random.default_rng(2)
    for b in range(buckets):
        for split, n in (("train", docs), ("val", max(docs // 1000, 1))):
            save_npy_atomic(work / f"{split}_{b:05d}.npy", np.cumsum(rng.integers(1, 2000, n)))
    c0 = time.process_time()
    plan = plan_shards(work, buckets, shard_tokens, _lengths_of(work))
    cpu = time.process_time() - c0
    return {"buckets": buckets, "documents": buckets * docs, "shards": len(plan["shards"]), "cpu_s": round(cpu, 4)}


def shard_plan(work: Path, files: int, docs: int) -> dict:
    rng = np.random.default_rng(0)
    many, big = work / "many", work / "big"
    for f in range(files):
        _encode_file(many / "00000" / f"{f:05d}.arrow", 10, rng)
    for f in range(4):
        _encode_file(big / "00000" / f"{f:05d}.arrow", docs // 4, rng)
    c_many = min(_lengths_cpu(many) for _ in range(2))
    c_big = min(_lengths_cpu(big) for _ in range(2))
    # two points, (files, documents): (F, 10 F) and (4, D)
    d1, d2 = 10 * files, 4 * (docs // 4)
    per_doc = max((c_big - c_many * 4 / files) / (d2 - 4 * d1 / files), 0.0)
    per_file = max((c_many - per_doc * d1) / files, 0.0)
    return {
        "files_point": {"files": files, "documents": d1, "cpu_s": round(c_many, 4)},
        "docs_point": {"files": 4, "documents": d2, "cpu_s": round(c_big, 4)},
        "per_file_s": per_file,
        "per_document_s": per_doc,
    }


def manifest(work: Path, buckets: int, shards: int) -> dict:
    from gristmill.tokenize.stages import ManifestStep

    plan_dir, shard_dir, tok_dir = work / "plan", work / "shards", work / "tokenizer"
    for d in (plan_dir, shard_dir / "shards", tok_dir):
        d.mkdir(parents=True, exist_ok=True)
    (tok_dir / "tokenizer.json").write_text("{}")
    meta = {"source": "x", "vocab_size": 50257, "eos_id": 0, "bos_id": None, "pad_id": None, "engine": "tiktoken"}
    (tok_dir / "engine.json").write_text(json.dumps(meta))
    planned = []
    per_bucket: list[list[dict]] = [[] for _ in range(buckets)]
    for s in range(shards):
        path = f"train-{s:05d}.arrow"
        (shard_dir / "shards" / path).write_bytes(b"")
        e = {"path": path, "split": "train", "documents": 1000, "tokens": 100_000_000, "sha256": "0" * 64}
        planned.append({"path": path})
        per_bucket[s * buckets // shards].append(e)
    for b, entries in enumerate(per_bucket):
        (shard_dir / f"{b:05d}.json").write_text(json.dumps(entries))
    (plan_dir / "plan.json").write_text(json.dumps({"buckets": buckets, "shards": planned}))
    step = ManifestStep(plan_dir, shard_dir, tok_dir, work / "tokens", seed=0, val_fraction=0.0, shard_tokens=1)
    c0 = time.process_time()
    list(step.run(None, 0, 1))
    cpu = time.process_time() - c0
    assert len(json.loads((work / "tokens" / "manifest.json").read_text())["shards"]) == shards
    return {"buckets": buckets, "shards": shards, "cpu_s": round(cpu, 4)}


def sample_merge(work: Path, files: int, budget: int) -> dict:
    """`read_samples` over `files` sample files holding `budget` bytes of text in all."""
    from gristmill.tokenize.stages import read_samples

    rng = np.random.default_rng(1)
    per_file = max(budget // files, 1)
    doc = 5000
    for f in range(files):
        n = max(per_file // doc, 1)
        keys = np.sort(rng.integers(0, 2**63, n, dtype=np.uint64))
        t = pa.table({"key": keys, "id": [f"{f}-{i}" for i in range(n)], "text": ["x" * doc] * n})
        pq.write_table(t, work / f"sample_{f:05d}.parquet", row_group_size=16)
    c0 = time.process_time()
    read = sum(len(d.text) for d in read_samples(work, budget))
    cpu = time.process_time() - c0
    return {"files": files, "budget_bytes": budget, "read_bytes": read, "cpu_s": round(cpu, 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000, help="shard_plan: encode files of one bucket (per-file cost)")
    ap.add_argument("--docs", type=int, default=1_000_000, help="shard_plan: documents of one bucket (per-doc cost)")
    ap.add_argument("--buckets", type=int, default=4000, help="manifest: shard tasks (lists read)")
    ap.add_argument("--shards", type=int, default=10_000, help="manifest: shards linked")
    ap.add_argument("--sample-files", type=int, default=4000, help="tokenizer: sample tasks' files merged")
    ap.add_argument("--sample-bytes", type=int, default=100_000_000)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--write-calibration", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    if a.smoke:
        if a.write_calibration:
            ap.error("--smoke figures mean nothing: not with --write-calibration")
        a.files, a.docs, a.buckets, a.shards, a.sample_files, a.sample_bytes = 20, 4000, 8, 20, 8, 200_000
    work = Path(tempfile.mkdtemp(prefix="single_task_"))
    try:
        (work / "sp").mkdir()
        sp = shard_plan(work / "sp", a.files, a.docs)
        print(
            f"shard_lengths: {sp['files_point']['files']:,} files of 10 documents: "
            f"{sp['files_point']['cpu_s']:.3f} CPU s; "
            f"{sp['docs_point']['documents']:,} documents in 4 files: {sp['docs_point']['cpu_s']:.3f} CPU s -> "
            f"{sp['per_file_s'] * 1e6:.1f} us a file + {sp['per_document_s'] * 1e9:.0f} ns a document"
        )
        (work / "pl").mkdir()
        pl = plan_from_lengths(work / "pl", a.buckets, a.docs // a.buckets + 1, 100_000_000)
        print(
            f"shard_plan: {pl['buckets']:,} buckets' sums ({pl['documents']:,} documents, {pl['shards']:,} shards): "
            f"{pl['cpu_s']:.3f} CPU s"
        )
        mf = manifest(work / "mf", a.buckets, a.shards)
        print(f"manifest: {mf['buckets']:,} shard lists, {mf['shards']:,} shards linked: {mf['cpu_s']:.3f} CPU s")
        (work / "tk").mkdir()
        tk = sample_merge(work / "tk", a.sample_files, a.sample_bytes)
        print(
            f"tokenizer: the sample merged from {tk['files']:,} files ({tk['read_bytes'] / 1e6:.0f} MB read of a "
            f"{tk['budget_bytes'] / 1e6:.0f} MB budget): {tk['cpu_s']:.2f} CPU s"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "measured": time.strftime("%Y-%m-%d"),
        "command": "PYTHONPATH=src python benchmarks/single_task_stages.py "
        f"--files {a.files} --docs {a.docs} --buckets {a.buckets} --shards {a.shards} "
        f"--sample-files {a.sample_files}",
        "shard_lengths": sp,
        "shard_plan": pl,
        "manifest": mf,
        "tokenizer_merge": tk,
    }
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    if a.write_calibration:
        from gristmill.pipeline.planning.projection import CALIBRATION_PATH

        cal = json.loads(CALIBRATION_PATH.read_text())
        cal["single_task"] = result
        CALIBRATION_PATH.write_text(json.dumps(cal, indent=1) + "\n")
        print(f"wrote {CALIBRATION_PATH} (single_task)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
