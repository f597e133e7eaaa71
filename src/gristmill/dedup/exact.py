"""`exact_dedup`: Bloom-filter exact dedup of documents or paragraphs, across tasks.

Three stages (laid out by `ExactDedup.stages`):

1. `exact_dedup_hash` (T tasks): each task reads its share of the documents, hashes each
   normalised document (or each normalised paragraph = line) with xxh3_128 and writes records
   (hash, source index, offset, paragraph) into one file per filter *slice*, routed by the
   Bloom block the hash falls in. It also writes its sources table and what it read
   (`inputs.py`: rows and a hash of the (source, offset) columns per Parquet file).
2. `exact_dedup_find` (T tasks, one slice each): a slice task owns the blocks of one slice of
   the Bloom filter (`filter/slice_NNNNN.bloom`, a memory-mapped file kept as the run's saved
   filter), loads all records routed to it, sorts them by the global order key (source file,
   offset, paragraph) and test-and-sets them in that order: the first occurrence is kept, later
   ones are duplicates, whatever the number of tasks (an item's bits live in one block, so the
   slices never interact). It writes the duplicates (order key, paragraph, hash) per hashing
   task, and counts items, duplicates, the fill ratio and the FP rate it implies.
3. `exact_dedup_filter` (T tasks): re-reads the same files, first checking they are what the
   hash stage read (else the task fails naming the file), and drops duplicate documents, or
   removes duplicate paragraphs and drops documents left shorter than `min_doc_chars` /
   `min_doc_words`. A document is found by its order key, as in near dedup, never by its
   position, and the item's hash is checked again before anything is removed: a changed input
   can stop the stage, never make it remove the wrong text.

`filter_from` names the `filter/` folder of an earlier run: its bits are OR-ed into this run's
filter first, so documents already seen in that crawl are duplicates here (same size needed).
"""

from __future__ import annotations

import bisect
import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from pydantic import Field, field_validator

from gristmill.core import storage
from gristmill.core.configlib import Strict
from gristmill.core.documents import text_bytes
from gristmill.core.files import save_npy_atomic, write_text_atomic
from gristmill.core.parquet_io import ParquetReader
from gristmill.core.step import GlobalStep, StageContext, Workload
from gristmill.dedup import inputs
from gristmill.dedup.bloom import BLOCK_BITS, BloomFilter, BloomMeta, check_size, hash128, read_meta, size_for
from gristmill.dedup.order import (
    OFFSET_BITS,
    DocKeys,
    SourceTable,
    check_unique,
    load_ranks,
    order_key,
    shared_key_error,
)
from gristmill.dedup.phase import DedupFilterPhase, DedupPhase
from gristmill.dedup.text import normalize
from gristmill.text.words import CHUNK_CHARS, line_chunks, split_words, word_chunks

RECORD = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("src", "<u4"), ("offset", "<i8"), ("para", "<i4")])
DUP = np.dtype([("key", "<u8"), ("para", "<i4"), ("hi", "<u8"), ("lo", "<u8")])
BATCH = 1 << 16
#: text a hashing task holds before hashing it (items are whole documents in document mode)
BATCH_BYTES = 16 << 20
#: items a hashing task holds before writing them as sorted parts (32 bytes each: 32 MB)
SPILL_RECORDS = 1 << 20
#: what a find task holds of its slice at a time (~130 bytes per record while it sorts and
#: tests them: the record, its task, global key, sort order and copies)
FIND_CHUNK_BYTES = 64 << 20
FIND_BYTES_PER_RECORD = 130
#: bytes of text per paragraph (line) when estimating items in paragraph mode: a low figure, so
#: more items, so an upper bound (the sample: ~160 bytes per non-empty line)
PARAGRAPH_BYTES = 100


def estimated_items(work: Workload, granularity: str) -> float:
    return work.documents if granularity == "document" else max(work.documents, work.text_bytes / PARAGRAPH_BYTES)


def _paragraphs(text: str, granularity: str) -> list[tuple[int, str]]:
    """(paragraph index, normalised text) of the non-empty items to hash; -1 = whole document."""
    return list(_iter_paragraphs(text, granularity))


def _iter_paragraphs(text: str, granularity: str) -> Iterator[tuple[int, str]]:
    """`_paragraphs` one at a time: a long document's lines are split a piece at a time."""
    if granularity == "document":
        norm = normalize(text)
        if norm:
            yield -1, norm
        return
    for i, line in enumerate(_lines(text)):
        norm = normalize(line)
        if norm:
            yield i, norm


def _lines(text: str) -> Iterator[str]:
    """text.split("\\n"), one line at a time (a long text read a `line_chunks` piece at a time)."""
    if len(text) < CHUNK_CHARS:
        yield from text.split("\n")
        return
    pending = ""
    for piece in line_chunks(text):
        parts = piece.split("\n")
        parts[0] = pending + parts[0]
        pending = parts.pop()  # "" after a piece's final newline, the last line of the text's last piece
        yield from parts
    yield pending


def _slice_bounds(n_blocks: int, slices: int) -> np.ndarray:
    return np.array([s * n_blocks // slices for s in range(slices + 1)], dtype=np.int64)


def filter_slices(folder: str | Path, step: str = "exact_dedup") -> tuple[BloomMeta, list[Path]]:
    """The slices of an earlier run's `filter/` folder, checked whole: every block of the filter
    in some slice, every slice's bit file of the size its `.bloom.json` says. Deduplicating
    against part of a filter would keep, without a word, the documents of the missing blocks."""
    folder = Path(folder)
    where = f"{step}.filter_from: {folder}"
    if not folder.is_dir():
        raise FileNotFoundError(f"{where}: no such directory (an earlier run's <stage>/filter/ folder)")
    metas = sorted(folder.glob("slice_*.bloom.json"))
    if not metas:
        raise FileNotFoundError(f"{where}: no Bloom filter (no slice_*.bloom.json) in it")
    slices = [(m.with_name(m.name.removesuffix(".json")), read_meta(m)) for m in metas]
    first = slices[0][1]
    for path, m in slices:
        if (m.n_blocks, m.k) != (first.n_blocks, first.k):
            raise ValueError(
                f"{where}: {path.name}.json is of a filter of {m.n_blocks} blocks and k={m.k}, "
                f"{slices[0][0].name}.json of {first.n_blocks} blocks and k={first.k}: not one filter"
            )
    named = {path.name for path, _ in slices}
    stray = sorted(p.name for p in folder.glob("slice_*.bloom") if p.name not in named)
    if stray:
        raise ValueError(f"{where}: {', '.join(stray)} without its .bloom.json: which blocks it holds is unknown")
    gaps, end = [], 0
    for lo, hi in sorted((m.block_lo, m.block_hi) for _, m in slices):
        if lo > end:
            gaps.append((end, lo))
        end = max(end, hi)
    if end < first.n_blocks:
        gaps.append((end, first.n_blocks))
    if gaps:
        missing = sum(hi - lo for lo, hi in gaps)
        names = _missing_slices(slices, first.n_blocks)
        raise ValueError(
            f"{where}: incomplete: blocks {', '.join(f'{lo}..{hi}' for lo, hi in gaps[:5])}"
            f"{' ...' if len(gaps) > 5 else ''} ({missing} of {first.n_blocks}) are in no slice"
            + (f" ({', '.join(names[:5])}{' ...' if len(names) > 5 else ''} missing)" if names else "")
            + "; copy the earlier run's whole filter/ folder"
        )
    for path, m in slices:
        check_size(path, m)
    return first, [path for path, _ in slices]


def _missing_slices(slices: list[tuple[Path, BloomMeta]], n_blocks: int) -> list[str]:
    """Names of the slice files missing from a filter written by `slices` find tasks, when the
    slices present say how many there were (their ranges are `_slice_bounds` of that count)."""
    present = {}
    for path, m in slices:
        try:
            present[int(path.name.split(".")[0].split("_")[1])] = (m.block_lo, m.block_hi)
        except (IndexError, ValueError):
            return []
    lo, hi = next(iter(present.values()))
    guess = round(n_blocks / (hi - lo))
    for count in range(max(guess - 2, max(present) + 1), guess + 3):
        bounds = _slice_bounds(n_blocks, count)
        if all((int(bounds[r]), int(bounds[r + 1])) == rng for r, rng in present.items() if r < count):
            if max(present) < count:
                return [f"slice_{r:05d}.bloom" for r in range(count) if r not in present]
    return []


@dataclass
class ExactDedupPlan:
    """What every phase of one `exact_dedup` step reads (`self.params`): built once by
    `ExactDedup.stages`, shared by all its phases. The stage folders (names in the run folder, as
    `Stage.label`) are set as `stages()` adds each stage, so they are complete before any task
    runs; a phase reads only earlier ones, through its `run_folder`."""

    #: the step's validated parameters
    config: ExactDedup.Config
    #: the Bloom filter's blocks and hash functions (`ExactDedup.sizing`)
    n_blocks: int
    k: int
    #: filter slices, one per find task
    slices: int
    #: the documents the dedup reads, checked unchanged between the hash and filter stages
    #: (None: not checked)
    documents: Path | None
    #: YAML name of the step that planned the phases: what their errors name
    step: str = "exact_dedup"
    hash_folder: Path | None = None
    find_folder: Path | None = None


class ExactDedupHash(DedupPhase[ExactDedupPlan]):
    step_name = "exact_dedup_hash"

    def __init__(self, params: ExactDedupPlan, *, step_id: str | None = None):
        super().__init__(params, step_id=step_id)
        self.spill_records = SPILL_RECORDS

    def memory_bytes(self, work: Workload) -> int:
        """Held records up to `spill_records` (32 bytes, twice while sorted), the batch's texts,
        8 bytes per document of order keys."""
        all_items = estimated_items(work, self.params.config.granularity)
        items = all_items / max(work.tasks, 1)
        batch_text = min(BATCH_BYTES, min(BATCH, items) * work.text_bytes / max(all_items, 1))
        return int(64 * min(items, self.spill_records) + batch_text + 8 * work.documents_per_task)

    #: a long page's items (paragraphs normalised, as UTF-8) up to `BATCH_BYTES` at a time, one
    #: normalised copy of the page in document mode (measured in paragraph mode: 18, 70 and 156
    #: MB over 2, 8 and 30 MB pages, docs/scale.md "Large records")
    document_factor = 6.0
    document_fixed = 32 << 20

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p = self.params
        bounds = _slice_bounds(p.n_blocks, p.slices)
        sources = SourceTable()
        parts: list[np.ndarray] = []  # records not yet written: at most ~SPILL_RECORDS
        items, meta = [], []
        doc_keys = array("Q")  # 8 bytes per document: the task's repeats are refused at the end
        held, part, total, batch_bytes = 0, 0, 0, 0

        def flush():
            nonlocal held
            if not items:
                return
            h = hash128(items)
            rec = np.empty(len(items), dtype=RECORD)
            rec["hi"], rec["lo"] = h[:, 0], h[:, 1]
            m = np.array(meta, dtype=np.int64).reshape(-1, 3)
            rec["src"], rec["offset"], rec["para"] = m[:, 0], m[:, 1], m[:, 2]
            parts.append(rec)
            held += len(rec)
            items.clear(), meta.clear()

        def spill():
            """One part per slice, sorted in the global order (`_sort_in_global_order`), so a find
            task reads its slice one key range at a time: memory set by SPILL_RECORDS and
            FIND_CHUNK_BYTES, never by the corpus."""
            nonlocal held, part, total
            rec = np.concatenate(parts) if parts else np.empty(0, dtype=RECORD)
            rec = _sort_in_global_order(rec, list(sources.index))
            block = (rec["hi"] % np.uint64(p.n_blocks)).astype(np.int64)
            which = np.searchsorted(bounds, block, side="right") - 1
            for s in range(p.slices):
                save_npy_atomic(
                    self.stage_path("hashes", f"slice_{s:05d}", f"task_{rank:05d}.part{part:05d}.npy"),
                    rec[which == s],
                )
            parts.clear()
            total += len(rec)
            held, part = 0, part + 1

        for doc in data:
            with self.track_time():
                src, off = sources(doc.metadata.get("source")), doc.metadata.get("offset")
                if off is None or not 0 <= off < 1 << OFFSET_BITS:
                    raise ValueError(
                        f"{p.step}: document {doc.id}: no `offset` in [0, 2^40) "
                        "(the dedup order key needs source and offset)"
                    )
                doc_keys.append(src << OFFSET_BITS | off)
                long = len(doc.text) >= CHUNK_CHARS
                for para, norm in _iter_paragraphs(doc.text, p.config.granularity):
                    item = norm.encode("utf-8")
                    items.append(item)
                    batch_bytes += len(item)
                    meta.append((src, off, para))
                    if long and batch_bytes >= BATCH_BYTES:  # a long page's items a batch at a time
                        batch_bytes = 0
                        flush()
                        if held >= self.spill_records:
                            spill()
                # a batch of whole documents is bounded by its text too (65,536 pages were ~400 MB)
                if len(items) >= min(BATCH, self.spill_records) or batch_bytes >= BATCH_BYTES:
                    batch_bytes = 0
                    flush()
                    if held >= self.spill_records:
                        spill()
            self.stat_update("documents")
            self.stat_update("bytes", value=text_bytes(doc.text))
        with self.track_time():
            flush()
            if held or part == 0:
                spill()
            check_unique(np.frombuffer(doc_keys, dtype=np.uint64), list(sources.index), p.step)
            self.stat_update("items", value=total)
            sources.save(self.stage_path(), rank)
            if p.documents is not None:
                inputs.save(
                    self.stage_path("inputs", f"task_{rank:05d}.json"),
                    _task_files(self, p.documents, rank, world_size),
                    self.run_folder.path(p.documents),
                )
        return
        yield


def _sort_in_global_order(rec: np.ndarray, names: list[str]) -> np.ndarray:
    """Records sorted by (source, offset, paragraph) in the order every later stage uses: global
    source ranks sort the names, and a task's names in their own sorted order rank the same way,
    so a part sorted here is sorted by the global order key too."""
    name_rank = (
        np.argsort(np.argsort(np.array(names, dtype=object))).astype(np.int64) if names else np.zeros(0, np.int64)
    )
    return rec[np.lexsort((rec["para"], rec["offset"], name_rank[rec["src"].astype(np.int64)]))]


def _part_task(path: Path) -> int:
    return int(path.name.split(".")[0].split("_")[1])


def _task_files(phase: DedupPhase, folder: Path, rank: int, world_size: int) -> list[Path]:
    """The files this task's reader reads, fetched."""
    reader = ParquetReader(folder)
    reader.run_folder = phase.run_folder
    return [phase.run_folder.staged(f) for f in reader.files()[rank::world_size]]


class ExactDedupFind(DedupPhase[ExactDedupPlan]):
    step_name = "exact_dedup_find"

    def __init__(self, params: ExactDedupPlan, *, step_id: str | None = None):
        super().__init__(params, step_id=step_id)
        self.chunk_bytes = FIND_CHUNK_BYTES

    #: the per-task figure grows with items per slice: more tasks (slices) divide it
    memory_setting = "executor.tasks"

    def memory_bytes(self, work: Workload) -> int:
        """Its slice of the Bloom filter (memory-mapped, every page touched), one key range of
        records (`chunk_bytes`), and the duplicates found (28 bytes each; bounded by the items)."""
        # `work` is the dedup's input, as for every stage of a global step
        p = self.params
        items = estimated_items(work, p.config.granularity) / p.slices
        bloom = p.n_blocks * BLOCK_BITS // 8 // p.slices
        return int(bloom + min(items * FIND_BYTES_PER_RECORD, self.chunk_bytes) + 28 * items)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p = self.params
        with self.track_time():
            ranks, _ = load_ranks(p.hash_folder, self.run_folder)
            parts = [
                _SortedPart(np.load(f, mmap_mode="r"), ranks[_part_task(f)], _part_task(f))
                for f in sorted(self.run_folder.staged(p.hash_folder, "hashes", f"slice_{rank:05d}").glob("task_*.npy"))
            ]
            parts = [part for part in parts if len(part.rec)]
            n = sum(len(part.rec) for part in parts)
            bounds = _slice_bounds(p.n_blocks, p.slices)
            path = self.stage_path("filter", f"slice_{rank:05d}.bloom")
            bf = BloomFilter.create(
                path,
                p.config.capacity,
                p.config.fp_rate,
                (int(bounds[rank]), int(bounds[rank + 1])),
                p.n_blocks,
                p.k,
            )
            if p.config.filter_from:  # checked when planned; checked again: it may have changed since
                _, earlier = filter_slices(p.config.filter_from, p.step)
                bf.copy_from([BloomFilter.open(f) for f in earlier])
            dups: dict[int, list[np.ndarray]] = {t: [] for t in ranks}
            n_dup = 0
            # Key ranges of the order key, each holding ~FIND_CHUNK_BYTES of records: equal keys
            # fall in one range, and ranges are taken in order, so the first occurrence is kept
            # exactly as if the whole slice were sorted at once.
            cuts = _chunk_cuts(parts, -(-n * FIND_BYTES_PER_RECORD // self.chunk_bytes))
            for lo, hi in zip([0, *cuts], [*cuts, 1 << 64]):
                rec, task, key = _load_range(parts, lo, hi)
                order = np.lexsort((rec["para"], key))
                rec, task, key = rec[order], task[order], key[order]
                twice = np.flatnonzero((key[1:] == key[:-1]) & (rec["para"][1:] == rec["para"][:-1]))
                if len(twice):  # two documents of different tasks with one key (each task checked its own)
                    raise shared_key_error(
                        int(key[twice[0]]), sorted(load_ranks(p.hash_folder, self.run_folder)[1]), p.step
                    )
                hashes = np.stack([rec["hi"], rec["lo"]], axis=1)
                dup = np.zeros(len(rec), dtype=bool)
                for s in range(0, len(rec), BATCH):
                    dup[s : s + BATCH] = bf.test_and_set(hashes[s : s + BATCH])
                n_dup += int(dup.sum())
                for t in np.unique(task[dup]).tolist():
                    sel = dup & (task == t)
                    out = np.empty(int(sel.sum()), dtype=DUP)
                    out["key"], out["para"], out["hi"], out["lo"] = (
                        key[sel],
                        rec["para"][sel],
                        rec["hi"][sel],
                        rec["lo"][sel],
                    )
                    dups[t].append(out)
                del rec, task, key, hashes, dup
            bf.save()
            for t in sorted(ranks):  # every hashing task gets a file, maybe empty
                save_npy_atomic(
                    self.stage_path("dups", f"task_{t:05d}", f"slice_{rank:05d}.npy"),
                    np.concatenate(dups[t]) if dups[t] else np.empty(0, dtype=DUP),
                )
            fill, est = bf.fill_ratio(), bf.estimated_fp_rate()
        self.stat_update("items", value=n)
        self.stat_update("duplicates", value=n_dup)
        self.stat_update("key_ranges", value=len(cuts) + 1)
        # ppm integers: datatrove's stats sum numbers over tasks; the JSON keeps the exact values
        write_text_atomic(
            self.stage_path("filter", f"slice_{rank:05d}.stats.json"),
            json.dumps({"items": n, "duplicates": n_dup, "fill_ratio": fill, "estimated_fp_rate": est}),
        )
        self.stat_update("fill_ppm_sum", value=int(fill * 1e6))
        return
        yield


class _SortedPart:
    """A hashing task's part of one slice, memory-mapped, sorted by the global order key."""

    def __init__(self, rec: np.ndarray, ranks: np.ndarray, task: int):
        self.rec, self.ranks, self.task = rec, ranks, task

    def keys(self, rec: np.ndarray) -> np.ndarray:
        return order_key(self.ranks[rec["src"]], rec["offset"])

    def lower_bound(self, x: int) -> int:
        """First record with key >= x: ~log2(n) records read."""
        if x >= 1 << 64:
            return len(self.rec)
        return bisect.bisect_left(range(len(self.rec)), x, key=lambda i: int(self.keys(self.rec[i : i + 1])[0]))


def _chunk_cuts(parts: list[_SortedPart], chunks: int) -> list[int]:
    """chunks - 1 increasing order keys cutting the slice's records into ~equal ranges
    (quantiles of every 256th record's key: 1/256 of the keys are read)."""
    if chunks <= 1:
        return []
    sample = np.sort(np.concatenate([p.keys(np.asarray(p.rec[::256])) for p in parts]))
    cuts = sample[(np.arange(1, chunks) * len(sample)) // chunks] if len(sample) else []
    return sorted({int(c) for c in cuts})


def _load_range(parts: list[_SortedPart], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(records, hashing task, global key) of every part's records with lo <= key < hi."""
    recs, tasks, keys = [], [], []
    for p in parts:
        a, b = p.lower_bound(lo), p.lower_bound(hi)
        if b > a:
            r = np.array(p.rec[a:b])
            recs.append(r)
            tasks.append(np.full(len(r), p.task, dtype=np.int64))
            keys.append(p.keys(r))
    if not recs:
        return np.empty(0, dtype=RECORD), np.empty(0, np.int64), np.empty(0, np.uint64)
    return np.concatenate(recs), np.concatenate(tasks), np.concatenate(keys)


class ExactDedupFilter(DedupFilterPhase[ExactDedupPlan]):
    step_name = "exact_dedup_filter"

    def memory_bytes(self, work: Workload) -> int:
        """Its documents' duplicates, 28 bytes each: bounded by the task's items (all duplicates)."""
        return int(
            28 * estimated_items(work, self.params.config.granularity) / max(work.tasks, 1)
        ) + super().memory_bytes(work)

    #: a page with paragraphs removed: its lines, and the text made of the rest (a new string, up
    #: to 4 bytes a character; measured: 21, 80 and 315 MB over 2, 8 and 30 MB pages)
    document_factor = 11.0
    document_fixed = 8 << 20

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        p = self.params
        if p.documents is not None:
            inputs.check(
                self.run_folder.staged(p.hash_folder, "inputs", f"task_{rank:05d}.json"),
                _task_files(self, p.documents, rank, world_size),
                self.run_folder.path(p.documents),
                ExactDedupHash.step_name,
            )
        self._keys = DocKeys(p.hash_folder, ExactDedupHash.step_name, self.run_folder)
        # the task's duplicates as one array sorted by key: 28 bytes each (dicts of Python ints
        # took ~250), looked up by binary search
        dups = self.run_folder.staged(p.find_folder, "dups", f"task_{rank:05d}")
        parts = [np.load(f) for f in sorted(dups.glob("*.npy"))]
        d = np.concatenate(parts) if parts else np.empty(0, dtype=DUP)
        self._dups = d[np.argsort(d["key"], kind="stable")]
        yield from super().run(data, rank, world_size)

    def _paras(self, key: int) -> dict[int, tuple[int, int]]:
        k = self._dups["key"]
        a, b = int(np.searchsorted(k, np.uint64(key), "left")), int(np.searchsorted(k, np.uint64(key), "right"))
        d = self._dups[a:b]
        return {int(p): (int(h), int(lo)) for p, h, lo in zip(d["para"], d["hi"], d["lo"])}

    def filter(self, doc: Document, config: Strict):
        paras = self._paras(self._keys(doc)) if len(self._dups) else None
        if not paras:
            return True
        config = self.params.config
        lines = doc.text.split("\n") if config.granularity != "document" else None
        self._check_hashes(doc, paras, lines)
        if config.granularity == "document":
            return False, "exact_duplicate"
        doc.text = "\n".join(line for i, line in enumerate(lines) if i not in paras)
        del lines
        self.stat_update("paragraphs_removed", value=len(paras))
        # words as the Gopher filters count them: ICU's for zh/ja/th/lo/km/my pages (a long
        # page's a piece at a time)
        n_words = 0
        if config.min_doc_words:
            language = doc.metadata.get("language")
            if len(doc.text) < CHUNK_CHARS:
                n_words = len(split_words(doc.text, language))
            else:
                n_words = sum(map(len, word_chunks(doc.text, language)))
        if len(doc.text.strip()) < max(config.min_doc_chars, 1) or n_words < config.min_doc_words:
            return False, "exact_duplicate_paragraphs"
        return True

    def _check_hashes(self, doc: Document, paras: dict[int, tuple[int, int]], lines: list[str] | None) -> None:
        """The text to remove is the text that was found duplicate, or the task stops. Only the
        paragraphs to remove are normalised (`lines`: the document's, None for whole documents)."""
        if lines is None:
            norm = normalize(doc.text) or None
            found = [norm if p == -1 else None for p in paras]
        else:
            found = [(normalize(lines[p]) if 0 <= p < len(lines) else "") or None for p in paras]
        ok = None not in found and hash128([t.encode("utf-8") for t in found]).tolist() == [
            list(h) for h in paras.values()
        ]
        if not ok:
            raise ValueError(
                f"{doc.metadata.get('source')} @ {doc.metadata.get('offset')}: document {doc.id} is not "
                "the text exact_dedup_hash read; the input changed between stages: run the dedup "
                "again from exact_dedup_hash"
            )


class ExactDedup(GlobalStep):
    """Bloom-filter exact dedup of documents or of paragraphs (lines), across all tasks: the first
    occurrence in (source, offset) order is kept, whatever the number of tasks.

    Its three stages are described in the module docstring.
    """

    yaml_name = "exact_dedup"
    drop_reasons = ("exact_duplicate", "exact_duplicate_paragraphs")

    class Config(Strict):
        granularity: Literal["document", "paragraph"] = Field("document", description="what is deduplicated")
        capacity: int = Field(100_000_000, ge=1, description="items (documents or paragraphs) the filter is sized for")
        fp_rate: float = Field(1e-4, gt=0, lt=1, description="target false-positive rate at capacity")
        min_doc_chars: int = Field(0, ge=0, description="paragraph mode: drop documents left shorter (characters)")
        min_doc_words: int = Field(0, ge=0, description="paragraph mode: drop documents left with fewer words")
        filter_from: str | None = Field(None, description="an earlier run's filter/ folder to dedup against")

        @field_validator("filter_from")
        @classmethod
        def _local_filter(cls, value: str | None) -> str | None:
            if value is not None and storage.is_url(value):
                # its slices are memory-mapped and OR-ed into each find task's: a local folder
                raise ValueError(
                    f"{value}: an earlier filter on object storage is not supported (its slices are "
                    "memory-mapped); copy that filter/ folder to a local disk and name it here"
                )
            return value

    def sizing(self) -> tuple[int, int]:
        p = self.config
        if p.filter_from:  # the earlier filter fixes the size; a partial one is refused here
            m, _ = filter_slices(p.filter_from, self.yaml_name)
            return m.n_blocks, m.k
        return size_for(p.capacity, p.fp_rate)

    def stages(self, ctx: StageContext) -> None:
        n_blocks, k = self.sizing()
        # one plan for every phase; each stage's folder is set once the stage is added
        plan = ExactDedupPlan(
            self.config, n_blocks, k, slices=min(ctx.tasks, n_blocks), documents=ctx.documents, step=self.yaml_name
        )
        docs, name = ctx.documents, self.name
        hashed = ctx.stage("exact_dedup_hash", [ParquetReader(docs), ExactDedupHash(plan, step_id=name)])
        plan.hash_folder = Path(hashed.label)
        find = ctx.stage("exact_dedup_find", [ExactDedupFind(plan, step_id=name)], tasks=plan.slices)
        plan.find_folder = Path(find.label)
        ctx.stage("exact_dedup_filter", [ParquetReader(docs), ExactDedupFilter(plan, step_id=name), ctx.writer()])
