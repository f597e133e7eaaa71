"""The columns documents carry between stages (Parquet, zstd).

The reader fills the base fields; each step adds its `output_fields`. Keeping the schema
explicit (rather than inferring it per file) makes every task's Parquet file identical in
schema, so pyarrow/pandas/`datasets` read a stage's output folder as one table.
"""

from __future__ import annotations

import pyarrow as pa
from datatrove.data import Document

from gristmill.native._words import utf8_length

#: a text's size in UTF-8 bytes, len(text.encode("utf-8")), counted without encoding a copy
#: (every step counts the bytes in and out of every document it sees)
text_bytes = utf8_length

BASE_FIELDS: dict[str, pa.DataType] = {
    "text": pa.large_string(),
    "id": pa.string(),  # WARC-Record-ID
    "url": pa.string(),  # WARC-Target-URI
    "date": pa.string(),  # WARC-Date, ISO 8601 as written by Common Crawl
    "crawl": pa.string(),  # e.g. CC-MAIN-2014-10, from the warcinfo record's isPartOf
    "cc_language": pa.string(),  # WARC-Identified-Content-Language when the crawl has it
    "source": pa.string(),  # the WET file the record came from
    "offset": pa.int64(),  # byte offset of the record in that file's decompressed WARC stream
}


def schema_for(extra_fields: dict[str, pa.DataType]) -> pa.Schema:
    fields = dict(BASE_FIELDS)
    fields.update(extra_fields)
    return pa.schema([pa.field(name, typ) for name, typ in fields.items()])


def documents_to_table(docs: list[Document], schema: pa.Schema) -> pa.Table:
    columns = {}
    for field in schema:
        if field.name == "text":
            columns["text"] = [d.text for d in docs]
        elif field.name == "id":
            columns["id"] = [d.id for d in docs]
        else:
            columns[field.name] = [d.metadata.get(field.name) for d in docs]
    return pa.table(columns, schema=schema)


def table_to_documents(table: pa.Table) -> list[Document]:
    cols = table.to_pydict()
    meta_names = [n for n in cols if n not in ("text", "id")]
    return [
        Document(text=cols["text"][i], id=cols["id"][i], metadata={n: cols[n][i] for n in meta_names})
        for i in range(table.num_rows)
    ]
