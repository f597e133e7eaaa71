"""Reads a previous stage's Parquet output as the input of the next stage.

Files are sorted by name (which starts with the writing task's rank) and dealt to tasks
round-robin, so a stage's input order is defined whatever the number of tasks.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from datatrove.data import DocumentsPipeline

from gristmill.pipeline.documents import table_to_documents
from gristmill.pipeline.step import Step


class ParquetReader(Step):
    type = "📖 READER"
    yaml_name = "read_parquet"

    def __init__(self, folder: str | Path):
        super().__init__()
        self.folder = Path(folder)

    def files(self) -> list[Path]:
        return sorted(self.folder.rglob("*.parquet"), key=lambda p: (p.name, str(p)))

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for path in self.files()[rank::world_size]:
            self.stat_update("files")
            pf = pq.ParquetFile(path)
            for i in range(pf.num_row_groups):
                for doc in table_to_documents(pf.read_row_group(i)):
                    self.stat_update("documents")
                    self.stat_update("bytes", value=len(doc.text.encode("utf-8")))
                    yield doc
