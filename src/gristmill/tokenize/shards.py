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

Parallel shuffle. The shuffle key's range is cut into P equal buckets (`bucket_of`); every encode
task writes its documents of bucket p to `<p>/<rank>.arrow`. Sorting each bucket by
`(key, tie)` and taking the buckets in order is the global order, whatever N and P are. Where a
shard is cut depends on every earlier document's length, so one cheap pass (`plan_shards`,
1 task) reads only the small columns (key, tie, val, list offsets; no token values) bucket by
bucket and records each shard as pieces `(bucket, first, stop)` of the sorted buckets. Shard task
p writes the shards that start in its bucket (`write_planned_shards`), reading the head of later
buckets when a shard runs past its own; `finish_tokens` (1 task) gathers them into `tokens/`.
The files are those the single sorted pass wrote before, byte for byte.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash

from gristmill.core.files import on_failure, remove_quietly, replacing
from gristmill.core.run_folder import AS_GIVEN, RunFolder

FORMAT = "gristmill-tokens"
VERSION = 1
VAL_SALT = b"gristmill-val:"


def token_dtype(vocab_size: int) -> pa.DataType:
    """uint16 holds ids 0..65535, so a vocabulary of up to 65536 entries."""
    return pa.uint16() if vocab_size <= 65536 else pa.uint32()


def shard_schema(dtype: pa.DataType) -> pa.Schema:
    return pa.schema(
        [
            pa.field("tokens", pa.large_list(pa.field("item", dtype, nullable=False)), nullable=False),
            pa.field("id", pa.string()),
        ]
    )


def intermediate_schema(dtype: pa.DataType) -> pa.Schema:
    return (
        shard_schema(dtype)
        .append(pa.field("val", pa.bool_()))
        .append(pa.field("key", pa.uint64()))
        .append(pa.field("tie", pa.uint64()))
    )


def is_val(doc_id: str, val_fraction: float) -> bool:
    return xxhash.xxh3_64_intdigest(VAL_SALT + doc_id.encode("utf-8")) < int(val_fraction * 2**64)


def shuffle_key(doc_id: str, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(doc_id.encode("utf-8"), seed=seed)


def tokens_array(token_lists: list, eos_id: int, dtype: pa.DataType) -> pa.LargeListArray:
    """One list per document, each followed by EOS, built from flat numpy buffers."""
    lengths = np.fromiter((len(t) + 1 for t in token_lists), dtype=np.int64, count=len(token_lists))
    offsets = np.zeros(len(token_lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    np_dtype = dtype.to_pandas_dtype()
    if not any(isinstance(t, np.ndarray) for t in token_lists):
        eos = (eos_id,)
        flat = itertools.chain.from_iterable(itertools.chain.from_iterable((t, eos) for t in token_lists))
        values = np.fromiter(flat, dtype=np_dtype, count=int(offsets[-1]))
    else:  # a long document's ids come as an array (tiktoken's uint32): copied in, not iterated
        values = np.empty(int(offsets[-1]), dtype=np_dtype)
        for t, a, b in zip(token_lists, offsets[:-1].tolist(), offsets[1:].tolist()):
            if isinstance(t, np.ndarray) and t.size and int(t.max()) > np.iinfo(np_dtype).max:
                raise OverflowError(f"token id {int(t.max())} does not fit {np_dtype.__name__}")
            values[a : b - 1] = t
            values[b - 1] = eos_id
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, type=dtype))


class IntermediateWriter:
    """One encode task's output: `<folder>/<rank>.arrow`, written as `.tmp` and renamed on close."""

    def __init__(self, path: Path, dtype: pa.DataType, eos_id: int, seed: int, val_fraction: float):
        self.path, self.dtype, self.eos_id, self.seed, self.val_fraction = path, dtype, eos_id, seed, val_fraction
        self.tmp = path.with_name(path.name + ".tmp")
        self.tmp.parent.mkdir(parents=True, exist_ok=True)
        self.schema = intermediate_schema(dtype)
        self._sink = self._writer = None
        with on_failure(self.abort, self.path):
            self._sink = pa.OSFile(str(self.tmp), "wb")
            self._writer = pa.ipc.new_file(self._sink, self.schema)
        self.documents = self.tokens = 0

    def write(
        self, ids: list[str], texts: list[str], token_lists: list[list[int]], val: list[bool] | None = None
    ) -> None:
        if not ids:
            return
        tokens = tokens_array(token_lists, self.eos_id, self.dtype)
        if val is None:
            val = [is_val(i, self.val_fraction) for i in ids]
        batch = pa.record_batch(
            [
                tokens,
                pa.array(ids, pa.string()),
                pa.array(val, pa.bool_()),
                pa.array([shuffle_key(i, self.seed) for i in ids], pa.uint64()),
                pa.array([xxhash.xxh3_64_intdigest(t) for t in texts], pa.uint64()),
            ],
            schema=self.schema,
        )
        with on_failure(self.abort, self.path):  # a full disk: no `.tmp` left, the file named
            self._writer.write_batch(batch)
        self.documents += len(ids)
        self.tokens += len(tokens.values)

    def close(self) -> None:
        with on_failure(self.abort, self.path):
            self._writer.close()
            self._sink.close()
            os.replace(self.tmp, self.path)

    def abort(self) -> None:
        """Drop the file being written (its task failed)."""
        for part in (self._writer, self._sink):
            try:
                if part is not None:
                    part.close()
            except Exception:  # noqa: BLE001 (the same full disk): the write's error is the one to report
                pass
        remove_quietly(self.tmp)


def sha256_file(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks (shards can be GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_shard(
    path: Path, values: np.ndarray, lengths: np.ndarray, ids: list[str], dtype: pa.DataType, split: str
) -> None:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, type=dtype))
    schema = shard_schema(dtype).with_metadata({"format": f"{FORMAT}/{VERSION}", "split": split})
    batch = pa.record_batch([tokens, pa.array(ids, pa.string())], schema=schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)


KEY_SPACE = 2**64


def bucket_of(key: int, buckets: int) -> int:
    """The bucket of a shuffle key: equal ranges of the 64-bit key space, in key order."""
    return (key * buckets) >> 64


def bucket_dir(root: Path, bucket: int) -> Path:
    return root / f"{bucket:05d}"


class BucketedWriter:
    """One encode task's output split by shuffle-key range: `<root>/<bucket>/<rank>.arrow`.

    A bucket's file is opened on its first document, so a task writes at most `buckets` files and
    holds one encode batch in memory.
    """

    def __init__(
        self, root: Path, rank: int, buckets: int, dtype: pa.DataType, eos_id: int, seed: int, val_fraction: float
    ):
        self.root, self.rank, self.buckets = Path(root), rank, buckets
        self.dtype, self.eos_id, self.seed, self.val_fraction = dtype, eos_id, seed, val_fraction
        self.writers: dict[int, IntermediateWriter] = {}
        self.documents = self.tokens = 0

    def write(
        self, ids: list[str], texts: list[str], token_lists: list[list[int]], val: list[bool] | None = None
    ) -> None:
        """`val`: each row's split where it is not its id's (a repeated document's copies: train)."""
        parts: dict[int, list[int]] = {}
        for i, doc_id in enumerate(ids):
            parts.setdefault(bucket_of(shuffle_key(doc_id, self.seed), self.buckets), []).append(i)
        with on_failure(self.abort, self.root):  # one bucket's file failed: drop every bucket's
            self._write(parts, ids, texts, token_lists, val)
        self.documents += len(ids)

    def _write(
        self,
        parts: dict[int, list[int]],
        ids: list[str],
        texts: list[str],
        token_lists: list[list[int]],
        val: list[bool] | None,
    ):
        for b in sorted(parts):
            w = self.writers.get(b)
            if w is None:
                w = self.writers[b] = IntermediateWriter(
                    bucket_dir(self.root, b) / f"{self.rank:05d}.arrow",
                    self.dtype,
                    self.eos_id,
                    self.seed,
                    self.val_fraction,
                )
            rows = parts[b]
            before = w.tokens
            w.write(
                [ids[i] for i in rows],
                [texts[i] for i in rows],
                [token_lists[i] for i in rows],
                None if val is None else [val[i] for i in rows],
            )
            self.tokens += w.tokens - before

    def close(self) -> None:
        with on_failure(self.abort, self.root):
            for b in sorted(self.writers):
                self.writers[b].close()

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()


class SortedBucket:
    """One bucket of every encode output, sorted by (key, tie): per split, the rows in global order.

    Held per document: key, tie, length (8 bytes each), batch and row index (4 + 8), val flag (1)
    and the sort permutations (8 + 8): about 55 bytes. Token values stay in the mapped files.
    """

    def __init__(self, folder: Path, *, tokens: bool = True, run_folder: RunFolder = AS_GIVEN):
        folder = run_folder.staged(folder)  # a run on object storage: the bucket of every encode task, fetched
        paths = sorted(folder.glob("*.arrow")) if folder.is_dir() else []
        # one unit per record batch (an encode batch): its arrays are views of the mapped file.
        # Combining a file's batches into one array would copy every token into memory.
        self.units = [b for p in paths for b in pa.ipc.open_file(pa.memory_map(str(p))).read_all().to_batches()]
        unit_idx, row_idx, keys, ties, vals, lengths = [], [], [], [], [], []
        self.views = []
        for u, batch in enumerate(self.units):
            n = batch.num_rows
            col = batch.column("tokens")
            offsets = col.offsets.to_numpy()
            unit_idx.append(np.full(n, u, dtype=np.int32))
            row_idx.append(np.arange(n, dtype=np.int64))
            keys.append(batch.column("key").to_numpy())
            ties.append(batch.column("tie").to_numpy())
            vals.append(batch.column("val").to_numpy(zero_copy_only=False))
            lengths.append(np.diff(offsets))
            self.views.append((offsets, col.values.to_numpy() if tokens else None))
        cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dtype=dt)  # noqa: E731
        self.unit_idx, self.row_idx = cat(unit_idx, np.int32), cat(row_idx, np.int64)
        keys, ties, vals = cat(keys, np.uint64), cat(ties, np.uint64), cat(vals, bool)
        self.lengths = cat(lengths, np.int64)
        # lexsort is stable: equal (key, tie) keep file (rank) then row order, as the single sort did
        order = np.lexsort((ties, keys))
        self.order = {split: order[vals[order] == (split == "val")] for split in ("train", "val")}

    def gather(self, split: str, first: int, stop: int):
        """Token slices, lengths and ids of the split's sorted documents [first, stop)."""
        rows = self.order[split][first:stop]
        chunk_vals, chunk_lens, where = [], [], []
        per_unit: dict[int, list] = {}
        for i in rows:
            u, r = int(self.unit_idx[i]), int(self.row_idx[i])
            offsets, values = self.views[u]
            a, b = offsets[r], offsets[r + 1]
            chunk_vals.append(values[a:b])
            chunk_lens.append(b - a)
            where.append((u, r))
            per_unit.setdefault(u, []).append(r)
        # ids: one take per record batch instead of every id as a Python string
        taken = {
            u: dict(zip(rs, self.units[u].column("id").take(pa.array(rs, pa.int64())).to_pylist()))
            for u, rs in per_unit.items()
        }
        return chunk_vals, chunk_lens, [taken[u][r] for u, r in where]


def bucket_cumsums(folder: Path, run_folder: RunFolder = AS_GIVEN) -> dict[str, np.ndarray]:
    """Per split, the running sum of the bucket's document lengths in global order (8 bytes a
    document): all that `plan_shards` needs of a bucket (`shard_lengths`' task writes it)."""
    sb = SortedBucket(folder, tokens=False, run_folder=run_folder)
    return {split: np.cumsum(sb.lengths[sb.order[split]]) for split in ("train", "val")}


def plan_shards(root: Path, buckets: int, shard_tokens: int, cumsums=None, run_folder: RunFolder = AS_GIVEN) -> dict:
    """Cut points of the sequential rule, found bucket by bucket from document lengths alone.

    A shard closes after the document that brings it to `shard_tokens`; a shard may span buckets.
    Returns {"buckets", "shard_tokens", "shards": [{path, split, owner, documents, tokens,
    pieces: [[bucket, first, stop], ...]}]} with shards in manifest order (train, then val).
    Memory: one bucket's `SortedBucket` without token values, plus the lengths' running sum
    (8 bytes a document); work per bucket is one sort plus a binary search per shard cut.
    `cumsums(b)`: bucket b's running sums (`bucket_cumsums`), e.g. memory-mapped from the files
    the `shard_lengths` tasks wrote: then this walks no encode file, only a binary search per cut.
    """
    done: dict[str, list[dict]] = {"train": [], "val": []}
    open_: dict[str, dict | None] = {"train": None, "val": None}
    for b in range(buckets):
        sums = cumsums(b) if cumsums is not None else bucket_cumsums(bucket_dir(root, b), run_folder)
        for split in ("train", "val"):
            cum = sums[split]  # tokens up to and including each document
            pos = 0
            while pos < len(cum):
                cur = open_[split]
                if cur is None:
                    cur = open_[split] = {
                        "path": f"{split}-{len(done[split]):05d}.arrow",
                        "split": split,
                        "owner": b,
                        "documents": 0,
                        "tokens": 0,
                        "pieces": [],
                    }
                before = int(cum[pos - 1]) if pos else 0
                # the first document at or after pos that brings the open shard to shard_tokens
                stop = int(np.searchsorted(cum, before + shard_tokens - cur["tokens"], side="left")) + 1
                stop = min(stop, len(cum))
                cur["pieces"].append([b, pos, stop])
                cur["documents"] += stop - pos
                cur["tokens"] += int(cum[stop - 1]) - before
                if cur["tokens"] >= shard_tokens:
                    done[split].append(cur)
                    open_[split] = None
                pos = stop
        del sums
    for split in ("train", "val"):
        if open_[split] is not None:
            done[split].append(open_[split])
    return {"buckets": buckets, "shard_tokens": shard_tokens, "shards": done["train"] + done["val"]}


def write_planned_shards(
    root: Path,
    plan: dict,
    owner: int,
    out_dir: Path,
    dtype: pa.DataType,
    progress=None,
    run_folder: RunFolder = AS_GIVEN,
) -> list[dict]:
    """Write the planned shards that start in bucket `owner` into `out_dir`; their manifest entries.

    Memory: the sorted index of one bucket at a time (`SortedBucket`) plus one shard's tokens.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    np_dtype = dtype.to_pandas_dtype()
    loaded: tuple[int, SortedBucket] | None = None
    entries = []
    for shard in plan["shards"]:
        if shard["owner"] != owner:
            continue
        chunk_vals, chunk_lens, chunk_ids = [], [], []
        for b, first, stop in shard["pieces"]:
            if loaded is None or loaded[0] != b:
                loaded = None  # drop the previous bucket's maps before opening the next
                loaded = (b, SortedBucket(bucket_dir(root, b), run_folder=run_folder))
            v, n, i = loaded[1].gather(shard["split"], first, stop)
            chunk_vals += v
            chunk_lens += n
            chunk_ids += i
        values = np.concatenate(chunk_vals).astype(np_dtype, copy=False)
        if len(chunk_ids) != shard["documents"] or len(values) != shard["tokens"]:
            raise ValueError(f"{root}: shard {shard['path']} does not match its plan (encode outputs changed?)")
        with replacing(out_dir / shard["path"]) as tmp:
            write_shard(tmp, values, np.asarray(chunk_lens, dtype=np.int64), chunk_ids, dtype, shard["split"])
        entries.append(
            {
                "path": shard["path"],
                "split": shard["split"],
                "documents": len(chunk_ids),
                "tokens": int(len(values)),
                "sha256": sha256_file(out_dir / shard["path"]),
            }
        )
        if progress:
            progress(entries[-1])
    return entries


def _removes_tmp_dir_on_failure(finish):
    """`finish_tokens` that fails (a full disk) leaves no `<out_dir>.tmp` and names `out_dir`."""

    @functools.wraps(finish)
    def wrapper(shard_files: Path, entries: list[dict], out_dir: Path, **kwargs) -> dict:
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        with on_failure(lambda: shutil.rmtree(tmp, ignore_errors=True), out_dir):
            return finish(shard_files, entries, out_dir, **kwargs)

    return wrapper


@_removes_tmp_dir_on_failure
def finish_tokens(
    shard_files: Path,
    entries: list[dict],
    out_dir: Path,
    *,
    tokenizer_file: Path,
    tokenizer_meta: dict,
    dtype: pa.DataType,
    seed: int,
    val_fraction: float,
    shard_tokens: int,
    extra: dict | None = None,
) -> dict:
    """Build `out_dir` (shards + manifest + tokenizer) from the shard tasks' files; `extra`: more
    keys of the manifest (`weighting`).

    `entries` are in manifest order. Shard files are hard-linked (copied where links fail), so the
    shard stage's output stays whole for a re-run; the directory is built as `<out_dir>.tmp` and
    swapped in whole, so a killed step never leaves a half-written `tokens/`.
    """
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")
    for e in entries:
        src = shard_files / e["path"]
        try:
            os.link(src, tmp / e["path"])
        except OSError:
            shutil.copyfile(src, tmp / e["path"])
    shards = [{k: e[k] for k in ("path", "split", "documents", "tokens", "sha256")} for e in entries]
    splits = {}
    for split in ("train", "val"):
        mine = [s for s in shards if s["split"] == split]
        splits[split] = {
            "shards": len(mine),
            "documents": sum(s["documents"] for s in mine),
            "tokens": sum(s["tokens"] for s in mine),
        }
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
        **(extra or {}),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return manifest
