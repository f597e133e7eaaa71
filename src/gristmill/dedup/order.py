"""The global order key of documents: (source file, byte offset[, paragraph]).

Dedup keeps the first occurrence in this order, whatever the number of tasks. Each task of a
dedup's first stage records the sources it saw in `sources/task_NNNNN.json`; later stages rank
all sources seen by all tasks lexicographically (the order in which the planner lists input
files: globs sorted, Common Crawl listings sorted), and a document's key is the uint64
`rank << 40 | offset` (offsets are < 1 TiB, ranks < 2^23).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

OFFSET_BITS = 40


class SourceTable:
    """Task-local source name -> index, saved for the later stages."""

    def __init__(self):
        self.index: dict[str, int] = {}

    def __call__(self, source: str | None) -> int:
        source = source or ""
        i = self.index.get(source)
        if i is None:
            i = self.index[source] = len(self.index)
        return i

    def save(self, folder: Path, rank: int) -> None:
        write_json_atomic(folder / "sources" / f"task_{rank:05d}.json", list(self.index))


def load_ranks(folder: Path) -> tuple[dict[int, np.ndarray], dict[str, int]]:
    """({task: local index -> global rank}, {source: global rank}) from `folder/sources/`."""
    tables = {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in sorted((folder / "sources").glob("task_*.json"))}
    names = sorted({s for t in tables.values() for s in t})
    rank = {s: i for i, s in enumerate(names)}
    return {t: np.array([rank[s] for s in names_t], dtype=np.uint64) for t, names_t in tables.items()}, rank


def order_key(ranks: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    off = offsets.astype(np.int64)
    if len(off) and (off.min() < 0 or off.max() >= 1 << OFFSET_BITS):
        raise ValueError("document offsets must be in [0, 2^40): the dedup order key needs `offset`")
    return (ranks.astype(np.uint64) << np.uint64(OFFSET_BITS)) | off.astype(np.uint64)


def write_json_atomic(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def save_npy(path: Path, arr: np.ndarray) -> None:
    """np.save via a temporary file renamed into place (a killed task leaves no half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, arr)
    os.replace(tmp, path)
