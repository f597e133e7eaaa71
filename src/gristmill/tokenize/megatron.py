"""Megatron's indexed dataset (`<prefix>.bin` + `<prefix>.idx`), written from token shards.

Megatron-LM and NeMo read pretraining tokens through megatron-core's `IndexedDataset`; its users
pass the prefix (`--data-path OUT/train`). This module writes that format itself, from its
layout as megatron-core 0.16.1 reads it (`megatron/core/datasets/indexed_dataset.py`,
`_IndexReader`, `_MMapBinReader`): nothing of megatron is imported to write.

`<prefix>.bin`: every token of every document back to back, little-endian, in the dtype the
index names; no header.

`<prefix>.idx`, little-endian, in this order:

    9 bytes   magic b"MMIDIDX\\x00\\x00"
    u64       version, 1
    u8        dtype code of the .bin (megatron's `DType`: 8 = uint16, 4 = int32)
    u64       sequence count S
    u64       document count D + 1 (the length of the document-index array below)
    int32[S]  sequence lengths, in tokens
    int64[S]  sequence pointers: byte offset of each sequence in the .bin
    int64[D+1] document indices: document d is sequences [idx[d], idx[d+1]); idx[0] = 0, idx[D] = S

One gristmill document is one Megatron sequence and one Megatron document (S = D, document
indices 0..S), each ending in the EOS id as the shards hold it: Megatron's GPT dataset
concatenates documents into samples, like `preprocess_data.py --append-eod` writes them.

dtype: `uint16` shards stay `uint16` (code 8). `uint32` shards are written as `int32` (code 4):
the index has no unsigned 32-bit code; the bits are the same for ids below 2^31, and an id at
or above 2^31 is refused (`MegatronExportError`, naming the shard, document and token).

Streaming and memory: the .bin is written from the shards' memory-mapped token buffers in
slices of `chunk_tokens` (no copy: uint32 → int32 is a view of the same bytes); the .idx is
written front to back in three passes over the shards' document offsets (lengths, pointers,
then the document indices, which are 0..D), `chunk_docs` documents at a time. The counts in
the header come from the manifest, which every shard is checked against when it opens, and the
written counts are checked against them at the end. Memory other than mapped file pages is
therefore a few arrays of `chunk_docs` entries (~20 bytes each, ~20 MB at the default), whatever
the size of a shard or of the corpus.

Whole or not at all. A local folder: every file is written under a temporary name in the output
folder, and all are renamed into place only once every split is complete; on any error (a full
disk, an id refused, Ctrl-C) the temporary files are removed and earlier files at those names are
untouched. Files are opened through `LocalFolder`, the one place that knows the destination is a
local folder, or `StoreFolder`, a prefix on object storage (`-o s3://bucket/megatron`).

A store has no rename, and copying N objects into place one by one leaves a mix of two exports
when a copy fails or the process dies between two of them. So an export to a store never
overwrites an object a reader may use: its files go to a fresh folder of their own,
`<prefix>/export-<UTC time>-<random>/<split>.bin|.idx`, streamed there (multipart uploads,
nothing on local disk), and the export is committed by ONE small object written last,
`<prefix>/export.json`, naming that folder and each split's prefix in it (`export_paths` reads
it; so does a Megatron user, docs/token-shards.md). A single PUT is atomic: a reader of
`export.json` sees the earlier export or this one, whole, never a mix. The commit is
conditional (If-Match on the `export.json` this export found when it began, If-None-Match: *
if there was none), so of two exports racing on one prefix the second to commit fails in one
line and the first stands; before it, every file is looked up and its size checked.

What is left behind: an export that fails deletes its own folder; one killed (SIGKILL, a lost
machine) leaves its folder, which nothing names. After a commit the export deletes every other
export folder that began before the commit (the failed and killed ones, older exports), except
the one `export.json` named until then, kept for a job still reading it and deleted by the next
export; unfinished multipart uploads under the prefix from before the commit are aborted; and
files of the flat layout earlier versions wrote (`<split>.bin`/`.idx` at the prefix, their
`.<name>.<pid>.tmp` objects) are removed, so that no stale export remains readable beside the
named one.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from loguru import logger

from gristmill.core import storage
from gristmill.core.files import naming, remove_quietly
from gristmill.tokenize.reader import Shard, TokenDir

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
#: megatron-core's `DType` codes for the dtypes written here
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}
INT32_LIMIT = 2**31
CHUNK_TOKENS = 1 << 24  # tokens per write of the .bin (a view of the mapped shard, never copied)
CHUNK_DOCS = 1 << 20  # documents per slice of the .idx arrays (~20 MB of int32 + int64 arrays)


class MegatronExportError(ValueError):
    """Tokens that Megatron's format cannot hold; names the shard, document and token."""


class LocalFolder:
    """The export's destination: files written under temporary names, renamed into place by
    `commit` once all are complete, removed by `discard`. Temporary names carry the process id,
    so two exports into one folder never write the same file."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._pending: list[tuple[Path, Path]] = []  # (temporary, final), in commit order
        self._made = False  # the folder was made by this export: removed again if nothing is committed

    def describe(self, name: str) -> str:
        return str(self.root / name)

    def open(self, name: str) -> BinaryIO:
        """A new file that will become `name` on `commit`."""
        if not self.root.is_dir():
            self.root.mkdir(parents=True)
            self._made = True
        final = self.root / name
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        f = open(tmp, "wb")  # closed by the caller; removed by discard() unless committed
        self._pending.append((tmp, final))
        return f

    def commit(self, written: list[SplitWritten] | None = None) -> None:
        for tmp, final in self._pending:
            os.replace(tmp, final)
        self._pending.clear()

    def discard(self) -> None:
        for tmp, _ in self._pending:
            remove_quietly(tmp)
        self._pending.clear()
        if self._made:
            try:
                self.root.rmdir()  # only if empty
            except OSError:
                pass


#: the object that names the committed export of a prefix on a store (see the module doc)
POINTER = "export.json"
POINTER_FORMAT = "gristmill-megatron-export"
#: an export's own folder under the prefix: `export-<UTC start time>-<random>`; only folders
#: named so are ever deleted by a later export
_EXPORT_FOLDER = re.compile(r"^export-\d{8}T\d{6}Z-[0-9a-f]{8}$")
#: written first into an export's folder: its LastModified (the store's clock) is when it began
_STARTED = ".started"
#: what earlier versions wrote at the prefix itself: `<split>.bin/.idx` and their temporary objects
_FLAT_TMP = re.compile(r"^\.[A-Za-z0-9_-]+\.(bin|idx)\.\d+\.tmp$")


class StoreFolder:
    """`LocalFolder`'s contract on object storage (s3://, gs://, ...): the files go to a folder of
    their own, and `commit` writes the one object that names it (see the module doc)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.root = storage.filesystem(self.url)
        self.root = self.root.rstrip("/")
        self.export = f"export-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"
        self.folder = f"{self.root}/{self.export}"
        self._keys: dict[str, str] = {}  # name -> key, in the order written
        self._began = False
        self._base: tuple[str | None, str | None] = (None, None)  # export.json found at the start: (ETag, export)

    @property
    def pointer_url(self) -> str:
        return f"{self.url}/{POINTER}"

    def describe(self, name: str) -> str:
        return f"{self.url}/{self.export}/{name}"

    def open(self, name: str) -> BinaryIO:
        if not self._began:
            self._begin()
        key = f"{self.folder}/{name}"
        with storage.errors(self.describe(name), "writing"):
            f = self.fs.open(key, "wb")
        self._keys[name] = key
        return f

    def _begin(self) -> None:
        """Note the export.json this export replaces (its ETag conditions the commit), then mark
        the folder as begun: its LastModified tells a later export whether it began before a commit."""
        self._began = True
        with storage.errors(self.pointer_url, "reading"):
            try:
                etag = self.fs.info(f"{self.root}/{POINTER}").get("ETag")
                raw = self.fs.cat_file(f"{self.root}/{POINTER}")
            except FileNotFoundError:
                etag, raw = None, None
        export = None
        if raw is not None:
            try:
                found = json.loads(raw)
                export = found.get("export") if isinstance(found, dict) else None
            except ValueError:
                logger.warning(f"{self.pointer_url}: not JSON; this export replaces it")
        self._base = (etag, export if isinstance(export, str) and _EXPORT_FOLDER.match(export) else None)
        marker = {"began": time.time(), "host": socket.gethostname(), "pid": os.getpid(), "replaces": etag}
        with storage.errors(self.describe(_STARTED), "writing"):
            self.fs.pipe_file(f"{self.folder}/{_STARTED}", json.dumps(marker).encode())

    def commit(self, written: list[SplitWritten]) -> None:
        """Check every file of the export, then write export.json naming it: the commit."""
        for w in written:
            for name, want in ((f"{w.split}.bin", w.bin_bytes), (f"{w.split}.idx", w.idx_bytes)):
                with storage.errors(self.describe(name), "checking it before the commit"):
                    try:
                        got = int(self.fs.info(self._keys[name])["size"])
                    except FileNotFoundError:
                        got = None
                if got != want:
                    raise storage.StorageError(
                        f"{self.describe(name)}: {'is gone' if got is None else f'holds {got:,} bytes'}, not the"
                        f" {want:,} written (removed while the export ran: another export to {self.url}?);"
                        f" nothing committed, {self.pointer_url} unchanged"
                    )
        pointer = {
            "format": POINTER_FORMAT,
            "version": 1,
            "export": self.export,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "splits": {
                w.split: {
                    "prefix": f"{self.export}/{w.split}",
                    "documents": w.documents,
                    "tokens": w.tokens,
                    "dtype": str(w.dtype),
                    "bin_bytes": w.bin_bytes,
                    "idx_bytes": w.idx_bytes,
                }
                for w in written
            },
        }
        with storage.errors(self.pointer_url, "committing the export"):
            try:
                _put_pointer(
                    self.fs,
                    f"{self.root}/{POINTER}",
                    json.dumps(pointer, indent=1).encode(),
                    self._base[0],
                    conditional=storage.protocol(self.url) == "s3",
                )
            except OSError as e:
                if not storage.conflict(e):
                    raise
                raise storage.StorageError(
                    f"{self.pointer_url}: another export was committed to {self.url} while this one ran; this one"
                    " is discarded and that one stands (run again to replace it)"
                ) from None
        self._clean(written)

    def discard(self) -> None:
        if not self._began:
            return
        try:
            self.fs.rm(self.folder, recursive=True)
        except Exception as e:  # noqa: BLE001 - the store is gone: the next export removes the folder
            logger.warning(f"{self.url}/{self.export}: not removed ({storage.describe(e)}); the next export will")

    def _clean(self, written: list[SplitWritten]) -> None:
        """After the commit: what no reader of export.json can reach any more (module doc). A
        failure here is a warning: the export is committed, and the next one cleans again."""
        try:
            committed = self.fs.info(f"{self.root}/{POINTER}")["LastModified"]
            entries = self.fs.ls(self.root, detail=True)
        except Exception as e:  # noqa: BLE001
            logger.warning(f"{self.url}: earlier exports not cleaned up ({storage.describe(e)}); the next export will")
            return
        keep = {self.export, self._base[1]}
        flat = {f"{w.split}.{ext}" for w in written for ext in ("bin", "idx")}
        removed = []
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            try:
                if entry["type"] == "directory" and _EXPORT_FOLDER.match(name) and name not in keep:
                    try:
                        began = self.fs.info(f"{self.root}/{name}/{_STARTED}")["LastModified"]
                    except FileNotFoundError:
                        began = None
                    if began is not None and began >= committed:
                        continue  # began after this commit: an export that may still commit
                    self.fs.rm(f"{self.root}/{name}", recursive=True)
                    removed.append(name + "/")
                elif entry["type"] != "directory" and (name in flat or _FLAT_TMP.match(name)):
                    self.fs.rm_file(f"{self.root}/{name}")
                    removed.append(name)
            except Exception as e:  # noqa: BLE001
                logger.warning(f"{self.url}/{name}: not removed ({storage.describe(e)}); the next export tries again")
        removed += self._abort_uploads(committed)
        if removed:
            logger.info(f"{self.url}: removed what no export names any more: {', '.join(removed)}")

    def _abort_uploads(self, before) -> list[str]:
        """Multipart uploads of killed exports (s3:// only): invisible, but stored and billed."""
        if storage.protocol(self.url) != "s3":
            return []
        bucket, key, _ = self.fs.split_path(self.root)
        base = f"{key}/" if key else ""  # -o s3://bucket: the exports are at the bucket's top
        out = []
        try:
            resp = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=f"{base}export-")
            for up in resp.get("Uploads", []):
                rel = up["Key"][len(base) :]
                if (
                    _EXPORT_FOLDER.match(rel.split("/", 1)[0])
                    and rel.split("/", 1)[0] != self.export
                    and up.get("Initiated") is not None
                    and up["Initiated"] < before
                ):
                    self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
                    out.append(f"{rel} (unfinished upload)")
        except Exception as e:  # noqa: BLE001
            logger.warning(f"{self.url}: unfinished uploads not aborted ({storage.describe(e)})")
        return out


def _put_pointer(fs, key: str, body: bytes, replaces: str | None, conditional: bool) -> None:
    """The commit: one PUT of export.json, on condition (s3://) that it is still the one this
    export found; other stores have no conditional write wired here and take it as is."""
    if not conditional:
        fs.pipe_file(key, body)
        return
    bucket, path, _ = fs.split_path(key)
    condition = {"IfMatch": replaces} if replaces else {"IfNoneMatch": "*"}
    fs.call_s3("put_object", Bucket=bucket, Key=path, Body=body, ContentType="application/json", **condition)


def export_paths(dest: str | os.PathLike) -> dict[str, str]:
    """{split: the prefix Megatron is given} of the export at `dest`: on a store, what its
    export.json names (the committed export, whole); a local folder, its `<split>.idx` files."""
    if storage.is_url(dest):
        url = str(dest).rstrip("/")
        raw = storage.read_bytes(f"{url}/{POINTER}")
        try:
            pointer = json.loads(raw)
            if pointer.get("format") != POINTER_FORMAT:
                raise ValueError(f"format {pointer.get('format')!r}")
            return {split: f"{url}/{entry['prefix']}" for split, entry in pointer["splits"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise storage.StorageError(f"{url}/{POINTER}: not a gristmill Megatron export ({e})") from None
    folder = Path(storage.local_or_url(dest))
    return {p.stem: str(folder / p.stem) for p in sorted(folder.glob("*.idx")) if not p.name.startswith(".")}


@dataclass
class SplitWritten:
    split: str
    prefix: str  # what Megatron is given: the path without .bin/.idx
    documents: int
    tokens: int
    dtype: np.dtype
    bin_bytes: int
    idx_bytes: int


def megatron_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype written for shards of `dtype`: uint16 as is, uint32 as int32."""
    dtype = np.dtype(dtype)
    if dtype == np.uint16:
        return dtype
    if dtype == np.uint32:
        return np.dtype(np.int32)
    raise MegatronExportError(f"token dtype {dtype}: Megatron export writes uint16 or uint32 shards")


def index_header(dtype: np.dtype, sequences: int) -> bytes:
    """The .idx header for `sequences` sequences, one document each."""
    return MAGIC + struct.pack("<QBQQ", VERSION, DTYPE_CODES[np.dtype(dtype)], sequences, sequences + 1)


def write_megatron(
    toks: TokenDir,
    dest: LocalFolder | StoreFolder,
    splits: list[str],
    chunk_tokens: int = CHUNK_TOKENS,
    chunk_docs: int = CHUNK_DOCS,
) -> list[SplitWritten]:
    """`<split>.bin` + `<split>.idx` in `dest` for each split, committed together or not at all.
    The caller checks the token directory first (`TokenDir.check`): ids against the vocabulary;
    this function refuses only what Megatron's format cannot hold."""
    out_dtype = megatron_dtype(toks.dtype)
    written = []
    try:
        for split in splits:
            written.append(_write_split(toks, dest, split, out_dtype, chunk_tokens, chunk_docs))
        dest.commit(written)
    except BaseException:  # a full disk, an id refused, Ctrl-C: no file of this export is left
        dest.discard()
        raise
    return written


def _write_split(
    toks: TokenDir, dest: LocalFolder | StoreFolder, split: str, out_dtype: np.dtype, chunk_tokens: int, chunk_docs: int
) -> SplitWritten:
    entries = toks.entries(split)
    documents = sum(e["documents"] for e in entries)  # each shard is checked against its entry on opening
    itemsize = out_dtype.itemsize
    bin_name, idx_name = f"{split}.bin", f"{split}.idx"

    tokens = 0
    with _named(dest, bin_name) as f:
        for shard in _shards(toks, entries):
            for start in range(0, shard.num_tokens, chunk_tokens):
                part = shard.tokens[start : start + chunk_tokens]
                if out_dtype != part.dtype:  # uint32 → int32: same bits below 2^31
                    if len(part) and int(part.max()) >= INT32_LIMIT:
                        _refuse_id(shard, start + int(np.argmax(part >= INT32_LIMIT)))
                    part = part.view(out_dtype)
                f.write(memoryview(np.ascontiguousarray(part)).cast("B"))
            tokens += shard.num_tokens
        bin_bytes = f.tell()

    with _named(dest, idx_name) as f:
        f.write(index_header(out_dtype, documents))
        for lengths in _per_chunk(toks, entries, chunk_docs, _lengths):
            f.write(lengths.tobytes())
        for pointers in _per_chunk(toks, entries, chunk_docs, functools.partial(_pointers, itemsize=itemsize)):
            f.write(pointers.tobytes())
        for start in range(0, documents + 1, chunk_docs):
            f.write(np.arange(start, min(start + chunk_docs, documents + 1), dtype=np.int64).tobytes())
        idx_bytes = f.tell()

    want_idx = len(MAGIC) + 8 + 1 + 8 + 8 + documents * (4 + 8) + (documents + 1) * 8
    if bin_bytes != tokens * itemsize or idx_bytes != want_idx:  # shards changed under the export
        raise MegatronExportError(
            f"{dest.describe(split)}: wrote {bin_bytes} / {idx_bytes} bytes, expected"
            f" {tokens * itemsize} / {want_idx}: the token directory changed during the export"
        )
    return SplitWritten(split, dest.describe(split), documents, tokens, out_dtype, bin_bytes, idx_bytes)


@contextmanager
def _named(dest: LocalFolder | StoreFolder, name: str) -> Iterator[BinaryIO]:
    """A new file of `dest`, closed on leaving; an OSError (a full disk, a file size limit) names
    the file as it will be called, not its temporary name."""
    path = dest.describe(name)
    try:
        f = dest.open(name)
    except OSError as e:
        raise _about(e, path) from None
    try:
        with f:
            yield f
    except OSError as e:
        raise _about(e, path) from None


def _about(e: OSError, path: str) -> OSError:
    return OSError(e.errno, e.strerror, path) if e.errno else naming(e, path)


def _shards(toks: TokenDir, entries: list[dict]) -> Iterator[Shard]:
    for entry in entries:
        yield toks.shard(entry)


def _per_chunk(toks: TokenDir, entries: list[dict], chunk_docs: int, make) -> Iterator[np.ndarray]:
    """`make(offsets, base, shard, first)` over slices of each shard's document offsets
    (`chunk_docs` + 1 entries from document `first`, overlapping by one), `base` being the
    shard's first token in the split's stream."""
    base = 0
    for shard in _shards(toks, entries):
        for start in range(0, shard.documents, chunk_docs):
            yield make(shard.offsets[start : start + chunk_docs + 1], base, shard, start)
        base += shard.num_tokens


def _lengths(offsets: np.ndarray, base: int, shard: Shard, first: int) -> np.ndarray:
    """Sequence lengths, int32 in the index."""
    lengths = np.diff(offsets)
    if len(lengths) and int(lengths.max()) >= INT32_LIMIT:
        doc = first + int(np.argmax(lengths >= INT32_LIMIT))
        raise MegatronExportError(
            f"{shard.path}: document {doc} holds {int(lengths[doc - first]):,} tokens; Megatron's index stores"
            f" lengths as int32 (below {INT32_LIMIT:,})"
        )
    return lengths.astype(np.int32)


def _pointers(offsets: np.ndarray, base: int, shard: Shard, first: int, itemsize: int) -> np.ndarray:
    """Byte offset of each sequence in the .bin."""
    return (offsets[:-1] + base).astype(np.int64) * itemsize


def _refuse_id(shard: Shard, pos: int) -> None:
    doc = int(np.searchsorted(shard.offsets, pos, side="right")) - 1
    raise MegatronExportError(
        f"{shard.path}: token id {int(shard.tokens[pos])} (document {doc}, token {pos - int(shard.offsets[doc])})"
        f" is not below 2^31: Megatron's index has no unsigned 32-bit dtype and int32 cannot hold it"
    )
