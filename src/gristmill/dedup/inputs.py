"""What a dedup's first stage read, so that its last stage can tell the input has not changed.

A dedup decides in its first stages and applies the decisions in its last one, which reads the
same Parquet files again. If a file changed in between (rewritten, truncated, a row removed),
decisions would be applied to documents they were not made for. The first stage records per
input file its row count and a hash of its (source, offset) columns, the documents' identity;
the last stage recomputes both and refuses to run on a file that differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from gristmill.core.files import write_text_atomic


def fingerprint(files: list[Path], root: Path) -> dict[str, dict]:
    """{file relative to root: {"rows", "keys"}} for the given Parquet files (local: fetched)."""
    out = {}
    for path in files:
        t = pq.read_table(path, columns=["source", "offset"])
        h = xxhash.xxh3_64()
        src = pc.dictionary_encode(t["source"].combine_chunks())
        h.update("\0".join(str(s) for s in src.dictionary.to_pylist()).encode())
        h.update(src.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype("<i4").tobytes())
        h.update(t["offset"].combine_chunks().fill_null(-1).to_numpy(zero_copy_only=False).astype("<i8").tobytes())
        out[str(Path(path).relative_to(root))] = {"rows": t.num_rows, "keys": h.hexdigest()}
    return out


def save(path: Path, files: list[Path], root: Path) -> None:
    write_text_atomic(path, json.dumps(fingerprint(files, root)))


def check(path: Path, files: list[Path], root: Path, first_stage: str) -> None:
    """Raise ValueError naming the first file that differs from what `first_stage` read (`path`:
    its record, local)."""
    saw = json.loads(path.read_text())
    now = fingerprint(files, root)
    for name in sorted(set(saw) | set(now)):
        file = root / name
        if name not in now:
            raise ValueError(
                f"{file}: {first_stage} read this file and it is gone; "
                f"the input changed between stages: run the dedup again from {first_stage}"
            )
        if name not in saw:
            raise ValueError(
                f"{file}: {first_stage} did not read this file; "
                f"the input changed between stages: run the dedup again from {first_stage}"
            )
        a, b = saw[name], now[name]
        if a["rows"] != b["rows"]:
            raise ValueError(
                f"{file}: {b['rows']} documents, {first_stage} read {a['rows']}; "
                f"the input changed between stages: run the dedup again from {first_stage}"
            )
        if a["keys"] != b["keys"]:
            raise ValueError(
                f"{file}: its documents' (source, offset) differ from what {first_stage} read; "
                f"the input changed between stages: run the dedup again from {first_stage}"
            )
