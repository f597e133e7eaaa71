"""Arrow token shards: the encode tasks' intermediate files and the final shuffled shards.

Contract (GUIDE.md, "Token shards"): `tokens/manifest.json` plus `tokens/<split>-NNNNN.arrow`,
Arrow IPC file format, uncompressed, one record batch per shard, one row per document:
`tokens: large_list<uint16|uint32>` ending in EOS, then `id`.

Determinism. Each document's split and place are functions of its id alone:
- split: `xxh3_64("gristmill-val:" + id) < val_fraction · 2^64` → val. Adding documents never
  moves an existing one between splits, and the split does not change with the shuffle seed.
- order: documents sorted by `(xxh3_64(id, seed), xxh3_64(text))` — a seeded global shuffle that
  never looks at which task encoded a document, so 1 or 40 tasks write the same bytes.
Shards are cut in that order once they reach `shard_tokens` tokens (documents are never split).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import xxhash

FORMAT = "gristmill-tokens"
VERSION = 1
VAL_SALT = b"gristmill-val:"


def token_dtype(vocab_size: int) -> pa.DataType:
    """uint16 holds ids 0..65535, so a vocabulary of up to 65536 entries."""
    return pa.uint16() if vocab_size <= 65536 else pa.uint32()


def shard_schema(dtype: pa.DataType) -> pa.Schema:
    return pa.schema([pa.field("tokens", pa.large_list(pa.field("item", dtype, nullable=False)), nullable=False),
                      pa.field("id", pa.string())])


def intermediate_schema(dtype: pa.DataType) -> pa.Schema:
    return shard_schema(dtype).append(pa.field("val", pa.bool_())).append(pa.field("key", pa.uint64())) \
        .append(pa.field("tie", pa.uint64()))


def is_val(doc_id: str, val_fraction: float) -> bool:
    return xxhash.xxh3_64_intdigest(VAL_SALT + doc_id.encode("utf-8")) < int(val_fraction * 2**64)


def shuffle_key(doc_id: str, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(doc_id.encode("utf-8"), seed=seed)


def tokens_array(token_lists: list[list[int]], eos_id: int, dtype: pa.DataType) -> pa.LargeListArray:
    """One list per document, each followed by EOS, built from flat numpy buffers."""
    lengths = np.fromiter((len(t) + 1 for t in token_lists), dtype=np.int64, count=len(token_lists))
    offsets = np.zeros(len(token_lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    eos = (eos_id,)
    flat = itertools.chain.from_iterable(itertools.chain.from_iterable((t, eos) for t in token_lists))
    values = np.fromiter(flat, dtype=dtype.to_pandas_dtype(), count=int(offsets[-1]))
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, type=dtype))


class IntermediateWriter:
    """One encode task's output: `<folder>/<rank>.arrow`, written as `.tmp` and renamed on close."""

    def __init__(self, path: Path, dtype: pa.DataType, eos_id: int, seed: int, val_fraction: float):
        self.path, self.dtype, self.eos_id, self.seed, self.val_fraction = path, dtype, eos_id, seed, val_fraction
        self.tmp = path.with_name(path.name + ".tmp")
        self.tmp.parent.mkdir(parents=True, exist_ok=True)
        self.schema = intermediate_schema(dtype)
        self._sink = pa.OSFile(str(self.tmp), "wb")
        self._writer = pa.ipc.new_file(self._sink, self.schema)
        self.documents = self.tokens = 0

    def write(self, ids: list[str], texts: list[str], token_lists: list[list[int]]) -> None:
        if not ids:
            return
        tokens = tokens_array(token_lists, self.eos_id, self.dtype)
        batch = pa.record_batch([
            tokens,
            pa.array(ids, pa.string()),
            pa.array([is_val(i, self.val_fraction) for i in ids], pa.bool_()),
            pa.array([shuffle_key(i, self.seed) for i in ids], pa.uint64()),
            pa.array([xxhash.xxh3_64_intdigest(t) for t in texts], pa.uint64()),
        ], schema=self.schema)
        self._writer.write_batch(batch)
        self.documents += len(ids)
        self.tokens += len(tokens.values)

    def close(self) -> None:
        self._writer.close()
        self._sink.close()
        os.replace(self.tmp, self.path)


def sha256_file(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks (shards can be GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_shard(path: Path, values: np.ndarray, lengths: np.ndarray, ids: list[str], dtype: pa.DataType,
                split: str) -> None:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, type=dtype))
    schema = shard_schema(dtype).with_metadata({"format": f"{FORMAT}/{VERSION}", "split": split})
    batch = pa.record_batch([tokens, pa.array(ids, pa.string())], schema=schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)


def merge_shards(inputs: Iterable[Path], out_dir: Path, *, tokenizer_file: Path, tokenizer_meta: dict,
                 dtype: pa.DataType, seed: int, val_fraction: float, shard_tokens: int,
                 progress=None) -> dict:
    """Shuffle every encoded document globally and write `out_dir` (shards + manifest + tokenizer).

    Only the sort keys are held in memory; token lists are gathered per shard from the
    memory-mapped intermediate files. The directory is built as `<out_dir>.tmp` and swapped in
    whole, so a killed merge never leaves a half-written `tokens/`.
    """
    tables = []
    for path in sorted(inputs):
        tables.append(pa.ipc.open_file(pa.memory_map(str(path))).read_all())  # zero-copy views
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")

    # per document: (file, row, key, tie, val) as flat arrays
    file_idx, row_idx, keys, ties, vals = [], [], [], [], []
    for f, t in enumerate(tables):
        n = t.num_rows
        file_idx.append(np.full(n, f, dtype=np.int32))
        row_idx.append(np.arange(n, dtype=np.int64))
        keys.append(t.column("key").to_numpy())
        ties.append(t.column("tie").to_numpy())
        vals.append(t.column("val").to_numpy(zero_copy_only=False))
    cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dtype=dt)  # noqa: E731
    file_idx, row_idx = cat(file_idx, np.int32), cat(row_idx, np.int64)
    keys, ties, vals = cat(keys, np.uint64), cat(ties, np.uint64), cat(vals, bool)
    order = np.lexsort((ties, keys))  # by key, then tie

    # per file, the document token slices: combine chunks once per file (views stay mmapped)
    views = []
    for t in tables:
        col = t.column("tokens").combine_chunks() if t.num_rows else None
        views.append(None if col is None else (col.offsets.to_numpy(), col.values.to_numpy(), t.column("id").to_pylist()))

    shards: list[dict] = []
    np_dtype = dtype.to_pandas_dtype()
    for split in ("train", "val"):
        picked = order[vals[order] == (split == "val")]
        chunk_vals, chunk_lens, chunk_ids, count = [], [], [], 0

        def flush():
            nonlocal chunk_vals, chunk_lens, chunk_ids, count
            if not chunk_ids:
                return
            name = f"{split}-{sum(1 for s in shards if s['split'] == split):05d}.arrow"
            values = np.concatenate(chunk_vals).astype(np_dtype, copy=False)
            write_shard(tmp / name, values, np.asarray(chunk_lens, dtype=np.int64), chunk_ids, dtype, split)
            shards.append({"path": name, "split": split, "documents": len(chunk_ids), "tokens": int(len(values)),
                           "sha256": sha256_file(tmp / name)})
            if progress:
                progress(shards[-1])
            chunk_vals, chunk_lens, chunk_ids, count = [], [], [], 0

        for i in picked:
            offsets, values, ids = views[file_idx[i]]
            r = row_idx[i]
            a, b = offsets[r], offsets[r + 1]
            chunk_vals.append(values[a:b])
            chunk_lens.append(b - a)
            chunk_ids.append(ids[r])
            count += b - a
            if count >= shard_tokens:
                flush()
        flush()

    splits = {}
    for split in ("train", "val"):
        mine = [s for s in shards if s["split"] == split]
        splits[split] = {"shards": len(mine), "documents": sum(s["documents"] for s in mine),
                         "tokens": sum(s["tokens"] for s in mine)}
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": {"file": "tokenizer.json", "sha256": sha256_file(tmp / "tokenizer.json"), **tokenizer_meta},
        "dtype": str(dtype),
        "seed": seed,
        "split": {"val_fraction": val_fraction, "method": "xxh3_64('gristmill-val:' + id) < val_fraction * 2**64"},
        "shuffle": "documents sorted by (xxh3_64(id, seed), xxh3_64(text))",
        "shard_tokens": shard_tokens,
        "shards": shards,
        "splits": splits,
        "totals": {"documents": sum(s["documents"] for s in shards), "tokens": sum(s["tokens"] for s in shards)},
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    del tables, views
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return manifest
