"""Benchmark files as `decontaminate` reads them: JSONL (optionally gzipped), Parquet or plain
text, the texts of one named field (a string or a list of strings per record) or of each line.

Every problem is one line naming the file, the line or row, and the field (`BenchmarkError`):
a missing file, a line that is not JSON or not UTF-8, a record without the field or with an
empty one, a Parquet file without the column or with a damaged page, a damaged gzip stream.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.core.messages import printable

Format = Literal["auto", "jsonl", "parquet", "text"]
_READ_CHUNK = 1 << 20


class BenchmarkError(ValueError):
    """A benchmark file that cannot be used: one line naming the file, the line or row, the field."""


def format_of(path: str, given: str = "auto") -> str | None:
    """The format of a benchmark file: `given`, else from its name (`.jsonl`/`.ndjson`,
    `.parquet`, `.txt`; `.gz` after jsonl and txt); None if the name does not say."""
    if given != "auto":
        return given
    name = path.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet") and not path.lower().endswith(".gz"):
        return "parquet"
    if name.endswith(".txt"):
        return "text"
    return None


def sha256_of(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _open_lines(path: str):
    return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")


def _texts_of_value(value, where: str, field_name: str) -> list[str]:
    """The texts of one record's field: a string, or a list of strings (each a text)."""
    if isinstance(value, str):
        if not value.strip():
            raise BenchmarkError(f"{where}: field {field_name!r} is empty")
        return [value]
    if isinstance(value, list):
        if not value:
            raise BenchmarkError(f"{where}: field {field_name!r} is empty")
        bad = [v for v in value if not isinstance(v, str)]
        if bad:
            raise BenchmarkError(
                f"{where}: field {field_name!r} is a list holding {type(bad[0]).__name__}, expected text"
            )
        texts = [v for v in value if v.strip()]
        if not texts:
            raise BenchmarkError(f"{where}: field {field_name!r} is empty")
        return texts
    if value is None:
        raise BenchmarkError(f"{where}: field {field_name!r} is empty (null)")
    raise BenchmarkError(f"{where}: field {field_name!r} is {type(value).__name__}, expected text or a list of texts")


def _jsonl_texts(path: str, field_name: str) -> Iterator[tuple[str, str]]:
    with _open_lines(path) as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{printable(path)}:{lineno}"
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except UnicodeDecodeError as e:
                raise BenchmarkError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
            except ValueError as e:
                raise BenchmarkError(f"{where}: not JSON ({e})") from None
            if not isinstance(record, dict):
                raise BenchmarkError(f"{where}: a JSON {type(record).__name__}, expected an object with {field_name!r}")
            if field_name not in record:
                keys = ", ".join(map(repr, list(record)[:8]))
                raise BenchmarkError(f"{where}: no field {field_name!r} (its fields: {keys or 'none'})")
            for text in _texts_of_value(record[field_name], where, field_name):
                yield where, text


def _text_texts(path: str) -> Iterator[tuple[str, str]]:
    with _open_lines(path) as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{printable(path)}:{lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BenchmarkError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
            if text.strip():
                yield where, text


def _parquet_texts(path: str, field_name: str) -> Iterator[tuple[str, str]]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise BenchmarkError(f"{printable(path)}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    names = pf.schema_arrow.names
    if field_name not in names:
        raise BenchmarkError(
            f"{printable(path)}: no column {field_name!r} (its columns: {', '.join(map(repr, names[:12]))})"
        )
    row = 0
    for batch in pf.iter_batches(columns=[field_name], batch_size=10_000):
        for value in batch.column(0).to_pylist():
            where = f"{printable(path)}: row {row}"
            row += 1
            for text in _texts_of_value(value, where, field_name):
                yield where, text


def read_texts(path: str, fmt: str, field_name: str | None) -> Iterator[tuple[str, str]]:
    """(where, text) of every text of a benchmark file: `file:line` (JSONL, text) or
    `file: row N` (Parquet). JSONL and Parquet: the field `field_name` of each record, a string
    or a list of strings; text: each non-blank line. Raises BenchmarkError at the first problem."""
    try:
        if fmt == "jsonl":
            yield from _jsonl_texts(path, field_name)
        elif fmt == "parquet":
            yield from _parquet_texts(path, field_name)
        else:
            yield from _text_texts(path)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise BenchmarkError(f"{printable(path)}: damaged gzip ({e or 'truncated'})") from None
    except pa.ArrowException as e:  # a damaged page of a Parquet file that opened
        raise BenchmarkError(f"{printable(path)}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    except OSError as e:
        raise BenchmarkError(f"{printable(path)}: {e.strerror or e}") from None
