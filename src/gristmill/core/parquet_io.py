"""Documents between stages: Parquet files read by `ParquetReader`, written by `ParquetWriter`.

Reading: files are sorted by name (which starts with the writing task's rank) and dealt to
tasks round-robin, so a stage's input order is defined whatever the number of tasks.

Writing: files are written to `<name>.tmp` and renamed when the task finishes, so a task
killed mid-way leaves no half file that a re-run could mistake for output; the re-run rewrites
the same bytes (pyarrow writes deterministically for the same rows and options). A writer is
built without a folder or schema: the stage context binds it to its stage's `output/` and to
the columns documents carry at that point of the plan.

Memory. A row group closes at `ROW_GROUP_DOCS` documents or before a document would take its
text past `ROW_GROUP_BYTES`, so it holds at most that much text, or one longer document alone
(a count alone let 2,000 pages of 30 MB make one 60 GB group). The reader decodes one row group
at a time and makes Python documents of `READ_SLICE_BYTES` of it at a time, so what a task holds
is bounded by these settings and by the largest document (`input.max_record_bytes`), never by
how many large documents a file has.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datatrove.data import Document, DocumentsPipeline

from gristmill.core.documents import documents_to_table, schema_for, table_to_documents, text_bytes
from gristmill.core.files import on_failure, remove_quietly
from gristmill.core.step import DOCUMENT_BYTES_PER_BYTE, Step, Workload

ROW_GROUP_DOCS = 2000
#: text (UTF-8) of a row group: it closes before a document would take it past this (2,000 web
#: pages are ~10 MB; 2,000 pages of 30 MB were one group of 60 GB)
ROW_GROUP_BYTES = 16 << 20
#: text a reader turns into Python documents at a time, out of the row group it decoded
READ_SLICE_BYTES = 1 << 20
#: held per byte of a row group's text while it is written or read: the Python documents, the
#: Arrow table and what Arrow's memory pool keeps (fitted to the scale runs' peak RSS, docs/scale.md)
ROW_GROUP_FACTOR = 8


class ParquetFile:
    """One Parquet file written in row groups, atomically renamed into place on close."""

    def __init__(self, path: Path, schema: pa.Schema, compression: str, row_group_bytes: int | None = None):
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.schema = schema
        self.compression = compression
        self.row_group_bytes = ROW_GROUP_BYTES if row_group_bytes is None else row_group_bytes
        self.buffer: list[Document] = []
        self.buffer_bytes = 0
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self.aborted = False

    def add(self, doc: Document, size: int | None = None) -> None:
        """Buffer `doc` (`size`: its text's UTF-8 bytes, if known) for the current row group."""
        size = text_bytes(doc.text) if size is None else size
        if self.buffer and self.buffer_bytes + size > self.row_group_bytes:
            self.flush()  # the group would outgrow its bytes: the document starts the next one
        self.buffer.append(doc)
        self.buffer_bytes += size
        if len(self.buffer) >= ROW_GROUP_DOCS or self.buffer_bytes >= self.row_group_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        with on_failure(self.abort, self.path):
            if self._writer is None:
                self.tmp.parent.mkdir(parents=True, exist_ok=True)
                self._writer = pq.ParquetWriter(self.tmp, self.schema, compression=self.compression)
            self._writer.write_table(documents_to_table(self.buffer, self.schema))
        self.rows += len(self.buffer)
        self.buffer = []
        release_arrow_memory(self.buffer_bytes)
        self.buffer_bytes = 0

    def close(self) -> None:
        if self.aborted:  # its failure was raised already
            return
        self.flush()
        with on_failure(self.abort, self.path):
            if self._writer is None:
                # A task with no kept documents still writes an empty file: "this task ran and
                # kept nothing" must be distinguishable from "this task never ran".
                self.tmp.parent.mkdir(parents=True, exist_ok=True)
                self._writer = pq.ParquetWriter(self.tmp, self.schema, compression=self.compression)
            self._writer.close()
            os.replace(self.tmp, self.path)

    def abort(self) -> None:
        """Drop the file being written (its task failed): no `.tmp` is left behind. A failed write
        calls it, then raises naming the file: pyarrow's OSError (a full disk) names none."""
        self.aborted, self.buffer, self.buffer_bytes = True, [], 0
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 (the same full disk): the task's error is the one to report
                pass
            self._writer = None
        remove_quietly(self.tmp)


class ParquetReader(Step):
    type = "📖 READER"
    step_name = "read_parquet"

    def __init__(self, folder: str | Path):
        super().__init__()
        self.folder = Path(folder)  # in the run folder

    def files(self) -> list[Path]:
        return sorted(self.run_folder.listed(self.folder, "*.parquet", recursive=True), key=lambda p: (p.name, str(p)))

    def memory_bytes(self, work: Workload) -> int:
        """One row group decoded (ROW_GROUP_DOCS documents or ROW_GROUP_BYTES of text) with its
        documents, ~8x its text; or a group of one document of up to `work.max_document_bytes`:
        its Arrow column, its buffers while decoded and the document as Python holds it
        (`DOCUMENT_BYTES_PER_BYTE`; measured: 39 and 222 MB over 8 and 30 MB documents)."""
        return row_group_bytes(work) + int((DOCUMENT_BYTES_PER_BYTE + 3) * work.max_document_bytes)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for path in self.files()[rank::world_size]:
            self.stat_update("files")
            pf = pq.ParquetFile(self.run_folder.staged(path))
            for i in range(pf.num_row_groups):
                group = pf.read_row_group(i)
                # UTF-8 bytes of each text from the Arrow offsets: no encoded copy per document
                sizes = pc.binary_length(group.column("text")).to_numpy(zero_copy_only=False)
                for a, b in _slices(sizes, READ_SLICE_BYTES):
                    for doc, size in zip(table_to_documents(group.slice(a, b - a)), sizes[a:b].tolist()):
                        self.stat_update("documents")
                        self.stat_update("bytes", value=size)
                        yield doc
                del group
                release_arrow_memory(int(sizes.sum()))


def release_arrow_memory(nbytes: int) -> None:
    """After Arrow held `nbytes` for a row group: give the memory back to the system if that was
    a large group (Arrow's pool keeps what it freed: ~175 MB after writing one 30 MB document,
    under the next document's peak); small groups reuse it."""
    if nbytes >= ROW_GROUP_BYTES:
        pa.default_memory_pool().release_unused()


def _slices(sizes: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """[a, b) row ranges of about `budget` bytes each (a longer row alone), in order."""
    out, a, n = [], 0, len(sizes)
    ends = np.cumsum(sizes, dtype=np.int64)
    while a < n:
        base = ends[a - 1] if a else 0
        b = max(int(np.searchsorted(ends, base + budget, side="right")), a + 1)
        out.append((a, b))
        a = b
    return out


def row_group_bytes(work: Workload, budget: int = ROW_GROUP_BYTES) -> int:
    """Held for one row group of `budget` bytes (or ROW_GROUP_DOCS documents) while it is written
    or read: ~8x its text."""
    mean = work.text_bytes / max(work.documents, 1)
    return int(ROW_GROUP_FACTOR * min(ROW_GROUP_DOCS * mean, budget))


class ParquetWriter(Step):
    """Writes kept documents to `<folder>/<rank>.parquet`, or `<folder>/<language>/<rank>.parquet`.

    Built unbound (`ParquetWriter()`) inside a stage's pipeline; the stage context calls `bind`.
    """

    type = "💽 WRITER"
    step_name = "write_parquet"

    def __init__(
        self,
        folder: str | Path | None = None,
        extra_fields: dict[str, pa.DataType] | None = None,
        compression: str | None = "zstd",
        per_language: bool = False,
    ):
        super().__init__()
        self.folder = Path(folder) if folder is not None else None
        self.schema = schema_for(extra_fields) if extra_fields is not None else None
        self.compression = compression
        self.per_language = per_language

    def memory_bytes(self, work: Workload) -> int:
        """One row group buffered (ROW_GROUP_DOCS documents or ROW_GROUP_BYTES of text), its
        Arrow table and compression buffers: ~8x the text (fitted to the scale runs' peak RSS)."""
        return row_group_bytes(work)

    #: a document longer than a row group is written alone, as soon as it arrives: its UTF-8 for
    #: the `bytes` stat, its Arrow column (grown by doubling), the Parquet page and its
    #: compression (measured: 17, 68 and 249 MB over 2, 8 and 30 MB documents, the UTF-8 CPython
    #: keeps in a string counted with the document; docs/scale.md "Large records")
    document_factor = 8.5
    document_fixed = 4 << 20

    def bind(self, folder: Path, extra_fields: dict[str, pa.DataType], compression: str | None) -> None:
        """Write to `folder` (in the run folder)."""
        self.folder, self.schema, self.compression = Path(folder), schema_for(extra_fields), compression

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if self.folder is None or self.schema is None:
            raise RuntimeError("ParquetWriter was never bound to a stage (StageContext.stage binds it)")
        files: dict[str, ParquetFile] = {}
        try:
            yield from self._write(data, rank, files)
        except BaseException:  # a failed task (or one stopped) leaves no `.tmp` file
            for out in files.values():
                out.abort()
            raise

    def _write(self, data: DocumentsPipeline, rank: int, files: dict[str, ParquetFile]) -> DocumentsPipeline:
        folder = self.run_folder.path(self.folder)
        for doc in data:
            key = (doc.metadata.get("language") or "unknown") if self.per_language else ""
            out = files.get(key)
            if out is None:
                path = (folder / key if key else folder) / f"{rank:05d}.parquet"
                out = files[key] = ParquetFile(path, self.schema, self.compression)
            size = text_bytes(doc.text)
            with self.track_time():
                out.add(doc, size)
            self.stat_update("documents")
            self.stat_update("bytes", value=size)
            yield doc
        if not files:
            files[""] = ParquetFile(folder / f"{rank:05d}.parquet", self.schema, self.compression)
        with self.track_time():
            for out in files.values():
                out.close()
