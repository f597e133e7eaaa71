"""The global order key of documents: (source file, byte offset[, paragraph]).

Dedup keeps the first occurrence in this order, whatever the number of tasks. Each task of a
dedup's first stage records the sources it saw in `sources/task_NNNNN.json`; later stages rank
all sources seen by all tasks lexicographically (the order in which the planner lists input
files: globs sorted, Common Crawl listings sorted), and a document's key is the uint64
`rank << 40 | offset` (offsets are < 1 TiB, ranks < 2^23).

The key is also how every dedup stage after the first names a document (never by its position
in a task's input), so it must be unique: the WET reader's offset is the record's position in
the file's decompressed stream, and the first stages refuse documents that share a key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gristmill.core.files import write_text_atomic
from gristmill.core.run_folder import AS_GIVEN, RunFolder

if TYPE_CHECKING:
    from datatrove.data import Document

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
        write_text_atomic(folder / "sources" / f"task_{rank:05d}.json", json.dumps(list(self.index)))


def load_ranks(folder: Path, run_folder: RunFolder = AS_GIVEN) -> tuple[dict[int, np.ndarray], dict[str, int]]:
    """({task: local index -> global rank}, {source: global rank}) from `folder/sources/` (in
    `run_folder`)."""
    tables = {
        int(p.stem.split("_")[1]): json.loads(p.read_text())
        for p in sorted(run_folder.staged(folder, "sources").glob("task_*.json"))
    }
    names = sorted({s for t in tables.values() for s in t})
    rank = {s: i for i, s in enumerate(names)}
    return {t: np.array([rank[s] for s in names_t], dtype=np.uint64) for t, names_t in tables.items()}, rank


class DocKeys:
    """Order keys of documents from their `source` and `offset` (ranks from a first stage's tables)."""

    def __init__(self, first_stage: Path, step: str, run_folder: RunFolder = AS_GIVEN):
        self.rank, self.step = load_ranks(first_stage, run_folder)[1], step

    def __call__(self, doc: Document) -> int:
        r = self.rank.get(doc.metadata.get("source") or "")
        if r is None:
            raise ValueError(f"document {doc.id}: source {doc.metadata.get('source')!r} unseen by {self.step}")
        off = doc.metadata.get("offset")
        if off is None or not 0 <= off < 1 << OFFSET_BITS:  # as order_key, without numpy per document
            raise ValueError("document offsets must be in [0, 2^40): the dedup order key needs `offset`")
        return (int(r) << OFFSET_BITS) | int(off)


def check_unique(keys: np.ndarray, names: list[str], step: str) -> None:
    """Refuse documents that share (source, offset): dedup could not tell them apart.

    `keys` are order keys with source indices into `names` in place of global ranks.
    """
    s = np.sort(keys)
    same = np.flatnonzero(s[1:] == s[:-1])
    if len(same):
        raise shared_key_error(int(s[same[0]]), names, step)


def shared_key_error(key: int, names: list[str], step: str) -> ValueError:
    return ValueError(
        f"{step}: several documents have (source, offset) = ({names[key >> OFFSET_BITS]!r}, "
        f"{key & ((1 << OFFSET_BITS) - 1)}); dedup names a document by its source and offset, so they "
        "must be unique (read the WET files again with this version)"
    )


def order_key(ranks: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    off = offsets.astype(np.int64)
    if len(off) and (off.min() < 0 or off.max() >= 1 << OFFSET_BITS):
        raise ValueError("document offsets must be in [0, 2^40): the dedup order key needs `offset`")
    return (ranks.astype(np.uint64) << np.uint64(OFFSET_BITS)) | off.astype(np.uint64)
