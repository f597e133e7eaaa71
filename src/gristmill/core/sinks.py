"""Sinks a filter writes beside its output: a deterministic sample of the documents it dropped.

(Score histograms and samples of kept and dropped documents: `core.scores`.)
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import xxhash
from datatrove.data import Document

from gristmill.core.documents import schema_for
from gristmill.core.parquet_io import ParquetFile
from gristmill.core.run_folder import RunFolder

#: text of a row group of dropped documents: small, since every filter of a stage keeps one
#: buffered beside the stage's own writer (a longer document is written alone)
SAMPLE_ROW_GROUP_BYTES = 4 << 20


class DroppedSampler:
    """Keeps a deterministic sample of the documents one filter dropped, with the reason.

    Sampling is by a hash of the document id, not a random draw, so a re-run samples the same
    documents and the stage folder stays byte-identical.
    """

    reason_field: ClassVar[str] = "drop_reason"

    def __init__(self, folder: str | Path, rate: float, extra_fields: dict[str, pa.DataType]):
        self.folder = Path(folder)  # a name in the run folder `open` is given
        self.rate = rate
        self.threshold = int(rate * 2**64)
        self.schema = schema_for({**extra_fields, self.reason_field: pa.string()})
        self._file: ParquetFile | None = None
        self._rank = 0

    def open(self, rank: int, run_folder: RunFolder) -> DroppedSampler:
        self._rank, self._file, self._at = rank, None, run_folder.path(self.folder)
        return self

    def offer(self, doc: Document, reason: str | None) -> None:
        if self.rate <= 0 or xxhash.xxh3_64_intdigest(doc.id or doc.text) >= self.threshold:
            return
        if self._file is None:
            self._file = ParquetFile(
                self._at / f"{self._rank:05d}.parquet", self.schema, "zstd", SAMPLE_ROW_GROUP_BYTES
            )
        doc.metadata[self.reason_field] = reason or "unspecified"
        self._file.add(doc)

    def close(self) -> None:
        """The task finished: the sample is renamed into place."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def abort(self) -> None:
        """The task failed: the partial sample is removed, not renamed into place as if whole
        (the re-run writes it again)."""
        if self._file is not None:
            self._file.abort()
            self._file = None
