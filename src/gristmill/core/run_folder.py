"""The run directory as a step sees it: a `RunFolder`, which the planner hands every step of a
plan, and which a task of a run on object storage binds to a working copy of its own.

A step keeps its run folder and names relative to it (its stage's folder `NN_name`, an earlier
stage's, `tokens`), and asks the folder where they are when it uses them:

- `path(*parts)`: where to write (and where its own files are);
- `staged(*parts)`: a local path to read, after fetching the file (or every file under the
  folder) from the store if the task has no copy yet;
- `listed(folder, pattern)`: the files under a folder, the store's and the task's own.

Unbound (a local run directory: the common case, and every hot loop) these are a path under the
root and a plain glob: no fsspec, no lookup. A step run alone (no planner) has a folder without a
root: its paths are taken as given.

Much of a run maps files into memory or builds them in place (`np.load(mmap_mode=...)`, the
Bloom filter's `np.memmap`, `pa.memory_map` of token shards, renames of `.tmp` files), which an
object store cannot do. So when the run directory is a URL, each task works in a folder of its
own on local scratch disk laid out like the run directory, a `WorkingCopy`
(`gristmill.pipeline.execution.staging` binds the steps' folders to it, and uploads what the
task wrote once it completes): the steps write there as to any local run directory, and what they
read of earlier stages comes from the store, fetched on first use.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

from gristmill.core import storage

__all__ = ["AS_GIVEN", "RunFolder", "WorkingCopy"]


class RunFolder:
    """The run directory under `root` (None: paths as given), or, while a task has it `bound`,
    the task's working copy of it."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else None
        self.copy: WorkingCopy | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "copy": None}  # a binding is the task's alone

    def path(self, *parts: str | os.PathLike) -> Path:
        """`parts` joined under the run directory (or the working copy); an absolute path is itself."""
        base = self.root if self.copy is None else self.copy.root
        return Path(*parts) if base is None else base.joinpath(*parts)

    def staged(self, *parts: str | os.PathLike) -> Path:
        """`path(*parts)`, present locally: bound, the file (or every file under the folder) is
        fetched from the store first unless the task already has it."""
        path = self.path(*parts)
        return path if self.copy is None else self.copy.stage(path)

    def listed(self, folder: str | os.PathLike, pattern: str = "*", recursive: bool = False) -> list[Path]:
        """The files named like `pattern` in `folder` (and below it if `recursive`), unsorted: a
        glob, plus when bound the files committed to the store (not fetched: `staged` each one
        to read it)."""
        folder = self.path(folder)
        if self.copy is None:
            return _glob(folder, pattern, recursive)
        return self.copy.listing(folder, pattern, recursive)

    @contextmanager
    def bound(self, copy: WorkingCopy) -> Iterator[RunFolder]:
        """The folder is `copy` for the block (a task of a run on object storage)."""
        self.copy = copy
        try:
            yield self
        finally:
            self.copy = None


#: the folder of a step run alone (no planner): paths as given
AS_GIVEN = RunFolder()


class WorkingCopy:
    """`root` (a local folder) mirrors the run directory at `url` for one task, reached with the
    run's storage settings."""

    def __init__(self, url: str, root: Path, config: storage.StorageConfig):
        self.url = url.rstrip("/")
        self.root = Path(root)
        self.fs, self.remote = storage.filesystem(self.url, config)
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


def _glob(folder: Path, pattern: str, recursive: bool) -> list[Path]:
    return list(folder.rglob(pattern) if recursive else folder.glob(pattern))
