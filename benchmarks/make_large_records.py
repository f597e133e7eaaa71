"""A WET file of large records, each just under a size limit, for the memory tests of huge pages.

    python benchmarks/make_large_records.py OUT.warc.wet.gz --records 12 --mb 30 [--mutate 0.2] [--seed 0] [--smoke]

Each conversion record's payload is exactly `--mb` MB (10^6 bytes; `--bytes` for an exact
count) of real text: the conversion records of ../shared/data/cc/wet (all 609 pages, every
language, one page with a character beyond U+FFFF, so Python holds each record as 4 bytes per
character: the worst case), concatenated page after page from a seeded start, again and again,
cut at a character boundary. `--mutate P` swaps each space-separated word of every repetition
for a random word of the sample with probability P, so the text is not one page repeated (a
repeated page is what the Gopher rules and dedup remove first; mutated text reaches every step
when the filters are opened). Laid out as Common Crawl writes WET: a `warcinfo` record, then
`conversion` records with their WARC headers, each record its own gzip member (isal level 1).
`--smoke`: 3 records of 0.2 MB.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time
from pathlib import Path

from isal import isal_zlib

from gristmill.core.wet_reader import WetRecord, iter_wet_records

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
CRAWL = "CC-MAIN-2024-22"


def sample_pages(data: Path = DATA) -> list[str]:
    """The text of every conversion record of the shared WET sample, in file order."""
    pages = []
    for f in sorted((data / "cc" / "wet").glob("*.warc.wet.gz")):
        pages += [e.text for e in iter_wet_records(f) if isinstance(e, WetRecord)]
    if not pages:
        raise SystemExit(f"no WET pages under {data / 'cc' / 'wet'} (set GRISTMILL_DATA)")
    return pages


def record_text(pages: list[str], size: int, rng: random.Random, mutate: float, vocab: list[str]) -> bytes:
    """`size` bytes of UTF-8: the pages from a random one on, over and over, cut at a character."""
    out: list[bytes] = []
    total, i = 0, rng.randrange(len(pages))
    while total < size:
        text = pages[i % len(pages)]
        if mutate > 0:
            words = text.split(" ")
            for j in range(len(words)):
                if rng.random() < mutate and "\n" not in words[j]:
                    words[j] = rng.choice(vocab)
            text = " ".join(words)
        piece = (text + "\n\n").encode("utf-8")
        out.append(piece)
        total += len(piece)
        i += 1
    payload = b"".join(out)[:size]
    return payload.decode("utf-8", errors="ignore").encode("utf-8")  # a cut character goes


def _member(head: str, payload: bytes) -> bytes:
    return isal_zlib.compress(head.encode() + payload + b"\r\n\r\n", 1, 31)


def write(
    path: Path, records: int, size: int, *, mutate: float = 0.0, seed: int = 0, pages: list[str] | None = None
) -> list[int]:
    """Write the file; returns each record's payload bytes (each <= `size`)."""
    pages = pages if pages is not None else sample_pages()
    rng = random.Random(seed)
    vocab = sorted({w for p in pages for w in p.split() if w.isalpha()})
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1716000000 + seed))
    info = f"isPartOf: {CRAWL}\r\npublisher: Common Crawl\r\ndescription: large records (make_large_records)\r\n\r\n"
    sizes = []
    with open(path, "wb") as f:
        f.write(
            _member(
                f"WARC/1.0\r\nWARC-Type: warcinfo\r\nWARC-Date: {date}\r\nWARC-Record-ID: <urn:uuid:{_uuid(rng)}>\r\n"
                f"Content-Type: application/warc-fields\r\nContent-Length: {len(info)}\r\n\r\n",
                info.encode(),
            )
        )
        for n in range(records):
            payload = record_text(pages, size, rng, mutate, vocab)
            digest = hashlib.sha1(payload).hexdigest()
            head = (
                "WARC/1.0\r\nWARC-Type: conversion\r\n"
                f"WARC-Target-URI: http://large-{seed}-{n}.example.com/page\r\n"
                f"WARC-Date: {date}\r\nWARC-Record-ID: <urn:uuid:{_uuid(rng)}>\r\n"
                f"WARC-Refers-To: <urn:uuid:{_uuid(rng)}>\r\nWARC-Block-Digest: sha1:{digest}\r\n"
                f"Content-Type: text/plain\r\nContent-Length: {len(payload)}\r\n\r\n"
            )
            f.write(_member(head, payload))
            sizes.append(len(payload))
    return sizes


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--records", type=int, default=12)
    ap.add_argument("--mb", type=float, default=30.0, help="payload of each record, 10^6 bytes")
    ap.add_argument("--bytes", type=int, default=None, help="payload of each record, exact bytes (over --mb)")
    ap.add_argument("--mutate", type=float, default=0.0, help="share of words swapped per repetition")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="3 records of 0.2 MB")
    a = ap.parse_args()
    if a.smoke:
        a.records, a.mb, a.bytes = 3, 0.2, None
    size = a.bytes if a.bytes is not None else int(a.mb * 1e6)
    t = time.time()
    sizes = write(a.out, a.records, size, mutate=a.mutate, seed=a.seed)
    print(
        f"{a.out}: {len(sizes)} records of {min(sizes):,}-{max(sizes):,} bytes, "
        f"{a.out.stat().st_size / 1e6:.1f} MB compressed, {time.time() - t:.1f} s"
    )


if __name__ == "__main__":
    main()
