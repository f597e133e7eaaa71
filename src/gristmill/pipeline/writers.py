"""Writers: a stage's kept documents as Parquet, and a sample of dropped documents.

Files are written to `<name>.tmp` and renamed when the task finishes, so a task killed
mid-way leaves no half file that a re-run could mistake for output; the re-run rewrites the
same bytes (pyarrow writes deterministically for the same rows and options).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from datatrove.data import Document, DocumentsPipeline

from gristmill.pipeline.documents import documents_to_table, schema_for
from gristmill.pipeline.step import Step

ROW_GROUP_DOCS = 2000
# Fault injection for tests of resumption: the process dies (as if killed) after writing this
# many documents in a task, leaving a half-written `.tmp` file behind.
FAULT_ENV = "GRISTMILL_FAULT_AFTER_DOCS"
# ... and for tests of failure reporting: the task of this rank raises (a failed task, not a kill).
FAIL_TASK_ENV = "GRISTMILL_FAIL_TASK"


class _ParquetFile:
    """One Parquet file written in row groups, atomically renamed into place on close."""

    def __init__(self, path: Path, schema: pa.Schema, compression: str):
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.schema = schema
        self.compression = compression
        self.buffer: list[Document] = []
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None

    def add(self, doc: Document) -> None:
        self.buffer.append(doc)
        if len(self.buffer) >= ROW_GROUP_DOCS:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        if self._writer is None:
            self.tmp.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.tmp, self.schema, compression=self.compression)
        self._writer.write_table(documents_to_table(self.buffer, self.schema))
        self.rows += len(self.buffer)
        self.buffer = []

    def close(self) -> None:
        self.flush()
        if self._writer is None:
            # A task with no kept documents still writes an empty file: "this task ran and
            # kept nothing" must be distinguishable from "this task never ran".
            self.tmp.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.tmp, self.schema, compression=self.compression)
        self._writer.close()
        os.replace(self.tmp, self.path)


class ParquetWriter(Step):
    """Writes kept documents to `<folder>/<rank>.parquet`, or `<folder>/<language>/<rank>.parquet`."""

    type = "💽 WRITER"
    yaml_name = "write_parquet"

    def __init__(
        self,
        folder: str | Path,
        extra_fields: dict[str, pa.DataType],
        compression: str = "zstd",
        per_language: bool = False,
    ):
        super().__init__()
        self.folder = Path(folder)
        self.schema = schema_for(extra_fields)
        self.compression = compression
        self.per_language = per_language

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        files: dict[str, _ParquetFile] = {}
        fault_after = int(os.environ.get(FAULT_ENV, "0"))
        if os.environ.get(FAIL_TASK_ENV) == str(rank):
            raise RuntimeError(f"injected failure of task {rank} ({FAIL_TASK_ENV})")
        written = 0
        for doc in data:
            key = (doc.metadata.get("language") or "unknown") if self.per_language else ""
            out = files.get(key)
            if out is None:
                path = (self.folder / key if key else self.folder) / f"{rank:05d}.parquet"
                out = files[key] = _ParquetFile(path, self.schema, self.compression)
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
            files[""] = _ParquetFile(self.folder / f"{rank:05d}.parquet", self.schema, self.compression)
        with self.track_time():
            for out in files.values():
                out.close()


class DroppedSampler:
    """Keeps a deterministic sample of the documents one filter dropped, with the reason.

    Sampling is by a hash of the document id, not a random draw, so a re-run samples the same
    documents and the stage folder stays byte-identical.
    """

    reason_field: ClassVar[str] = "drop_reason"

    def __init__(self, folder: str | Path, rate: float, extra_fields: dict[str, pa.DataType]):
        self.folder = Path(folder)
        self.rate = rate
        self.threshold = int(rate * 2**64)
        self.schema = schema_for({**extra_fields, self.reason_field: pa.string()})
        self._file: _ParquetFile | None = None
        self._rank = 0

    def open(self, rank: int) -> "DroppedSampler":
        self._rank = rank
        self._file = None
        return self

    def offer(self, doc: Document, reason: str | None) -> None:
        if self.rate <= 0 or xxhash.xxh3_64_intdigest(doc.id or doc.text) >= self.threshold:
            return
        if self._file is None:
            self._file = _ParquetFile(self.folder / f"{self._rank:05d}.parquet", self.schema, "zstd")
        doc.metadata[self.reason_field] = reason or "unspecified"
        self._file.add(doc)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
