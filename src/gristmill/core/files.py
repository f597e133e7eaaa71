"""Files written whole or not at all: a temporary file renamed into place, so a process killed
mid-write (or a full disk) never leaves a half file that a re-run would take for finished work.

A write that fails (a full disk, a read-only filesystem) removes its temporary file and raises
an OSError naming the file: numpy's, pyarrow's and Python's own write errors name none, and
"No space left on device" alone does not say which disk filled.

Every write has a temporary name of its own (`temporary_path`): several tasks may write the same
file (each near-dedup signature task writes the stage's `lsh.json`), on one machine or on many
sharing a filesystem, and a temporary name they shared would be renamed away under the others.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

#: errors about the file written, never the one read: a copy's is about its destination
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def naming(e: OSError, path: str | os.PathLike) -> OSError:
    """`e`, or an OSError of its errno naming `path` where `e` names no file (or, for a full disk
    met by a copy, naming the copy's destination rather than its source)."""
    if e.errno in _FULL and e.filename2 is not None:
        return OSError(e.errno, os.strerror(e.errno), e.filename2)
    if e.filename is not None:
        return e
    if e.errno:
        return OSError(e.errno, os.strerror(e.errno), os.fspath(path))  # ENOSPC -> "No space left...: path"
    return OSError(f"{os.fspath(path)}: {e}")


def remove_quietly(path: Path) -> None:
    """Remove a temporary file of a write that failed; the write's error is the one to report."""
    try:
        Path(path).unlink(missing_ok=True)
    except OSError:
        pass


@contextmanager
def on_failure(cleanup: Callable[[], None], path: str | os.PathLike) -> Iterator[None]:
    """Run `cleanup` if the block raises; an OSError is raised again naming `path` (`naming`)."""
    try:
        yield
    except OSError as e:
        cleanup()
        named = naming(e, path)
        if named is e:
            raise
        raise named from e
    except BaseException:
        cleanup()
        raise


def temporary_path(path: str | os.PathLike) -> Path:
    """A name beside `path` for one writer's temporary file: unique per process, thread and
    machine (a random part: pids repeat across the nodes of a cluster), ending in `.tmp` so that
    listings of finished files (`*.json`, `*.npy`, a store's keys) never take it for one."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """The temporary file to write (`temporary_path`); renamed to `path` once the block ends
    without error, removed if it raises. Concurrent writers of one `path` each rename a whole
    file of their own: the last rename wins, and every reader sees one writer's file whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    with on_failure(lambda: remove_quietly(tmp), path):
        yield tmp
        os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text)


def save_npy_atomic(path: Path, arr: np.ndarray) -> None:
    """`np.save` to exactly `path` (no `.npy` appended), whole or not at all."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        np.save(f, arr)
