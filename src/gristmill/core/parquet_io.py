"""Documents between stages: Parquet files read by `ParquetReader`, written by `ParquetWriter`.

Reading: files are sorted by name (which starts with the writing task's rank) and dealt to
tasks round-robin, so a stage's input order is defined whatever the number of tasks.

Writing: files are written to `<name>.tmp` and renamed when the task finishes, so a task
killed mid-way leaves no half file that a re-run could mistake for output; the re-run rewrites
the same bytes (pyarrow writes deterministically for the same rows and options). A writer is
built without a folder or schema: the stage context binds it to its stage's `output/` and to
the columns documents carry at that point of the plan.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datatrove.data import Document, DocumentsPipeline

from gristmill.core.documents import documents_to_table, schema_for, table_to_documents
from gristmill.core.files import on_failure, remove_quietly
from gristmill.core.step import Step, Workload
from gristmill.core.working_copy import listed, staged

ROW_GROUP_DOCS = 2000
# Fault injection for tests of resumption: the process dies (as if killed) after writing this
# many documents in a task, leaving a half-written `.tmp` file behind.
FAULT_ENV = "GRISTMILL_FAULT_AFTER_DOCS"
# ... and for tests of failure reporting: the task of this rank raises (a failed task, not a kill).
FAIL_TASK_ENV = "GRISTMILL_FAIL_TASK"


class ParquetFile:
    """One Parquet file written in row groups, atomically renamed into place on close."""

    def __init__(self, path: Path, schema: pa.Schema, compression: str):
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.schema = schema
        self.compression = compression
        self.buffer: list[Document] = []
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self.aborted = False

    def add(self, doc: Document) -> None:
        self.buffer.append(doc)
        if len(self.buffer) >= ROW_GROUP_DOCS:
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
        self.aborted, self.buffer = True, []
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
        self.folder = Path(folder)

    def files(self) -> list[Path]:
        return sorted(listed(self.folder, "*.parquet", recursive=True), key=lambda p: (p.name, str(p)))

    def memory_bytes(self, work: Workload) -> int:
        """One row group decoded (ROW_GROUP_DOCS documents) and its documents: ~8x their text
        (the Arrow table, Python strings, Document objects, and what Arrow's memory pool keeps;
        fitted to the scale runs' peak RSS, docs/scale.md)."""
        return int(8 * ROW_GROUP_DOCS * work.text_bytes / max(work.documents, 1))

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for path in self.files()[rank::world_size]:
            self.stat_update("files")
            pf = pq.ParquetFile(staged(path))
            for i in range(pf.num_row_groups):
                for doc in table_to_documents(pf.read_row_group(i)):
                    self.stat_update("documents")
                    self.stat_update("bytes", value=len(doc.text.encode("utf-8")))
                    yield doc


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
        """One row group buffered (ROW_GROUP_DOCS documents), its Arrow table and compression
        buffers: ~8x the text (fitted to the scale runs' peak RSS)."""
        return int(8 * ROW_GROUP_DOCS * work.text_bytes / max(work.documents, 1))

    def bind(self, folder: Path, extra_fields: dict[str, pa.DataType], compression: str | None) -> None:
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
        fault_after = int(os.environ.get(FAULT_ENV, "0"))
        if os.environ.get(FAIL_TASK_ENV) == str(rank):
            raise RuntimeError(f"injected failure of task {rank} ({FAIL_TASK_ENV})")
        written = 0
        for doc in data:
            key = (doc.metadata.get("language") or "unknown") if self.per_language else ""
            out = files.get(key)
            if out is None:
                path = (self.folder / key if key else self.folder) / f"{rank:05d}.parquet"
                out = files[key] = ParquetFile(path, self.schema, self.compression)
            with self.track_time():
                out.add(doc)
            written += 1
            if written == fault_after:
                out.flush()
                os._exit(137)
            self.stat_update("documents")
            self.stat_update("bytes", value=len(doc.text.encode("utf-8")))
            yield doc
        if not files:
            files[""] = ParquetFile(self.folder / f"{rank:05d}.parquet", self.schema, self.compression)
        with self.track_time():
            for out in files.values():
                out.close()
