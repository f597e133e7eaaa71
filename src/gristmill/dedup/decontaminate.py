"""`decontaminate`: documents that share an n-gram with a benchmark's texts are dropped, or lose
the lines that hold it.

GPT-3's rule (Brown et al. 2020, appendix C): a training document that shares a 13-gram with a
benchmark example is contaminated. Here:

* **Words** are dedup's (`dedup.text.words`): the text casefolded, punctuation and symbols
  deleted (datatrove's PUNCTUATION_SET), whitespace collapsed, then `split_words` with the
  page's language. So "The Cat, sat." and "the cat sat" are the same three words; punctuation
  between two letters without a space joins them ("and/or" is one word, "andor"). On pages
  labelled zh, ja, th, lo, km or my (langid's `language`) a word is an ICU word, and `n` counts
  ICU words (13 Chinese ICU words are ~20-25 characters); a benchmark entry in such a language
  says so with `language:`, so that its texts are segmented the same way (put `langid` before
  this step: a page without a label is cut into one-character "words" and matches no ICU
  n-gram).
* **n-grams** are hashed to 64 bits without building their strings (`dedup.text`'s scheme:
  xxh3_64 per word, a multiply-add over the n positions, murmur3's finaliser). n-grams never
  span two benchmark texts; in a document they span lines.
* **Short benchmark texts.** A text of k words, `min_words` <= k < n, is one k-gram of all its
  words (a document contains it when it contains those k words in a row); a text of fewer than
  `min_words` words is ignored and counted (`benchmark_short_texts_ignored`). The default 8 is
  GPT-3's minimum for non-synthetic tasks: shorter n-grams collide with ordinary text.
* **The index** is built once, in the planning process (`Decontaminate.__init__`, which
  `Step.build` calls): every benchmark n-gram hashed, sorted and unique, 8 bytes each, plus the
  index of the first benchmark file (in config order) that holds it, 2 bytes (4 beyond 65,536
  files), plus a bitmap of 16 bits per n-gram rounded up to a power of two (2 to 4 bytes); the
  short texts in one table (19 bytes each) keyed by their first `min_words` words (`Index`).
  It is stored in `index_dir` under a key of the files' sha256 and the settings that shape it,
  written whole or not at all, reused by every run with the same files and settings, and
  memory-mapped by each task (tasks on one machine share its pages). The run config records
  each file's sha256 (filled in when the config is loaded), so `pipeline run` on an existing
  run directory refuses a changed benchmark file as a changed configuration.
* **Documents** are looked up a batch at a time: their n-gram hashes (and `min_words`-gram
  hashes, when short texts were indexed) go through the bitmap, which refuses ~15 of 16 hashes
  that are not in the index with one bit test, and the rest are binary-searched. A false match
  needs two distinct n-grams with one 64-bit hash: ~3e-10 per document of 500 words against 10
  million benchmark n-grams.
* **`action: drop`** drops it (`contaminated`); **`action: cut`** removes every line holding a
  word of a matching n-gram (a line is what `str.splitlines` gives: in WET text, a paragraph or
  block of the page, as peers that decontaminate by paragraph do), together with its line
  break, and leaves every other line byte-identical. A document left with fewer than
  `min_words_after_cut` words is dropped (`too_short_after_cut`). Either way the document gets
  `contaminated_by` (the file names of the benchmarks it matched) and the stats count it per
  benchmark file (`contaminated_by_<file name>`).

Bad benchmark input (a missing file, a line that is not JSON, a record without the field or with
an empty one, a Parquet file without the column, a line or value over `max_record_bytes`, JSON
nested too deep or holding a lone surrogate) stops the planning with one line naming the file,
the line or row, and the field. What the build holds is bounded by settings (`build_bytes`: a
record up to `max_record_bytes`, a batch of words, the n-grams), and `memory_bytes`, which
`pipeline plan` adds up, is the larger of that and a task's figure.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
import xxhash
from datatrove.data import Document, DocumentsPipeline
from loguru import logger
from pydantic import Field, field_validator, model_validator

from gristmill.core.configlib import LID176_LABELS, FilterConfig, Strict, key_path_error
from gristmill.core.documents import text_bytes
from gristmill.core.files import on_failure
from gristmill.core.filter import Filter, FilterResult
from gristmill.core.messages import format_bytes, printable
from gristmill.core.step import Workload
from gristmill.dedup.benchmark_files import (
    MAX_RECORD_BYTES,
    BenchmarkError,
    Format,
    format_of,
    read_texts,
    sha256_of,
)
from gristmill.dedup.text import _fmix64, _multipliers, shingle_hashes, words
from gristmill.text.words import IDEOGRAPHIC_CHARS, SYLLABIC_CHARS, UNSPACED_LANGUAGES

#: the index folder's layout; a change makes every cached index a miss (it is part of the key)
INDEX_VERSION = 1
INDEX_FORMAT = "gristmill-decontaminate-index"
#: what one task holds per word of the document it is checking: the word hashes, the running
#: n-gram sums, one length's hashes, the search positions and matches (uint64 each, some twice)
DOC_BYTES_PER_WORD = 64
#: the largest document the memory model allows for: 1M words, about 6 MB of text
DOC_WORDS_BOUND = 1_000_000
#: benchmark texts hashed at once while the index is built, and the most words they hold (a
#: batch's words as strings, ~60 bytes each, and their hashes: the build's memory, whatever
#: the number of texts)
_BUILD_BATCH = 20_000
_BUILD_BATCH_WORDS = 250_000
#: peak bytes of reading one benchmark record per byte of it, beyond the batch and its n-grams:
#: its bytes, the decoded text, `words`' casefolded and stripped copies, its words as strings
#: (measured over a fresh process's imports, n-grams' share taken out: 8.7-8.9 for one-line
#: records of 8 and 32 MB of 10-letter words, 30.2 for 8 MB of 2-letter words, the worst: a
#: word per 3 bytes)
RECORD_BYTES_PER_BYTE = 32
#: a batch's words at `_BUILD_BATCH_WORDS`: ~60 bytes a word as str and list slot, 8 of hash,
#: and the n-grams hashed from them
BUILD_BATCH_BYTES = 80 * _BUILD_BATCH_WORDS
#: bytes per benchmark n-gram while the index is sorted and written: the collected hashes and
#: file indexes (int64 each), their concatenation, the sort order and the sorted copies
BUILD_BYTES_PER_NGRAM = 56

# characters of the scripts written without spaces (split_words makes each one a word unless
# the page's language picks ICU)
_UNSPACED_SCRIPT = re.compile(f"[{IDEOGRAPHIC_CHARS}{SYLLABIC_CHARS}]")


# --- configuration ---------------------------------------------------------------------------


class Benchmark(Strict):
    """One benchmark entry: a file (or a glob of files) and the field of its records to read."""

    path: str = Field(description="a JSONL, Parquet or plain-text file, or a glob of them")
    field: str | None = Field(
        None, description="JSONL/Parquet: the field holding the text (a string or a list of strings)"
    )
    format: Format = Field("auto", description="jsonl, parquet or text (one text per line); auto: from the name")
    language: str | None = Field(
        None, description="lid.176 label of the texts; zh/ja/th/lo/km/my: words are ICU words, as on such pages"
    )
    sha256: dict[str, str] | None = Field(
        None,
        description="each matched file's sha256, filled in when the config is loaded; given, a file that "
        "differs is refused",
    )

    @field_validator("language")
    @classmethod
    def _lid_label(cls, language: str | None) -> str | None:
        if language is not None and language not in LID176_LABELS:
            raise ValueError(f"not a lid.176 language label (e.g. en, zh, ja): {language!r}")
        return language

    @model_validator(mode="after")
    def _files(self):
        """Expand the glob, check each file's format and field, record its sha256."""
        pattern = os.path.expanduser(self.path)
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        problems = []
        if not matches:
            raise key_path_error([f"path: no file matches {self.path!r}"])
        found: dict[str, str] = {}
        for m in matches:
            if not os.path.exists(m):
                problems.append(f"path: no such file: {printable(m)}")
                continue
            if not os.path.isfile(m):
                problems.append(f"path: {printable(m)} is not a file")
                continue
            fmt = format_of(m, self.format)
            if fmt is None:
                problems.append(
                    f"path: {printable(m)}: format not known from its name (.jsonl, .parquet, .txt); set `format`"
                )
            elif fmt in ("jsonl", "parquet") and not self.field:
                problems.append(f"field: {printable(m)} is {fmt}: name the field that holds the text")
            elif fmt == "text" and self.field:
                problems.append(f"field: {printable(m)} is plain text (one text per line): it has no fields")
            try:
                found[m] = sha256_of(m)
            except OSError as e:
                problems.append(f"path: {printable(m)}: {e.strerror or e}")
        if not problems and self.sha256 is not None and self.sha256 != found:
            for m in sorted(set(found) | set(self.sha256)):
                was, now = self.sha256.get(m), found.get(m)
                if was != now:
                    problems.append(
                        f"sha256: {printable(m)}: "
                        + (
                            "not matched before"
                            if was is None
                            else "no longer matched"
                            if now is None
                            else f"changed (recorded {was[:12]}..., now {now[:12]}...)"
                        )
                    )
        if problems:
            raise key_path_error(problems)
        self.sha256 = found
        return self

    def files(self) -> list[tuple[str, str, str]]:
        """(path, sha256, format) of each matched file, in name order."""
        return [(path, sha, format_of(path, self.format)) for path, sha in (self.sha256 or {}).items()]


# --- the index -------------------------------------------------------------------------------

#: the index's arrays, each `<name>.npy` in its folder
ARRAYS = ("ngrams", "ngram_files", "short_prefix", "short_hash", "short_words", "short_files", "bitmap")


@dataclass
class IndexInfo:
    """A built index as the planning process found it: its folder, what it holds, and each
    array file's (size, mtime_ns), which a task checks before it maps them."""

    folder: Path
    meta: dict
    stamps: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.stamps.values())

    @property
    def ngrams(self) -> int:
        return int(self.meta["ngrams"])

    @property
    def labels(self) -> list[str]:
        """The label (file name) of each benchmark file, by file index."""
        return [f["label"] for f in self.meta["files"]]


@dataclass
class Index:
    """The arrays of an index, memory-mapped.

    * `ngrams`: the benchmark n-grams' hashes, sorted and unique (uint64), and `ngram_files`, the
      index of the first benchmark file (in config order) holding each (uint16; uint32 beyond
      65,536 files);
    * the short texts (`min_words` <= k < n words), one row each, sorted by `short_prefix`, the
      hash of their first `min_words` words: `short_hash` (all k words), `short_words` (k) and
      `short_files`. A document's `min_words`-grams are looked up among the prefixes, and a
      prefix found is checked against the document's k-gram at that place: one lookup for every
      length of short text;
    * `bitmap`: 2^bits bits, bit `h >> (64 - bits)` set for each n-gram and prefix hash `h`
      (BITMAP_BITS_PER_ENTRY bits per entry, rounded up to a power of two), so that most of a
      document's hashes are refused by one bit test in a small array instead of a binary search
      of the large one.
    """

    ngrams: np.ndarray
    ngram_files: np.ndarray
    short_prefix: np.ndarray
    short_hash: np.ndarray
    short_words: np.ndarray
    short_files: np.ndarray
    bitmap: np.ndarray
    bits: int

    def maybe(self, q: np.ndarray) -> np.ndarray:
        """The positions of the hashes `q` that the bitmap does not refuse."""
        slot = q >> np.uint64(64 - self.bits)
        return np.flatnonzero((self.bitmap[slot >> np.uint64(3)] >> (slot & np.uint64(7)).astype(np.uint8)) & 1)


#: bitmap bits per index entry (n-grams and short-text prefixes), before rounding up to a power
#: of two: a hash that is not in the index passes the bitmap with probability 1/16 to 1/32
BITMAP_BITS_PER_ENTRY = 16


def _labels(paths: list[str]) -> list[str]:
    """Each file's name, or its path where two files share a name."""
    names = [os.path.basename(p) for p in paths]
    return [name if names.count(name) == 1 else p for name, p in zip(names, paths)]


def index_key(c: Decontaminate.Config) -> str:
    """The cache key of the index `c` makes: its files (path, sha256, format, field, language) in
    order, n, min_words and the layout version."""
    files = [[path, sha, fmt, b.field, b.language] for b in c.benchmarks for path, sha, fmt in b.files()]
    spec = {"version": INDEX_VERSION, "n": c.n, "min_words": c.min_words, "files": files}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class _Collected:
    """Hashes gathered while the benchmark files are read, in file order."""

    ngrams: list[np.ndarray] = field(default_factory=list)
    ngram_files: list[np.ndarray] = field(default_factory=list)
    short_prefix: list[np.ndarray] = field(default_factory=list)
    short_hash: list[np.ndarray] = field(default_factory=list)
    short_words: list[np.ndarray] = field(default_factory=list)
    short_files: list[np.ndarray] = field(default_factory=list)

    def add(self, batch: list[list[str]], fid: int, n: int, min_words: int) -> int:
        """Hash the texts of `batch` (word lists of at least min_words words) of file `fid`;
        returns the n-grams added."""
        if not batch:
            return 0
        hashes, cnt = shingle_hashes(batch, n)  # a text of k < n words: one hash of its k words
        lens = np.fromiter(map(len, batch), dtype=np.int64, count=len(batch))
        full = np.repeat(lens >= n, cnt)
        added = int(full.sum())
        self.ngrams.append(hashes[full])
        self.ngram_files.append(np.full(added, fid, dtype=np.int64))
        short = [w[:min_words] for w in batch if len(w) < n]
        if short:
            self.short_prefix.append(shingle_hashes(short, n)[0])  # min_words < n: one hash each
            self.short_hash.append(hashes[~full])  # one per short text, in text order
            self.short_words.append(lens[lens < n])
            self.short_files.append(np.full(len(short), fid, dtype=np.int64))
        return added


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


def _arrays(got: _Collected, file_dtype) -> dict[str, np.ndarray]:
    """The index's arrays (see `Index`) from the collected hashes; for a hash held by several
    files, the first file's index is kept."""
    h, f = _cat(got.ngrams, np.uint64), _cat(got.ngram_files, file_dtype)
    order = np.argsort(h, kind="stable")  # files were appended in order: the first one wins
    h, f = h[order], f[order]
    keep = np.ones(len(h), dtype=bool)
    keep[1:] = h[1:] != h[:-1]
    out = {"ngrams": h[keep], "ngram_files": f[keep]}
    prefix, full = _cat(got.short_prefix, np.uint64), _cat(got.short_hash, np.uint64)
    words_, files = _cat(got.short_words, np.uint8), _cat(got.short_files, file_dtype)
    order = np.argsort(full, kind="stable")
    keep = np.ones(len(full), dtype=bool)
    keep[1:] = full[order][1:] != full[order][:-1]
    order = order[keep]
    order = order[np.argsort(prefix[order], kind="stable")]
    out.update(short_prefix=prefix[order], short_hash=full[order], short_words=words_[order], short_files=files[order])
    entries = len(out["ngrams"]) + len(out["short_prefix"])
    bits = max(16, int(np.ceil(np.log2(max(entries, 1) * BITMAP_BITS_PER_ENTRY))))
    bitmap = np.zeros(1 << (bits - 3), dtype=np.uint8)
    for hashes in (out["ngrams"], out["short_prefix"]):
        slot = hashes >> np.uint64(64 - bits)
        np.bitwise_or.at(bitmap, slot >> np.uint64(3), np.left_shift(1, slot & np.uint64(7)).astype(np.uint8))
    out["bitmap"] = bitmap
    return out


def build_index(c: Decontaminate.Config, folder: Path) -> dict:
    """Read every benchmark file of `c` and write the index into `folder` (which must not exist
    yet: the caller renames it into place). Returns its meta."""
    started = time.perf_counter()
    entries = [(b, path, sha, fmt) for b in c.benchmarks for path, sha, fmt in b.files()]
    labels = _labels([path for _, path, _, _ in entries])
    file_dtype = np.uint16 if len(entries) <= 1 << 16 else np.uint32
    n, min_words = c.n, c.min_words
    got = _Collected()
    files_meta = []
    for fid, (b, path, sha, fmt) in enumerate(entries):
        where = printable(path)
        try:
            now = sha256_of(path)
        except OSError as e:
            raise BenchmarkError(f"{where}: {e.strerror or e}") from None
        if now != sha:
            raise BenchmarkError(
                f"{where}: changed since the config was loaded (sha256 {sha[:12]}..., now {now[:12]}...)"
            )
        counts = {"texts": 0, "ngrams": 0, "short_texts": 0, "short_texts_ignored": 0, "unspaced_without_language": 0}
        first_unspaced = None
        batch: list[list[str]] = []
        batch_words = 0
        for loc, text in read_texts(path, fmt, b.field, c.max_record_bytes):
            counts["texts"] += 1
            if b.language not in UNSPACED_LANGUAGES and _UNSPACED_SCRIPT.search(text):
                counts["unspaced_without_language"] += 1
                first_unspaced = first_unspaced or loc
            w = words(text, b.language)
            if len(w) < min_words:
                counts["short_texts_ignored"] += 1
                continue
            if len(w) < n:
                counts["short_texts"] += 1
            batch.append(w)
            batch_words += len(w)
            if len(batch) >= _BUILD_BATCH or batch_words >= _BUILD_BATCH_WORDS:
                counts["ngrams"] += got.add(batch, fid, n, min_words)
                batch, batch_words = [], 0
        counts["ngrams"] += got.add(batch, fid, n, min_words)
        if not counts["texts"]:
            raise BenchmarkError(f"{where}: holds no text" + (f" in field {b.field!r}" if b.field else ""))
        if counts["unspaced_without_language"]:
            logger.warning(
                f"decontaminate: {where}: {counts['unspaced_without_language']:,} texts (first: {first_unspaced}) "
                "are in a script written without spaces but the entry has no `language`: their words are single "
                "characters, and pages labelled zh/ja/th/... (ICU words) will not match them; set `language:`"
            )
        files_meta.append({"path": path, "sha256": sha, "label": labels[fid], "field": b.field, **counts})
    arrays = _arrays(got, file_dtype)
    folder.mkdir(parents=True)
    for name in ARRAYS:
        np.save(folder / f"{name}.npy", arrays[name])
    meta = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "n": n,
        "min_words": min_words,
        "ngrams": len(arrays["ngrams"]),
        "short": len(arrays["short_prefix"]),
        "bitmap_bits": int(np.log2(len(arrays["bitmap"]) * 8)),
        "texts": sum(f["texts"] for f in files_meta),
        "short_texts": sum(f["short_texts"] for f in files_meta),
        "short_texts_ignored": sum(f["short_texts_ignored"] for f in files_meta),
        "files": files_meta,
        "build_seconds": round(time.perf_counter() - started, 3),
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


_DTYPES = {"ngrams": "u8", "short_prefix": "u8", "short_hash": "u8", "short_words": "u1", "bitmap": "u1"}


def _check_index(folder: Path, n: int, min_words: int) -> IndexInfo:
    """The index in `folder` as found (ValueError if incomplete or damaged)."""
    meta = json.loads((folder / "meta.json").read_text())
    if (meta.get("format"), meta.get("version"), meta.get("n"), meta.get("min_words")) != (
        INDEX_FORMAT,
        INDEX_VERSION,
        n,
        min_words,
    ):
        raise ValueError("not an index of this version, n and min_words")
    stamps = {}
    for name in ARRAYS:
        path = folder / f"{name}.npy"
        a = np.load(path, mmap_mode="r")
        expected = (
            1 << (meta["bitmap_bits"] - 3)
            if name == "bitmap"
            else meta["ngrams"]
            if name.startswith("ngram")
            else meta["short"]
        )
        if a.ndim != 1 or len(a) != expected or (name in _DTYPES and a.dtype != np.dtype(_DTYPES[name])):
            raise ValueError(f"{name}.npy: {a.dtype} {a.shape}, expected {expected} entries")
        st = path.stat()
        stamps[name] = (st.st_size, st.st_mtime_ns)
    h = np.load(folder / "ngrams.npy", mmap_mode="r")
    p = np.load(folder / "short_prefix.npy", mmap_mode="r")
    if not (bool(np.all(h[1:] > h[:-1])) and bool(np.all(p[1:] >= p[:-1]))):
        raise ValueError("hashes not sorted")
    return IndexInfo(folder, meta, stamps)


def prepare_index(c: Decontaminate.Config) -> IndexInfo:
    """The index of `c`: found in `index_dir` under its key, or built there now (written into a
    temporary folder and renamed into place, so a killed build leaves nothing a later run takes
    for an index; two runs building the same one at once both end with the same folder)."""
    root = Path(c.index_dir).expanduser()
    folder = root / index_key(c)
    if folder.is_dir():
        try:
            info = _check_index(folder, c.n, c.min_words)
            logger.info(
                f"decontaminate: index of {info.ngrams:,} {c.n}-grams ({format_bytes(info.bytes)}) reused from {folder}"
            )
            return info
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.warning(f"decontaminate: {folder}: unusable ({e}); building it again")
            shutil.rmtree(folder, ignore_errors=True)
    # unique per process and machine: plannings on two nodes may share `index_dir` (and a pid)
    tmp = root / f"{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    shutil.rmtree(tmp, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    with on_failure(lambda: shutil.rmtree(tmp, ignore_errors=True), tmp):
        meta = build_index(c, tmp)
        try:
            os.rename(tmp, folder)
        except OSError:  # another run renamed the same index into place first
            if not folder.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    info = _check_index(folder, c.n, c.min_words)
    logger.info(
        f"decontaminate: index of {info.ngrams:,} {c.n}-grams from {meta['texts']:,} texts of "
        f"{len(meta['files'])} files ({meta['short_texts']:,} short texts as whole, "
        f"{meta['short_texts_ignored']:,} under {c.min_words} words ignored), {format_bytes(info.bytes)}, "
        f"built in {meta['build_seconds']:.1f} s: {folder}"
    )
    return info


# --- the step --------------------------------------------------------------------------------


class Decontaminate(Filter):
    """Drops documents that share an n-gram (13 words, GPT-3's rule) with a benchmark's texts, or
    cuts the lines holding it (`action: cut`). Benchmarks are JSONL, Parquet or text files; the
    index is built once at planning and memory-mapped by the tasks. How it matches, cuts and
    keeps its index: docs/steps.md, "Decontamination"."""

    yaml_name = "decontaminate"
    drop_reasons = ("contaminated", "too_short_after_cut")
    output_fields = {"contaminated_by": pa.string()}
    #: documents looked up at once (one pass of numpy calls per batch)
    batch_size = 32
    #: a long page is looked up whole: its words as strings (~55 bytes each, a word per ~6 bytes
    #: of text), their hashes and sums; a contaminated page's cut holds its lines and their words
    #: again, the costlier path (measured with `action: cut`, each page after other steps in one
    #: process: 60, 238 and 771 MB over pages of 2, 8 and 30 MB; 51, 188 and 695 alone;
    #: docs/scale.md "Large records")
    document_factor = 32.0
    document_fixed = 8 << 20

    class Config(FilterConfig):
        # one index per step: only what happens after a cut may differ by language
        language_fixed: ClassVar[tuple[str, ...]] = (
            "benchmarks",
            "n",
            "min_words",
            "action",
            "index_dir",
            "max_record_bytes",
        )

        benchmarks: list[Benchmark] = Field(
            min_length=1,
            description="benchmark files: [{path: mmlu.jsonl (or a glob), field: question, format: "
            "auto|jsonl|parquet|text, language: (lid label; zh/ja/th: ICU words)}, ...]; "
            "each file's sha256 is recorded in the run config",
        )
        n: int = Field(
            13, ge=1, le=100, description="words per n-gram (GPT-3: 13); ICU words on zh/ja/th/lo/km/my pages"
        )
        min_words: int = Field(
            8,
            ge=1,
            description="a benchmark text of fewer than n words counts as one n-gram of all its words if it has "
            "at least this many, else it is ignored (and counted)",
        )
        action: Literal["drop", "cut"] = Field(
            "drop", description="drop: drop the document; cut: remove the lines holding a match"
        )
        min_words_after_cut: int = Field(
            1, ge=0, description="cut: drop a document left with fewer words (too_short_after_cut)"
        )
        max_record_bytes: int = Field(
            MAX_RECORD_BYTES,
            ge=1,
            description="the longest line (JSONL, text) or value (Parquet) of a benchmark file; a longer one stops "
            "the planning, naming file and line (reading one costs up to 32 bytes per byte)",
        )
        index_dir: str = Field(
            "~/.cache/gristmill/decontaminate",
            description="where indexes are built and kept, by the files' sha256 and settings; every task reads it "
            "(Slurm: shared storage)",
        )

        @model_validator(mode="after")
        def _short_rule(self):
            if self.min_words > self.n:
                raise ValueError(f"min_words ({self.min_words}) is more than n ({self.n})")
            return self

    def __init__(self, config: Config | None = None, /, **kwargs):
        super().__init__(config, **kwargs)
        # built (or found) now, in the planning process: a bad benchmark file stops the run
        # before any document is read, and the tasks only map the finished index
        self.index = prepare_index(self.config)
        self._tables: Index | None = None
        self._found: dict[int, list] = {}  # id(document) -> its matches, for the batch being decided
        self._mult = _multipliers(self.config.n)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_tables"] = None  # memory maps stay in their process; a task maps its own
        state["_found"] = {}
        return state

    memory_setting = "the task memory, or lower decontaminate.max_record_bytes"

    def memory_bytes(self, work: Workload) -> int:
        """The most a process holds for the step: a task's figure or the index build's, which
        the planning process runs (`build_bytes`), whichever is larger. A task holds the index
        (per benchmark n-gram: 8 bytes of hash, 2 of file index, 2 to 4 of bitmap; 19 per short
        text; mapped, so shared by the tasks of one machine), and the n-grams of the document
        being checked: 64 bytes per word, for documents of up to 1M words. And what every
        filter holds (`Filter.memory_bytes`: the batch, the dropped sample)."""
        task = self.index.bytes + DOC_BYTES_PER_WORD * DOC_WORDS_BOUND + super().memory_bytes(work)
        return max(task, self.build_bytes())

    def build_bytes(self) -> int:
        """What building the index holds at most: one record being read
        (`RECORD_BYTES_PER_BYTE` per byte of `max_record_bytes`), a batch of texts' words
        (`_BUILD_BATCH_WORDS`), and the n-grams collected and sorted (`BUILD_BYTES_PER_NGRAM`
        each): set by the settings and the benchmarks, never by a file's lines."""
        c = self.config
        record = RECORD_BYTES_PER_BYTE * c.max_record_bytes
        return record + BUILD_BATCH_BYTES + BUILD_BYTES_PER_NGRAM * self.index.ngrams

    def tables(self) -> Index:
        """The index, memory-mapped; refused if its files changed since the planning process
        checked them."""
        if self._tables is None:
            info = self.index
            arrays = {}
            for name in ARRAYS:
                path = info.folder / f"{name}.npy"
                try:
                    st = path.stat()
                except OSError as e:
                    raise BenchmarkError(
                        f"{path}: decontamination index gone since planning ({e.strerror}); run the command again"
                    ) from None
                if (st.st_size, st.st_mtime_ns) != info.stamps[name]:
                    raise BenchmarkError(f"{path}: decontamination index changed since planning; run the command again")
                arrays[name] = np.load(path, mmap_mode="r").view(np.ndarray)
            self._tables = Index(**arrays, bits=int(info.meta["bitmap_bits"]))
        return self._tables

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        self.tables()  # mapped before the first document, so the step's timer measures lookups
        if rank == 0:  # once per run (the stage's tasks' stats are summed)
            m = self.index.meta
            self.stat_update("benchmark_files", value=len(m["files"]))
            self.stat_update("benchmark_texts", value=m["texts"])
            self.stat_update("benchmark_ngrams", value=m["ngrams"])
            self.stat_update("benchmark_short_texts", value=m["short_texts"])
            self.stat_update("benchmark_short_texts_ignored", value=m["short_texts_ignored"])
        yield from super().run(data, rank, world_size)

    def matches(self, word_lists: list[list[str]]) -> list[list[tuple[np.ndarray, int, np.ndarray]]]:
        """For each word list: (first word of each match, its length in words, the benchmark
        file index of each), for its n-grams found among the benchmark n-grams and the short
        texts it holds. The lists are hashed back to back, so that a batch of documents costs
        one pass of numpy calls, not one per document; no match spans two lists."""
        index = self.tables()
        n, min_words = self.config.n, self.config.min_words
        lens = np.fromiter(map(len, word_lists), dtype=np.int64, count=len(word_lists))
        ends = np.cumsum(lens)
        total = int(ends[-1]) if len(ends) else 0
        found: list[list] = [[] for _ in word_lists]
        short = len(index.short_prefix) > 0 and total >= min_words
        longest = n if len(index.ngrams) and total >= n else min_words if short else 0
        if not longest:
            return found
        hv = np.fromiter(map(xxhash.xxh3_64_intdigest, chain.from_iterable(word_lists)), dtype=np.uint64, count=total)
        m = self._mult
        acc = hv * m[0]  # acc[:total-k+1] holds the k-grams' sums once the first k terms are in
        for k in range(1, longest + 1):
            if k > 1:
                acc[: total - k + 1] += hv[k - 1 :] * m[k - 1]
            if k == min_words and short:
                self._short_matches(index, _fmix64(acc[: total - k + 1].copy()), hv, ends, found)
            if k == n and longest == n:
                q = _fmix64(acc[: total - k + 1].copy())
                at = index.maybe(q)
                doc = np.searchsorted(ends, at, side="right")
                inside = at + n <= ends[doc]  # not across two lists
                at, doc = at[inside], doc[inside]
                if len(at):
                    pos = np.minimum(np.searchsorted(index.ngrams, q[at]), len(index.ngrams) - 1)
                    hit = index.ngrams[pos] == q[at]
                    for d in np.unique(doc[hit]).tolist():
                        mine = hit & (doc == d)
                        found[d].append((at[mine] - (ends[d] - lens[d]), n, index.ngram_files[pos[mine]]))
        return found

    def _short_matches(self, index: Index, q: np.ndarray, hv: np.ndarray, ends: np.ndarray, found: list) -> None:
        """The short texts whose first min_words words are the `min_words`-grams `q` and whose
        other words follow them in the same list (word hashes `hv`, lists ending at `ends`)."""
        at = index.maybe(q)
        if not len(at):
            return
        lo = np.searchsorted(index.short_prefix, q[at], side="left")
        hi = np.searchsorted(index.short_prefix, q[at], side="right")
        some = hi > lo
        m = self._mult
        for start, a, b in zip(at[some].tolist(), lo[some].tolist(), hi[some].tolist()):
            d = int(np.searchsorted(ends, start, side="right"))
            first = int(ends[d - 1]) if d else 0
            for row in range(a, b):  # the short texts that start with these words: few
                k = int(index.short_words[row])
                if start + k <= ends[d]:
                    h = _fmix64(np.array([(hv[start : start + k] * m[:k]).sum(dtype=np.uint64)], dtype=np.uint64))
                    if h[0] == index.short_hash[row]:
                        found[d].append((np.array([start - first]), k, index.short_files[row : row + 1]))

    def score_batch(self, docs: list[Document]) -> None:
        """Look the whole batch up at once; `filter` decides on each document's matches."""
        found = self.matches([words(d.text, self.language_of(d)) for d in docs])
        self._found = {id(d): f for d, f in zip(docs, found)}

    def filter(self, doc: Document, config: Config) -> FilterResult:
        found = self._found.pop(id(doc), None)
        if found is None:  # called without score_batch (one document)
            found = self.matches([words(doc.text, self.language_of(doc))])[0]
        if not found:
            return True
        fids = sorted(set(chain.from_iterable(f.tolist() for _, _, f in found)))
        labels = list(dict.fromkeys(self.index.labels[i] for i in fids))  # a file listed twice: once
        for label in labels:
            self.stat_update(f"contaminated_by_{label}")
        doc.metadata["contaminated_by"] = ", ".join(labels)
        if self.config.action == "drop":
            return False, "contaminated"
        return self._cut(doc, self.language_of(doc), config)

    def _cut(self, doc: Document, language: str | None, config: Config) -> FilterResult:
        """Remove the lines holding a word of a match; the others stay byte for byte."""
        lines = doc.text.splitlines(keepends=True)
        per_line = [words(line, language) for line in lines]
        counts = np.fromiter(map(len, per_line), dtype=np.int64, count=len(lines))
        found = self.matches([list(chain.from_iterable(per_line))])[0]
        if not found:  # the page's words differ line by line (ICU at a line break): not located
            self.stat_update("contaminated_not_located")
            return False, "contaminated"
        total = int(counts.sum())
        edges = np.zeros(total + 1, dtype=np.int64)
        for starts, k, _ in found:
            np.add.at(edges, starts, 1)
            np.add.at(edges, starts + k, -1)
        covered = np.cumsum(edges[:-1]) > 0
        spans = int(covered[0]) + int(np.count_nonzero(covered[1:] & ~covered[:-1]))
        cut = set(np.unique(np.repeat(np.arange(len(lines)), counts)[covered]).tolist())
        before = text_bytes(doc.text)
        doc.text = "".join(line for i, line in enumerate(lines) if i not in cut)
        self.stat_update("documents_cut")
        self.stat_update("spans_cut", value=spans)
        self.stat_update("lines_cut", value=len(cut))
        self.stat_update("bytes_cut", value=before - text_bytes(doc.text))
        if total - int(sum(counts[i] for i in cut)) < config.min_words_after_cut:
            return False, "too_short_after_cut"
        return True
