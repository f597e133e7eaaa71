"""Sorted-hash lookup files: a set of strings (blocklisted domains, URLs, a user's list) as a
memory-mapped file of their sorted 64-bit hashes, built once into a cache folder and shared
by every task on the machine (`url_filter`).

Entries are hashed with `key_hash` (xxh3_64); the file's header names the sources it was built
from (a sha256 key), so a cache built from other sources, or damaged, is rebuilt rather than
read. A small file is read into a Python set; a larger one is searched by bisection within
buckets of its hashes' top bits.
"""

from __future__ import annotations

import array
import bisect
import hashlib
import mmap
import os
import struct
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash
from loguru import logger

from gristmill.core.messages import printable

#: a lookup file of at most this many hashes is read into a Python set, which costs this much an entry
SET_MAX = 1 << 16
SET_ENTRY_BYTES = 80
#: a larger one is searched within buckets of its hashes' top bits (2^20 of them: 4 MB of offsets)
BUCKET_BITS = 20


def key_hash(text: str) -> int:
    """The 64-bit key of a list entry or a looked-up string: xxh3_64 of its UTF-8 bytes."""
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


# --- sorted-hash lookup files ------------------------------------------------------------------

#: magic, key (sha256 of the sources), sha256 of the hashes, count; then zero padding to HEADER_BYTES
_HEADER = struct.Struct("<8s32s32sQ")
HEADER_BYTES = 128
MAGIC = b"GMURLH01"


class LookupFileError(ValueError):
    """A lookup file differs from the one the run was planned with (one line, naming it)."""


@dataclass(frozen=True)
class LookupFile:
    """A sorted array of 64-bit hashes on disk, as it was when planned (tasks compare)."""

    path: str
    count: int
    #: sha256 of the hashes (the payload after the header), hex
    sha256: str
    #: sha256 of what the file was built from, hex (names the file; a stale file differs)
    key: str

    @property
    def size(self) -> int:
        return HEADER_BYTES + 8 * self.count


def _file_problem(path: Path, key: bytes | None) -> tuple[str | None, LookupFile | None]:
    """(what is wrong with the lookup file at `path`, None if nothing; the file if good). `key`:
    the sources it must have been built from (None: any)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            if len(head) < HEADER_BYTES:
                return f"truncated ({os.fstat(f.fileno()).st_size} bytes, shorter than its header)", None
            magic, file_key, digest, count = _HEADER.unpack_from(head)
            if magic != MAGIC:
                return "not a url_filter lookup file of this version (bad magic)", None
            if key is not None and file_key != key:
                return "stale (built from other lists than the configured ones)", None
            size = os.fstat(f.fileno()).st_size
            if size != HEADER_BYTES + 8 * count:
                return f"truncated or padded ({size} bytes, its header says {HEADER_BYTES + 8 * count})", None
            h = hashlib.sha256()
            while chunk := f.read(1 << 22):
                h.update(chunk)
            if h.digest() != digest:
                return "corrupted (sha256 of its hashes differs from its header's)", None
    except FileNotFoundError:
        return "missing", None
    return None, LookupFile(str(path), count, digest.hex(), file_key.hex())


def build_lookup_file(path: Path, key: bytes, entries: Iterable[str]) -> LookupFile:
    """Hash `entries`, sort and deduplicate the hashes, write them under a header, atomically."""
    hashes = np.unique(np.frombuffer(array.array("Q", map(key_hash, entries)), dtype=np.uint64))
    payload = hashes.astype("<u8", copy=False).tobytes()
    digest = hashlib.sha256(payload).digest()
    header = _HEADER.pack(MAGIC, key, digest, len(hashes)).ljust(HEADER_BYTES, b"\0")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(fd, 0o644)  # a cache other users' runs may read (mkstemp makes it 0600)
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(payload)
        os.replace(tmp, path)  # a concurrent planner writes the same bytes
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return LookupFile(str(path), len(hashes), digest.hex(), key.hex())


def ensure_lookup_file(cache_dir: Path, name: str, key: bytes, entries: Callable[[], Iterable[str]]) -> LookupFile:
    """The lookup file of `name` built from the sources `key` digests: the cached one if it is
    intact, else (re)built, saying in one line why an existing one was not used."""
    path = cache_dir / f"{name}-{key.hex()[:16]}.hashes"
    problem, good = _file_problem(path, key)
    if good is not None:
        return good
    if problem != "missing":
        logger.warning(printable(f"url_filter: {path}: {problem}; rebuilding it"))
    return build_lookup_file(path, key, entries())


class MappedHashes:
    """A lookup file memory-mapped read-only, searched by bisection (~22 probes for 4.5M); one of
    at most `SET_MAX` hashes is read into a set instead (~50 ns a lookup instead of ~1.5 us)."""

    def __init__(self, planned: LookupFile):
        self.planned = planned
        self.contains: Callable[[int], bool] | None = None

    def open(self) -> None:
        """Map the file, refusing one that is not the planned one (its sha256 is recomputed)."""
        if self.contains is not None:
            return
        planned = self.planned
        problem, found = _file_problem(Path(planned.path), bytes.fromhex(planned.key))
        if problem is None and found != planned:
            problem = "rebuilt differently"
        if problem is not None:
            raise LookupFileError(
                printable(
                    f"url_filter: lookup file {planned.path} is {problem} since the run was planned; "
                    "re-run the command to rebuild it (every task must see the planning's `cache_dir`)"
                )
            )
        with open(planned.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        hashes = memoryview(mapped)[HEADER_BYTES:].cast("Q")
        if planned.count <= SET_MAX:
            self.contains = frozenset(hashes).__contains__
            return
        # where each value of the top BUCKET_BITS bits starts: a lookup bisects ~4 entries, not
        # 4.5M (1.6 us -> 0.4 us: 22 probes of a memoryview, each a cache miss, become 3)
        starts = np.searchsorted(
            np.frombuffer(mapped, dtype="<u8", offset=HEADER_BYTES, count=planned.count),
            np.arange(1 << BUCKET_BITS, dtype=np.uint64) << np.uint64(64 - BUCKET_BITS),
        )
        offsets = memoryview(np.append(starts, planned.count).astype(np.uint32))
        shift = 64 - BUCKET_BITS

        def contains(h: int) -> bool:
            b = h >> shift
            end = offsets[b + 1]
            i = bisect.bisect_left(hashes, h, offsets[b], end)
            return i < end and hashes[i] == h

        self.contains = contains

    def __contains__(self, h: int) -> bool:
        return self.contains(h)

    def memory_bytes(self) -> int:
        """Resident once every page is touched: a set, or the hashes and their bucket offsets
        (and the 8-byte starts they are made from, while they are)."""
        if self.planned.count <= SET_MAX:
            return self.planned.count * SET_ENTRY_BYTES
        return self.planned.count * 8 + (12 << BUCKET_BITS)

    def __getstate__(self):  # a mapping is not pickled: each task maps the file itself
        return {"planned": self.planned, "contains": None}


def file_sha256(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.digest()


def sources_key(*parts: bytes | str) -> bytes:
    h = hashlib.sha256(MAGIC)
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "little") + b)
    return h.digest()
