"""Files written whole or not at all: a temporary file renamed into place, so a process killed
mid-write (or a full disk) never leaves a half file that a re-run would take for finished work."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np


@contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    """The temporary file to write; renamed to `path` once the block ends without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    yield tmp
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    with _replacing(path) as tmp:
        tmp.write_text(text)


def save_npy_atomic(path: Path, arr: np.ndarray) -> None:
    """`np.save` to exactly `path` (no `.npy` appended), whole or not at all."""
    with _replacing(path) as tmp, open(tmp, "wb") as f:
        np.save(f, arr)
