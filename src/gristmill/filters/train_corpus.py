"""Text for `pipeline kenlm train` and `pipeline quality train`: readers, clean-up, held-out split.

Inputs may be plain text files (one paragraph per non-empty line), WET files
(`*.warc.wet[.gz]`, one document per conversion record), WARC files (`*.warc[.gz]`, one
document per HTML response, its text extracted by the WARC reader's code) or Parquet documents (a file, or a
folder such as a finished run's `01_curate/output`, `text` column).

The split into training and held-out text is a pure function of the normalised text's hash,
so a test (or a later evaluation) can tell which paragraphs a model never saw without any
bookkeeping, and a duplicate can never sit on both sides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from gristmill.filters.ccnet_normalize import normalize

DETOKENIZERS = ("none", "wikitext")
_HEADING = re.compile(r"^\s*=( =)* .* =( =)*\s*$")


def wikitext_detokenize(line: str) -> str:
    """Undo WikiText's tokenisation (`word , word`, `1 @,@ 000`, `<unk>`) so it reads like web text.

    WikiText-2 is distributed tokenised; crawl text is not. A model trained on `word ,` would find
    every `word,` of the crawl unknown, and a classifier would learn the spacing instead of the
    prose. Rules as in Megatron-LM's wikitext detokenizer, plus `<unk>` removed.
    """
    s = line.replace(" <unk>", "").replace("<unk> ", "").replace("<unk>", "")
    s = s.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    for p in (".", ",", ":", ";", "!", "?", "'s", "n't", "'re", "'ve", "'m", "'ll", "'d", ")", "]", "%"):
        s = s.replace(" " + p, p)
    s = s.replace("( ", "(").replace("[ ", "[").replace("$ ", "$")
    s = re.sub(r'" ([^"]*?) "', r'"\1"', s)
    return re.sub(r"\s+", " ", s).strip()


def is_heading(line: str) -> bool:
    return bool(_HEADING.match(line))


def _parquet_files(path: Path) -> list[Path]:
    return sorted(path.rglob("*.parquet")) if path.is_dir() else [path]


@dataclass(frozen=True)
class Page:
    """A document of the inputs and what they say of it: `id` (a WARC record id, a Parquet row's
    `id`, or `<file>:<line>` for a text file's line), `url` and `language` where given."""

    text: str
    id: str
    url: str | None = None
    language: str | None = None


def iter_pages(paths: Iterable[str | Path], detokenize: str = "none") -> Iterator[Page]:
    """Documents of the inputs, in order: a line of a text file, a WET record, an HTML response
    of a WARC file (its text extracted as a run's `input.format: warc` reader does), a Parquet row."""
    if detokenize not in DETOKENIZERS:
        raise ValueError(f"--detokenize: expected one of {DETOKENIZERS}, got {detokenize!r}")
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise FileNotFoundError(f"input not found: {path}")
        name = path.name
        if path.is_dir() or name.endswith(".parquet"):
            import pyarrow.parquet as pq

            files = _parquet_files(path)
            if not files:
                raise FileNotFoundError(f"{path}: no .parquet files (expected a run's output folder)")
            for f in files:
                pf = pq.ParquetFile(f)
                columns = [c for c in ("text", "id", "url", "language") if c in pf.schema_arrow.names]
                if "text" not in columns:
                    raise ValueError(f"{f}: no `text` column (expected a run's output Parquet)")
                row = 0
                for batch in pf.iter_batches(columns=columns, batch_size=1024):
                    cols = {c: batch.column(i).to_pylist() for i, c in enumerate(columns)}
                    none = [None] * batch.num_rows
                    ids, urls, langs = cols.get("id", none), cols.get("url", none), cols.get("language", none)
                    for j, text in enumerate(cols["text"]):
                        if text:
                            yield Page(text, str(ids[j] or f"{f.name}:{row + j}"), urls[j], langs[j])
                    row += batch.num_rows
        elif ".warc.wet" in name or name.endswith((".warc.gz", ".warc")):
            from gristmill.input.wet import WetRecord, iter_wet_records

            if ".warc.wet" in name:
                records = iter_wet_records(path)
            else:  # a WARC: HTML responses, extracted
                from gristmill.input.warc import iter_warc_documents

                records = iter_warc_documents(path)
            for rec in records:
                if isinstance(rec, WetRecord) and rec.text.strip():
                    yield Page(rec.text, rec.record_id, rec.url)
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip() or (detokenize == "wikitext" and is_heading(line)):
                        continue
                    text = wikitext_detokenize(line) if detokenize == "wikitext" else line.strip()
                    yield Page(text, f"{name}:{n}")


def iter_documents(paths: Iterable[str | Path], detokenize: str = "none") -> Iterator[str]:
    """The texts of `iter_pages`."""
    return (page.text for page in iter_pages(paths, detokenize))


def text_hash(text: str) -> int:
    """Hash of the CCNet-normalised text: equal for texts that differ only in case, accents, digits."""
    return xxhash.xxh3_64_intdigest("\n".join(normalize(l) for l in text.split("\n")).encode("utf-8"))


def is_heldout(text: str, fraction: float, seed: int = 0) -> bool:
    """True for the held-out part: a fixed fraction of texts, chosen by hash (and seed)."""
    h = xxhash.xxh3_64_intdigest(text_hash(text).to_bytes(8, "little"), seed=seed)
    return (h % 10_000) < fraction * 10_000
