"""Benchmark files as `decontaminate` reads them: JSONL (optionally gzipped), Parquet or plain
text, the texts of one named field (a string or a list of strings per record) or of each line.

Every problem is one line naming the file, the line or row, and the field (`BenchmarkError`):
a missing file, a line that is not JSON or not UTF-8, a record without the field or with an
empty one, a Parquet file without the column or with a damaged page, a damaged gzip stream.

What a reader holds is bounded by `max_record_bytes` (`decontaminate.max_record_bytes`): a line
(JSONL, text) is read at most that many bytes at a time, and one that is longer is refused,
naming file and line, before it is decoded or split into words (a 200 MB one-line `.txt` took
planning to 4.95 GB: ~25 bytes per byte of a record); a Parquet value longer is refused
before it becomes a Python string (the Arrow page holding it is read once). A JSON record
nested too deep for Python's parser, or holding a lone surrogate escape (`"\ud800"`, which no
UTF-8 text holds), is refused the same way.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.core.messages import printable

Format = Literal["auto", "jsonl", "parquet", "text"]
_READ_CHUNK = 1 << 20
#: the longest line or record a benchmark file may hold (`decontaminate.max_record_bytes`):
#: long-context benchmarks' passages run to a few hundred KB
MAX_RECORD_BYTES = 1 << 20
#: Parquet rows read at once: a batch holds at most this many values of up to max_record_bytes
_PARQUET_ROWS = 64


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


def _lines(path: str, limit: int) -> Iterator[tuple[str, bytes]]:
    """(`file:line`, the line's bytes) of a file, each line read at most `limit` bytes at a time:
    a longer one is refused before anything more of it is read."""
    with _open_lines(path) as f:
        lineno = 0
        while True:
            raw = f.readline(limit + 1)
            if not raw:
                return
            lineno += 1
            where = f"{printable(path)}:{lineno}"
            if len(raw) > limit and not (len(raw) == limit + 1 and raw.endswith(b"\n")):
                raise BenchmarkError(
                    f"{where}: a line of over {limit:,} bytes (decontaminate.max_record_bytes): "
                    "no benchmark text is that long; raise the setting if this one is"
                )
            yield where, raw


def _no_surrogates(text: str, where: str, field_name: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BenchmarkError(
                f"{where}: field {field_name!r} holds a lone surrogate (U+{ord(text[e.start]):04X}, a JSON "
                f"escape such as \\ud800) at character {e.start}: no text holds one"
            ) from None


def _jsonl_texts(path: str, field_name: str, limit: int) -> Iterator[tuple[str, str]]:
    for where, raw in _lines(path, limit):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except UnicodeDecodeError as e:
            raise BenchmarkError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
        except ValueError as e:
            raise BenchmarkError(f"{where}: not JSON ({e})") from None
        except RecursionError:
            raise BenchmarkError(f"{where}: JSON nested too deep to read (arrays or objects in each other)") from None
        if not isinstance(record, dict):
            raise BenchmarkError(f"{where}: a JSON {type(record).__name__}, expected an object with {field_name!r}")
        if field_name not in record:
            keys = ", ".join(map(repr, list(record)[:8]))
            raise BenchmarkError(f"{where}: no field {field_name!r} (its fields: {keys or 'none'})")
        for text in _texts_of_value(record[field_name], where, field_name):
            _no_surrogates(text, where, field_name)
            yield where, text


def _text_texts(path: str, limit: int) -> Iterator[tuple[str, str]]:
    for where, raw in _lines(path, limit):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BenchmarkError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
        if text.strip():
            yield where, text


def _parquet_texts(path: str, field_name: str, limit: int) -> Iterator[tuple[str, str]]:
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
    for batch in pf.iter_batches(columns=[field_name], batch_size=_PARQUET_ROWS):
        column = batch.column(0)
        sizes = _value_bytes(column)
        if sizes is not None and len(sizes) and int(sizes.max()) > limit:
            at = row + int(sizes.argmax())
            raise BenchmarkError(
                f"{printable(path)}: row {at}: field {field_name!r} of {int(sizes.max()):,} bytes, over {limit:,} "
                "(decontaminate.max_record_bytes): no benchmark text is that long; raise the setting if this one is"
            )
        for value in column.to_pylist():
            where = f"{printable(path)}: row {row}"
            row += 1
            for text in _texts_of_value(value, where, field_name):
                yield where, text


def _value_bytes(column: pa.Array):
    """Bytes of each row's text (a list's texts summed) as a numpy array, or None for a column
    of another type (refused row by row, as `_texts_of_value` says)."""
    import pyarrow.compute as pc

    t = column.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = column.flatten()
        if not (pa.types.is_string(inner.type) or pa.types.is_large_string(inner.type)):
            return None
        lengths = pc.fill_null(pc.binary_length(inner), 0).to_numpy(zero_copy_only=False)
        offsets = column.offsets.to_numpy(zero_copy_only=False) - column.offsets[0].as_py()
        sums = np.concatenate([[0], np.cumsum(lengths)])
        return sums[offsets[1:]] - sums[offsets[:-1]]
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False)
    return None


def read_texts(
    path: str, fmt: str, field_name: str | None, max_record_bytes: int = MAX_RECORD_BYTES
) -> Iterator[tuple[str, str]]:
    """(where, text) of every text of a benchmark file: `file:line` (JSONL, text) or
    `file: row N` (Parquet). JSONL and Parquet: the field `field_name` of each record, a string
    or a list of strings; text: each non-blank line. A line or value over `max_record_bytes`
    is refused before it is held as text. Raises BenchmarkError at the first problem."""
    try:
        if fmt == "jsonl":
            yield from _jsonl_texts(path, field_name, max_record_bytes)
        elif fmt == "parquet":
            yield from _parquet_texts(path, field_name, max_record_bytes)
        else:
            yield from _text_texts(path, max_record_bytes)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise BenchmarkError(f"{printable(path)}: damaged gzip ({e or 'truncated'})") from None
    except pa.ArrowException as e:  # a damaged page of a Parquet file that opened
        raise BenchmarkError(f"{printable(path)}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    except OSError as e:
        raise BenchmarkError(f"{printable(path)}: {e.strerror or e}") from None
