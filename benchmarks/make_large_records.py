"""A WET file of large records, each just under a size limit, for the memory tests of huge pages;
or a WARC file of large HTML pages (`--warc`).

    python benchmarks/make_large_records.py OUT.warc.wet.gz --records 12 --mb 30 [--mutate 0.2] [--seed 0] [--smoke]
    python benchmarks/make_large_records.py OUT.warc.gz --warc --records 4 --mb 8

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

`--warc`: the same text as HTML pages, laid out as Common Crawl writes WARC files: a `warcinfo`
record, then per page a `request` and a `response` record (HTTP 200, `text/html; charset=utf-8`),
each record its own gzip member. A page is an article: a heading, then the text's lines joined
into paragraphs of at least 400 bytes, one `<p>` each (so a 30 MB page has ~75,000 tags, under
`input.max_html_tags`), with a navigation bar and a footer; the response's payload (HTTP
header and page) is at most `--mb` MB.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import os
import random
import time
from pathlib import Path

from isal import isal_zlib

from gristmill.input.wet import WetRecord, iter_wet_records

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


def _warcinfo(date: str, rng: random.Random, description: str) -> bytes:
    """The file's first member, its warcinfo record, as Common Crawl's files begin."""
    info = f"isPartOf: {CRAWL}\r\npublisher: Common Crawl\r\ndescription: {description} (make_large_records)\r\n\r\n"
    return _member(
        f"WARC/1.0\r\nWARC-Type: warcinfo\r\nWARC-Date: {date}\r\nWARC-Record-ID: <urn:uuid:{_uuid(rng)}>\r\n"
        f"Content-Type: application/warc-fields\r\nContent-Length: {len(info)}\r\n\r\n",
        info.encode(),
    )


def write(
    path: Path, records: int, size: int, *, mutate: float = 0.0, seed: int = 0, pages: list[str] | None = None
) -> list[int]:
    """Write the file; returns each record's payload bytes (each <= `size`)."""
    pages = pages if pages is not None else sample_pages()
    rng = random.Random(seed)
    vocab = sorted({w for p in pages for w in p.split() if w.isalpha()})
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1716000000 + seed))
    sizes = []
    with open(path, "wb") as f:
        f.write(_warcinfo(date, rng, "large records"))
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


#: bytes of a paragraph of an HTML page, at least: the text's lines are joined up to it
PARAGRAPH_BYTES = 400


def html_page(text: str, title: str, size: int) -> bytes:
    """An HTML article of at most `size` bytes (UTF-8) holding `text`'s lines, as many as fit,
    joined into paragraphs of at least `PARAGRAPH_BYTES`."""
    head = (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{title}</title></head><body>'
        '<nav><a href="/">Home</a> <a href="/news">News</a> <a href="/about">About</a></nav>'
        f"<main><article><h1>{title}</h1>\n"
    ).encode()
    tail = b"</article></main><footer><p>Copyright 2024. All rights reserved.</p></footer></body></html>\n"
    budget = size - len(head) - len(tail)
    out, used, para = [], 0, []

    def close() -> bool:
        """Add the paragraph held; False once the page is full (the last one cut to fit)."""
        nonlocal used
        text = html.escape(" ".join(para), quote=False)
        para.clear()
        room = budget - used - len(b"<p></p>\n")
        if len(text.encode()) > room:
            cut = text.encode()[: max(room, 0)].decode("utf-8", "ignore")
            if "&" in cut[-8:] and ";" not in cut[cut.rfind("&") :]:  # no entity cut in two
                cut = cut[: cut.rfind("&")]
            if cut:
                out.append(f"<p>{cut}</p>\n".encode())
            return False
        out.append(f"<p>{text}</p>\n".encode())
        used += len(out[-1])
        return True

    held = 0
    for line in text.splitlines():
        if line.strip():
            para.append(line.strip())
            held += len(line)
            if held >= PARAGRAPH_BYTES:
                held = 0
                if not close():
                    break
    else:
        if para:
            close()
    return head + b"".join(out) + tail


def write_warc(
    path: Path, records: int, size: int, *, mutate: float = 0.0, seed: int = 0, pages: list[str] | None = None
) -> list[int]:
    """Write a WARC file of `records` HTML pages; returns each response's payload bytes (each
    <= `size`: the HTTP header and the page)."""
    pages = pages if pages is not None else sample_pages()
    rng = random.Random(seed)
    vocab = sorted({w for p in pages for w in p.split() if w.isalpha()})
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1716000000 + seed))
    sizes = []
    with open(path, "wb") as f:
        f.write(_warcinfo(date, rng, "large pages"))
        for n in range(records):
            url = f"http://large-{seed}-{n}.example.com/page"
            request = f"GET /page HTTP/1.1\r\nHost: large-{seed}-{n}.example.com\r\n\r\n".encode()
            f.write(
                _member(
                    f"WARC/1.0\r\nWARC-Type: request\r\nWARC-Target-URI: {url}\r\nWARC-Date: {date}\r\n"
                    f"WARC-Record-ID: <urn:uuid:{_uuid(rng)}>\r\nContent-Type: application/http; msgtype=request\r\n"
                    f"Content-Length: {len(request)}\r\n\r\n",
                    request,
                )
            )
            http_head = "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\r\n"
            room = size - len(http_head.format(size).encode())
            page = html_page(record_text(pages, room, rng, mutate, vocab).decode("utf-8"), f"Large page {n}", room)
            payload = http_head.format(len(page)).encode() + page
            head = (
                f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: {url}\r\nWARC-Date: {date}\r\n"
                f"WARC-Record-ID: <urn:uuid:{_uuid(rng)}>\r\nContent-Type: application/http; msgtype=response\r\n"
                f"WARC-Identified-Payload-Type: text/html\r\nContent-Length: {len(payload)}\r\n\r\n"
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
    ap.add_argument("--warc", action="store_true", help="a WARC file of HTML pages, not a WET file")
    ap.add_argument("--smoke", action="store_true", help="3 records of 0.2 MB")
    a = ap.parse_args()
    if a.smoke:
        a.records, a.mb, a.bytes = 3, 0.2, None
    size = a.bytes if a.bytes is not None else int(a.mb * 1e6)
    t = time.time()
    sizes = (write_warc if a.warc else write)(a.out, a.records, size, mutate=a.mutate, seed=a.seed)
    print(
        f"{a.out}: {len(sizes)} records of {min(sizes):,}-{max(sizes):,} bytes, "
        f"{a.out.stat().st_size / 1e6:.1f} MB compressed, {time.time() - t:.1f} s"
    )


if __name__ == "__main__":
    main()
