"""A task's local working copy of a run directory that lives on object storage.

Much of a run maps files into memory or builds them in place (`np.load(mmap_mode=...)`, the
Bloom filter's `np.memmap`, `pa.memory_map` of token shards, renames of `.tmp` files), which an
object store cannot do. So when the run directory is a URL, each task works in a folder of its
own on local scratch disk laid out like the run directory (`gristmill.pipeline.execution.staging` sets it
up and uploads what the task wrote once it completes). The task's steps write there as to any
local run directory; what they read of earlier stages comes from the store, fetched on first
use by the two functions below, which every step calls where it reads a run directory:

- `staged(path)`: the local path, after fetching the file (or every file under the folder)
  from the store if the task has no copy yet;
- `listed(folder, pattern)`: the files under a folder, the store's and the task's own.

Without a working copy (a local run directory: the common case, and every hot loop) both are a
path returned as given and a plain glob: no fsspec, no lookup.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

from gristmill.core import storage

__all__ = ["WorkingCopy", "active", "listed", "staged"]


class WorkingCopy:
    """`root` (a local folder) mirrors the run directory at `url` for one task."""

    def __init__(self, url: str, root: Path):
        self.url = url.rstrip("/")
        self.root = Path(root)
        self.fs, self.remote = storage.filesystem(self.url)
        self.remote = self.remote.rstrip("/")
        self._fetched: set[str] = set()  # relative paths already looked up (files and folders)
        self._files: dict[tuple[int, int], tuple[str, int, int]] = {}  # (dev, inode) -> (key, size, mtime)
        self.fetched_bytes = 0
        self.fetch_s = 0.0  # time spent listing and fetching, for the task's log

    def relative(self, path: Path) -> str | None:
        """`path` relative to the working copy's root (posix), or None if it lies outside."""
        try:
            rel = Path(path).relative_to(self.root)
        except ValueError:
            return None
        return rel.as_posix()

    def _remote(self, rel: str) -> str:
        return f"{self.remote}/{rel}" if rel not in ("", ".") else self.remote

    def _local(self, key: str) -> Path:
        return self.root / key[len(self.remote) + 1 :]

    def _find(self, rel: str) -> dict[str, int]:
        """{key: size} of the committed objects at `rel` (a file) or under it (a folder)."""
        where = self._remote(rel)
        with storage.errors(storage.join(self.url, rel), "listing the run directory"):
            found = self.fs.find(where, detail=True)
        return {
            k: int(v.get("size") or 0)
            for k, v in found.items()
            if v.get("type", "file") == "file" and not k.endswith(".tmp") and (k == where or k.startswith(where + "/"))
        }

    def stage(self, path: Path) -> Path:
        rel = self.relative(path)
        if rel is None or rel in self._fetched:
            return Path(path)
        self._fetched.add(rel)
        started = time.perf_counter()
        wanted = [(k, self._local(k)) for k in self._find(rel)]
        wanted = [(k, local) for k, local in wanted if not local.exists()]  # the task's own files win
        if wanted:
            for _, local in wanted:
                local.parent.mkdir(parents=True, exist_ok=True)
            with storage.errors(storage.join(self.url, rel), "fetching into the task's working copy"):
                self.fs.get([k for k, _ in wanted], [str(local) for _, local in wanted])
            for key, local in wanted:
                st = local.stat()
                self._files[(st.st_dev, st.st_ino)] = (key, st.st_size, st.st_mtime_ns)
                self.fetched_bytes += st.st_size
        self.fetch_s += time.perf_counter() - started
        return Path(path)

    def fetched_files(self) -> dict[tuple[int, int], str]:
        """{(device, inode): key} of the fetched files still as fetched: a name that is one of
        them holds a committed object of the store (an input, or a hard link made of one)."""
        out = {}
        for ident, (key, size, mtime) in self._files.items():
            try:
                st = self._local(key).stat()
            except OSError:
                continue  # gone: whatever holds its inode now is new
            if (st.st_dev, st.st_ino) == ident and (st.st_size, st.st_mtime_ns) == (size, mtime):
                out[ident] = key  # not replaced, not changed in place
        return out

    def listing(self, folder: Path, pattern: str, recursive: bool) -> list[Path]:
        rel = self.relative(folder)
        local = _glob(Path(folder), pattern, recursive)
        if rel is None:
            return local
        names = set(local)
        started = time.perf_counter()
        found = self._find(rel)
        self.fetch_s += time.perf_counter() - started
        for key in found:
            p = self._local(key)
            inside = p.relative_to(folder)
            if (recursive or len(inside.parts) == 1) and fnmatch(p.name, pattern):
                names.add(p)
        return list(names)


_active: WorkingCopy | None = None


@contextmanager
def active(copy: WorkingCopy | None) -> Iterator[WorkingCopy | None]:
    """`copy` is this process's working copy for the block (a task of a run on object storage)."""
    global _active
    previous, _active = _active, copy
    try:
        yield copy
    finally:
        _active = previous


def current() -> WorkingCopy | None:
    return _active


def staged(path: str | os.PathLike) -> Path:
    """`path`, present locally: in a task working on a copy of a run directory on object storage,
    the file (or every file under the folder) is fetched from the store first unless the task
    already has it; elsewhere, `path` itself."""
    if _active is None:
        return Path(path)
    return _active.stage(Path(path))


def listed(folder: str | os.PathLike, pattern: str = "*", recursive: bool = False) -> list[Path]:
    """The files named like `pattern` in `folder` (and below it if `recursive`), unsorted: a
    glob, plus in a task working on a copy the files committed to the store (not fetched:
    `staged` each one to read it)."""
    if _active is None:
        return _glob(Path(folder), pattern, recursive)
    return _active.listing(Path(folder), pattern, recursive)


def _glob(folder: Path, pattern: str, recursive: bool) -> list[Path]:
    return list(folder.rglob(pattern) if recursive else folder.glob(pattern))
