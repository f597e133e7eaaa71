"""Common Crawl-like WET corpora of any size, with planted duplicates, for scale benchmarks.

    python benchmarks/make_wet_corpus.py --gb 4 --seed 1 OUT/ [--file-mb 150]
        [--exact-rate 0.03] [--near-rate 0.05] [--near-band 0.85 0.95] [--mutate 0.1] [--smoke]

Source: the 609 real conversion records of ../shared/data/cc/wet (read with gristmill's WET
reader), grouped by language with fastText lid.176 (on the text with newlines as spaces). Each
language keeps its lines (paragraphs; lines over MAX_LINE characters cut at spaces) as a pool,
and VARIANTS copies of that pool in which a share `--mutate` of the words is changed (swapped for
a word of the pool, or two letters transposed; in unspaced scripts, characters transposed at the
same rate), woven line by line into WOVEN texts (each line from a random variant). A generated
page draws a real sample page (so languages follow the sample's mix) and takes blocks of
1..MAX_BLOCK consecutive pool lines of its language, each block one slice of a random woven text,
until its length is nearest the sample page's (so each language's page length distribution is
the sample's). Pages are never copies of the sample, and two pages that drew the
same lines share a fraction of their shingles only: in the tests no two unplanted pages reach
Jaccard 0.6 (near dedup's default threshold is 0.8). Languages with fewer than MIN_LINES distinct
lines in the sample (lt, nl, no, sk, et: 5 of 609 pages) are left out: all their pages would be
the same line or two. No two pages have the same text unless planted.

Planted duplicates, one per chosen original, land 1..2x(records per file) records later (at most
a quarter of the corpus later), so about half of them in a later file: exact copies (same text,
new URL, record id and date) at `--exact-rate` of all records and near copies at `--near-rate`,
edited (letters substituted, words deleted or inserted) until the Jaccard of their 5-gram
word-shingle sets (`gristmill.dedup.text.shingles`, the definition near dedup uses) is within
`--near-band`. A page too short to reach the band passes its near copy on to the next original.
OUT/truth.jsonl lists every pair: kind, original and copy record ids and files, measured Jaccard.

Output: OUT/CC-MAIN-<segment>-<nnnnn>.warc.wet.gz files of ~--file-mb MB compressed, each a
warcinfo record (isPartOf: CC-MAIN-<yyyy>-<ww>) then conversion records laid out as Common
Crawl writes them (WARC-Target-URI, WARC-Date, WARC-Record-ID, WARC-Refers-To,
WARC-Block-Digest = base32 sha1 of the payload, WARC-Identified-Content-Language, Content-Type,
exact Content-Length), each record its own gzip member (isal). Everything is drawn from one
seeded generator, so the same --gb/--seed/--file-mb gives byte-identical files.

`--smoke`: 2 MB in files of 0.5 MB, unless --gb/--file-mb say otherwise (seconds; checks that
the generator still runs).
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import random
import sys
import time
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
from isal import isal_zlib

from gristmill.dedup.text import jaccard, shingle_hashes, words
from gristmill.filters.fasttext_native import load_classifier
from gristmill.filters.langid import LABEL_PREFIX
from gristmill.input.wet import WetRecord, iter_wet_records

REPO = Path(__file__).resolve().parents[1]
# as in make_dedup_corpus.py (not imported from there: it imports the WET reader from one place only)
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
LID_MODEL = REPO / "models" / "lid.176.ftz"
MIN_LINES = 20
VARIANTS = 8  # mutated copies of each language's lines
WOVEN = 16  # texts made of those line by line; a page is slices of them
MAX_BLOCK = 16  # a page is blocks of 1..MAX_BLOCK consecutive pool lines (paragraphs)
MAX_LINE = 300  # characters of a pool line; longer lines are cut (at spaces) into lines
SHINGLE = 5  # words per shingle, as near dedup's default
SENTINEL = "gristmillsentinel7q3x"  # a word no sample text has, to split one words() call by line
MAX_SWAP_CHARS = 30  # pool words longer than this (unspaced CJK/Thai runs) are not swapped in
LEVEL = 1  # isal: on ~6 KB members 200 MB/s in, ratio 1.95; 2 is as fast and 1% smaller, 3 is 1.5x slower
ISO3 = {
    "en": "eng",
    "es": "spa",
    "ja": "jpn",
    "zh": "zho",
    "ar": "ara",
    "ru": "rus",
    "fr": "fra",
    "id": "ind",
    "it": "ita",
    "fa": "fas",
    "vi": "vie",
    "de": "deu",
    "pt": "por",
    "tr": "tur",
    "af": "afr",
    "nl": "nld",
    "th": "tha",
    "lt": "lit",
    "et": "est",
    "no": "nor",
    "sk": "slk",
}
SUBDOMAINS = ("www", "m", "blog", "news", "shop", "forum", "en", "de", "fr", "es", "my", "web")
SUFFIXES = ("", ".html", ".php", "/", ".htm", ".aspx")


@dataclass
class Pool:
    """One language's share of the sample."""

    lang: str
    lines: list[str]
    line_off: list[int]  # byte offset of each line in the pool's text (lines + newlines), and its end
    vocab: list[str]  # distinct pool words short enough to swap in
    chars: str  # letters and digits of the pool, for substitutions


@dataclass
class Sample:
    pools: dict[str, Pool]
    pages: list[tuple[str, int]]  # (language, payload bytes) of every kept sample page
    hosts: list[str]
    dirs: list[str]
    stems: list[str]
    dropped: dict[str, int] = field(default_factory=dict)  # language -> sample pages left out


def load_sample(data: Path = DATA, lid_model: Path = LID_MODEL) -> Sample:
    recs = [
        r
        for f in sorted((data / "cc" / "wet").glob("*.warc.wet.gz"))
        for r in iter_wet_records(f)
        if isinstance(r, WetRecord)
    ]
    if not recs:
        raise SystemExit(f"no WET conversion records under {data / 'cc' / 'wet'}")
    labels, _ = load_classifier(lid_model).predict_top([r.text for r in recs])
    langs = [l[len(LABEL_PREFIX) :] if l else "unknown" for l in labels]
    by_lang: dict[str, list[str]] = {}
    for rec, lang in zip(recs, langs):
        pool = by_lang.setdefault(lang, [])
        for line in rec.text.split("\n"):
            pool.extend(_pieces(line.strip()))
    pools, dropped = {}, {}
    for lang in sorted(by_lang):
        lines = by_lang[lang]
        if len(set(lines)) < MIN_LINES:
            dropped[lang] = langs.count(lang)
            continue
        text = "\n".join(lines)
        pools[lang] = Pool(
            lang=lang,
            lines=lines,
            line_off=_offsets(lines).tolist(),
            vocab=sorted({w for w in text.replace("\n", " ").split(" ") if w and len(w) <= MAX_SWAP_CHARS}),
            chars="".join(sorted(c for c in set(text) if c.isalnum())) or "x",
        )
    pages = [(lang, len(rec.text.encode())) for rec, lang in zip(recs, langs) if lang in pools]
    urls = [urlsplit(rec.url or "") for rec in recs]
    hosts = sorted({u.hostname for u in urls if u.hostname})
    dirs, stems = set(), set()
    for u in urls:
        d, _, leaf = (u.path or "/").rpartition("/")
        dirs.add(d + "/")
        stem = leaf.split(".")[0]
        if stem.isascii() and stem.replace("-", "").replace("_", "").isalnum() and len(stem) <= 40:
            stems.add(stem)
    return Sample(
        pools, pages, hosts, sorted(d for d in dirs if d.isascii() and len(d) <= 60), sorted(stems) or ["page"], dropped
    )


def _pieces(line: str) -> list[str]:
    """A line cut (at spaces where it has them) into pieces of at most MAX_LINE characters.

    A page made mostly of one long line would otherwise be a near duplicate of every other page
    that drew the same line from the same woven text (1 in WOVEN).
    """
    out = []
    while len(line) > MAX_LINE:
        cut = line.rfind(" ", MAX_LINE // 2, MAX_LINE)
        cut = cut if cut > 0 else MAX_LINE
        out.append(line[:cut].strip())
        line = line[cut:].strip()
    out.append(line)
    return [l for l in out if l]


def _offsets(lines: list[str]) -> np.ndarray:
    off = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum([len(l.encode()) + 1 for l in lines], out=off[1:])
    return off


def _transpose(w: str, i: int) -> str:
    i %= len(w) - 1
    if w[i] == w[i + 1]:
        return w[:i] + w[i + 1 :] + w[i]  # move a letter instead: this transposition is a no-op
    return w[:i] + w[i + 1] + w[i] + w[i + 2 :]


def _long_tokens(lines: list[str]) -> list[int]:
    toks = "\n".join(lines).replace("\n", " \n ").split(" ")
    return [j for j, t in enumerate(toks) if len(t) > MAX_SWAP_CHARS]


def mutate_lines(
    lines: list[str], vocab: list[str], rate: float, rng: np.random.Generator, long_at: list[int] | None = None
) -> list[str]:
    """`lines` with a share `rate` of their words swapped for a pool word or two letters transposed.

    One pass over the joined text (newlines kept as their own tokens): Python touches only the
    chosen words, so this runs at C speed on the rest.
    """
    toks = "\n".join(lines).replace("\n", " \n ").split(" ")
    n = len(toks)
    m = int(rng.binomial(n, rate))
    pos = rng.integers(n, size=m).tolist()
    pick = rng.integers(len(vocab), size=m).tolist()
    swap = (rng.random(m) < 0.5).tolist()
    for j, v, s in zip(pos, pick, swap):
        t = toks[j]
        if t == "\n" or not t:
            continue
        if s and len(t) <= MAX_SWAP_CHARS or len(t) < 2:
            toks[j] = vocab[v]
        else:
            toks[j] = _transpose(t, v)
    # unspaced scripts (Chinese, Japanese, Thai) are runs of many words to `words`: mutate their
    # characters at the same rate, or two variants of a line would differ in a few shingles only
    if long_at is None:  # the same for every variant of the lines: swaps and transpositions keep lengths
        long_at = _long_tokens(lines)
    for j in long_at:
        cs = list(toks[j])
        for i in rng.integers(len(cs) - 1, size=int(len(cs) * rate / 2 + rng.random())).tolist():
            cs[i], cs[i + 1] = cs[i + 1], cs[i]
        toks[j] = "".join(cs)
    out = " ".join(toks).replace(" \n ", "\n").split("\n")
    assert len(out) == len(lines)
    return out


def word_shingles(word_lists: list[list[str]]) -> np.ndarray:
    """`shingles` of the lines whose `words` these are, joined by newlines.

    `words` never joins words across whitespace, so the words of a text are those of its lines
    back to back: a near copy re-reads only the lines it edited.
    """
    w = list(chain.from_iterable(word_lists))
    if not w:
        return np.empty(0, dtype=np.uint64)
    return np.unique(shingle_hashes([w], SHINGLE)[0])


def line_words(lines: list[str]) -> list[list[str]]:
    """[words(l) for l in lines] in one call to `words`: 125 calls a page cost 10x more."""
    w = words(("\n" + SENTINEL + "\n").join(lines))
    out, start = [], 0
    for _ in range(len(lines) - 1):
        end = w.index(SENTINEL, start)
        out.append(w[start:end])
        start = end + 1
    out.append(w[start:])
    return out


class PageMaker:
    """Draws pages, near copies, URLs and record fields from one seeded generator."""

    def __init__(self, sample: Sample, seed: int, mutate: float):
        self.s = sample
        self.seed = seed
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.r = random.Random(seed)
        self.mutate = mutate
        self.page_lang = [l for l, _ in sample.pages]
        self.page_len = [n for _, n in sample.pages]
        self.lang_no = {l: i for i, l in enumerate(sorted(sample.pools))}
        self.tlds = sorted({h.rsplit(".", 1)[-1] for h in sample.hosts if "." in h}) or ["com"]
        self._uuids: list[str] = []
        self._made: dict[str, tuple[list[bytes], list[array]]] = {}

    def _variants(self, pool: Pool) -> tuple[list[bytes], list[array]]:
        """WOVEN texts (UTF-8) of the pool and their line offsets: each line of a woven text is
        that line of a random one of VARIANTS mutated copies of the pool."""
        v = self._made.get(pool.lang)
        if v is None:
            # made when the language is first drawn, from its own generator: the text does not
            # depend on when that happens
            rng = np.random.Generator(np.random.PCG64([self.seed, self.lang_no[pool.lang]]))
            long_at = _long_tokens(pool.lines)
            variants = [mutate_lines(pool.lines, pool.vocab, self.mutate, rng, long_at) for _ in range(VARIANTS)]
            texts, offs = [], []
            for _ in range(WOVEN):
                lines = [variants[k][x] for x, k in enumerate(rng.integers(VARIANTS, size=len(pool.lines)).tolist())]
                texts.append(("\n".join(lines) + "\n").encode())
                offs.append(array("q", _offsets(lines).tolist()))
            v = self._made[pool.lang] = (texts, offs)
        return v

    def page(self) -> tuple[str, bytes]:
        """(language, UTF-8 text) of a new page: blocks of 1..MAX_BLOCK consecutive pool lines
        until its length is nearest that of a random sample page.

        Plain Python: numpy's per-call cost on arrays this small was twice the whole loop.
        """
        r = self.r.random
        i = int(r() * len(self.page_lang))
        lang, target = self.page_lang[i], self.page_len[i]
        pool = self.s.pools[lang]
        texts, offs = self._variants(pool)
        lo = pool.line_off
        n = len(lo) - 1
        parts, total = [], 0
        while True:
            s = int(r() * n)
            e = min(n, s + 1 + int(r() * MAX_BLOCK))
            last = total + lo[e] - lo[s] >= target
            if last:
                # the block crosses the target: keep as many of its lines as bring the page nearest it
                need = target - total + lo[s]
                j = bisect_left(lo, need, s + 1, e + 1)
                if (j - 1 > s or total) and need - lo[j - 1] < lo[j] - need:
                    j -= 1
                e = j
            # one slice of a random woven text: two pages that drew the same block share a
            # fraction of its shingles, unless they drew the same woven text (1 in WOVEN)
            k = int(r() * WOVEN)
            parts.append(texts[k][offs[k][s] : offs[k][e]])
            total += lo[e] - lo[s]
            if last:
                return lang, b"".join(parts)

    def near_copy(self, lines: list[str], lang: str, band: tuple[float, float]) -> tuple[list[str], float] | None:
        """A copy of the page whose shingle Jaccard to it is within `band`, or None if none is found."""
        lo, hi = band
        # one edit changes ~SHINGLE shingles: a page needs this many to have a copy inside the band
        fewest = 1.3 * SHINGLE * (1 + lo) / (1 - lo)
        if sum(map(len, lines)) < fewest:  # too few characters for that many words
            return None
        wl = line_words(lines)
        base = word_shingles(wl)
        if len(base) < fewest:
            return None
        target = self.r.uniform(lo, hi)
        # each edit changes ~5 shingles: J = (S - 5m) / (S + 5m)
        guess = max(1, round(len(base) * (1 - target) / (SHINGLE * (1 + target))))
        cum = np.cumsum([len(w) for w in wl])
        pool = self.s.pools[lang]
        # a fixed list of edits, at word positions drawn uniformly: the first m make the m-edit candidate
        size, rng = 3 * guess + 8, self.rng
        at = np.searchsorted(cum, rng.integers(int(cum[-1]), size=size), side="right").tolist()
        kinds, us, cs = rng.random((3, size)).tolist()
        chs = [pool.chars[c] for c in rng.integers(len(pool.chars), size=size).tolist()]
        new_words = [pool.vocab[v] for v in rng.integers(len(pool.vocab), size=size).tolist()]
        ops = list(zip(at, kinds, us, cs, chs, new_words))

        def build(m: int) -> tuple[list[str], float]:
            toks: dict[int, list[str]] = {}
            for i, kind, u, c, ch, word in ops[:m]:
                t = toks.setdefault(i, lines[i].split(" "))
                j = int(u * len(t))
                w = t[j]
                if kind < 0.15 and 0 < len(w) <= 15 and len(t) > 1:
                    del t[j]
                elif kind < 0.3:
                    t.insert(j, word)
                elif w:
                    k = int(c * len(w))
                    t[j] = w[:k] + ch + w[k + 1 :]
            new, nwl = list(lines), list(wl)
            for i, t in toks.items():
                new[i] = " ".join(t)
                nwl[i] = words(new[i])
            return new, jaccard(base, word_shingles(nwl))

        lo_m, hi_m, m = 1, len(ops), guess
        for _ in range(10):  # J falls as m grows (each candidate adds edits to the last): bisect m
            cand, j = build(m)
            if lo <= j <= hi and cand != lines:
                return cand, j
            lo_m, hi_m = (m + 1, hi_m) if j > hi else (lo_m, m - 1)
            if lo_m > hi_m:
                break
            m = (lo_m + hi_m) // 2
        return None

    def uuid(self) -> str:
        if not self._uuids:
            h = self.rng.bytes(16 * 4096).hex()
            self._uuids = [
                f"<urn:uuid:{h[i : i + 8]}-{h[i + 8 : i + 12]}-4{h[i + 13 : i + 16]}-"
                f"{'89ab'[int(h[i + 16], 16) & 3]}{h[i + 17 : i + 20]}-{h[i + 20 : i + 32]}>"
                for i in range(0, len(h), 32)
            ][::-1]
        return self._uuids.pop()

    def url(self, serial: int) -> str:
        r, s = self.r.random, self.s
        labels = s.hosts[int(r() * len(s.hosts))].split(".") if s.hosts else ["example", "com"]
        v = r()
        if v < 0.3 and len(labels) >= 2:
            labels = [SUBDOMAINS[int(r() * len(SUBDOMAINS))]] + labels[-2:]
        elif v < 0.55 and len(labels) >= 2:
            labels[-2] += str(2 + int(r() * 98))
        elif v < 0.7:
            labels[-1] = self.tlds[int(r() * len(self.tlds))]
        d = s.dirs[int(r() * len(s.dirs))] if s.dirs else "/"
        stem = s.stems[int(r() * len(s.stems))]
        scheme = "https" if r() < 0.5 else "http"
        # the serial makes every URL of a corpus distinct
        return f"{scheme}://{'.'.join(labels)}{d}{stem}-{serial:x}{SUFFIXES[int(r() * len(SUFFIXES))]}"


_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_B32_PAIRS = [a + b for a in _B32 for b in _B32]  # 10 bits -> 2 characters


def b32(digest: bytes) -> str:
    """base64.b32encode of a sha1 digest (160 bits: no padding); the stdlib's is 10x slower."""
    n = int.from_bytes(digest, "big")
    return "".join([_B32_PAIRS[(n >> s) & 1023] for s in range(150, -1, -10)])


class WetWriter:
    """Writes records to numbered WET files, starting a new file past `file_bytes`."""

    def __init__(self, out: Path, seed: int, file_bytes: int):
        self.out, self.file_bytes = out, file_bytes
        week = 5 + seed % 45
        self.crawl = f"CC-MAIN-2024-{week:02d}"
        self.t0 = 1704067200 + (week * 7 - 7) * 86400  # Monday of that ISO-ish week, 2024
        segment_start = self.t0 + (seed * 7919) % (14 * 86400)
        seg = time.strftime("%Y%m%d%H%M%S", time.gmtime(segment_start))
        seg_end = time.strftime("%Y%m%d%H%M%S", time.gmtime(segment_start + 3 * 3600))
        self.prefix = f"CC-MAIN-{seg}-{seg_end}"
        self.f = None
        self.n_files = self.size = self.total = self.records = 0
        self.name = ""

    def _open(self, maker: PageMaker) -> None:
        self.name = f"{self.prefix}-{self.n_files:05d}.warc.wet.gz"
        self.f = open(self.out / self.name, "wb")
        self.n_files += 1
        self.size = 0
        date = time.gmtime(self.t0 + 14 * 86400)
        body = (
            "Software-Info: ia-web-commons.1.1.10-SNAPSHOT-20240210024505\r\n"
            f"Extracted-Date: {time.strftime('%a, %d %b %Y %H:%M:%S GMT', date)}\r\n"
            "robots: checked via crawler-commons 1.5-SNAPSHOT (https://github.com/crawler-commons/crawler-commons)\r\n"
            f"isPartOf: {self.crawl}\r\n"
            "operator: Common Crawl Admin (info@commoncrawl.org)\r\n"
            "description: Wide crawl of the web (generated by gristmill's make_wet_corpus)\r\n"
            "publisher: Common Crawl\r\n\r\n"
        ).encode()
        head = (
            "WARC/1.0\r\nWARC-Type: warcinfo\r\n"
            f"WARC-Date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', date)}\r\n"
            f"WARC-Filename: {self.name}\r\n"
            f"WARC-Record-ID: {maker.uuid()}\r\n"
            "Content-Type: application/warc-fields\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self._write(head + body + b"\r\n\r\n")

    def _write(self, record: bytes) -> None:
        z = isal_zlib.compress(record, LEVEL, 31)
        self.f.write(z)
        self.size += len(z)
        self.total += len(z)

    def write(
        self, maker: PageMaker, payload: bytes, lang: str, serial: int, sha1: bytes | None = None
    ) -> tuple[str, str]:
        """Write one conversion record; return (record id, file name)."""
        if self.f is None:
            self._open(maker)
        rid = maker.uuid()
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0 + int(maker.rng.integers(14 * 86400))))
        digest = b32(sha1 or hashlib.sha1(payload).digest())
        lang3 = ISO3.get(lang)
        head = (
            "WARC/1.0\r\nWARC-Type: conversion\r\n"
            f"WARC-Target-URI: {maker.url(serial)}\r\n"
            f"WARC-Date: {when}\r\n"
            f"WARC-Record-ID: {rid}\r\n"
            f"WARC-Refers-To: {maker.uuid()}\r\n"
            f"WARC-Block-Digest: sha1:{digest}\r\n"
            + (f"WARC-Identified-Content-Language: {lang3}\r\n" if lang3 else "")
            + f"Content-Type: text/plain\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        self._write(head + payload + b"\r\n\r\n")
        self.records += 1
        name = self.name
        if self.size >= self.file_bytes:
            self.close()
        return rid, name

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None


def build(
    out: Path,
    gb: float,
    seed: int = 0,
    file_mb: float = 150,
    exact_rate: float = 0.03,
    near_rate: float = 0.05,
    near_band: tuple[float, float] = (0.85, 0.95),
    mutate: float = 0.1,
    data: Path = DATA,
    lid_model: Path = LID_MODEL,
    progress: bool = True,
    sample: Sample | None = None,
) -> dict:
    if not 0 <= exact_rate + near_rate < 1:
        raise SystemExit(f"--exact-rate + --near-rate must be in [0, 1), got {exact_rate + near_rate}")
    if not 0 < near_band[0] <= near_band[1] < 1:
        raise SystemExit(f"--near-band must be 0 < LO <= HI < 1, got {near_band}")
    if not 0 <= mutate < 1:
        raise SystemExit(f"--mutate must be in [0, 1), got {mutate}")
    if out.is_dir() and any(out.iterdir()):
        # files of an earlier, larger run would be left beside a truth file that does not list them
        raise SystemExit(f"{out}: not empty; give a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    sample = sample or load_sample(data, lid_model)
    maker = PageMaker(sample, seed, mutate)
    writer = WetWriter(out, seed, int(file_mb * 1e6))
    target = int(gb * 1e9)
    # a copy is due 1 .. 2x(records per file) records later (~2.5 KB a record): about half land in
    # a later file; at most a quarter of the corpus later, so that few are left for its end
    spread = max(2, int(min(2 * file_mb * 1e6, target / 4) / 2500))
    p_orig = 1 - exact_rate - near_rate
    p_exact, p_near = exact_rate / p_orig, near_rate / p_orig  # per original, so shares are of all records
    pending: list = []  # heap of (due serial, seq, kind, payload, lang, original id, original file, jaccard)
    seen: set[bytes] = set()
    truth = []
    serial = seq = originals = owed_near = 0
    text_bytes = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=target, unit="B", unit_scale=True, desc="wet corpus", file=sys.stderr)
    t0, cpu0 = time.perf_counter(), time.process_time()
    last = 0

    def emit(payload: bytes, lang: str, sha1: bytes | None = None) -> tuple[str, str]:
        nonlocal serial, text_bytes
        rid, name = writer.write(maker, payload, lang, serial, sha1)
        serial += 1
        text_bytes += len(payload)
        return rid, name

    def emit_due(upto: int) -> None:
        while pending and pending[0][0] <= upto:
            _, _, kind, payload, lang, oid, ofile, j = heapq.heappop(pending)
            cid, cfile = emit(payload, lang)
            truth.append(
                {"kind": kind, "original": oid, "copy": cid, "jaccard": j, "original_file": ofile, "copy_file": cfile}
            )

    while writer.total < target:
        emit_due(serial)
        lang, payload = maker.page()
        key = hashlib.sha1(payload).digest()
        if key in seen:  # a short page drawn twice: only planted copies may repeat a text
            continue
        seen.add(key)
        oid, ofile = emit(payload, lang, key)
        originals += 1
        u = maker.r.random()
        item = None
        if u < p_exact:
            item = ("exact", payload, 1.0)
        else:
            owed_near += p_exact <= u < p_exact + p_near
            # a page too short to reach the band leaves its near copy to the next original
            if owed_near and (near := maker.near_copy(payload.decode().split("\n")[:-1], lang, near_band)) is not None:
                owed_near -= 1
                item = ("near", ("\n".join(near[0]) + "\n").encode(), near[1])
        if item is not None:
            due = serial + maker.r.randrange(1, spread)
            heapq.heappush(pending, (due, seq, item[0], item[1], lang, oid, ofile, item[2]))
            seq += 1
        if bar is not None and serial - last >= 256:
            bar.update(writer.total - bar.n)
            last = serial
    emit_due(float("inf"))  # the corpus is full: the copies still owed go at its end
    writer.close()
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if bar is not None:
        bar.update(writer.total - bar.n)
        bar.close()
    with open(out / "truth.jsonl", "w") as f:
        for row in truth:
            f.write(json.dumps(row) + "\n")
    cross = sum(r["original_file"] != r["copy_file"] for r in truth)
    return {
        "files": writer.n_files,
        "records": writer.records,
        "originals": originals,
        "exact": sum(r["kind"] == "exact" for r in truth),
        "near": sum(r["kind"] == "near" for r in truth),
        "cross_file": cross,
        "bytes": writer.total,
        "text_bytes": text_bytes,
        "seconds": dt,
        "cpu_seconds": cpu,
        "dropped_languages": sample.dropped,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gb", type=float, help="compressed size to write, in GB (fractions allowed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--file-mb", type=float, help="compressed size of one WET file, in MB (default 150)")
    ap.add_argument("--exact-rate", type=float, default=0.03, help="share of records that are exact copies")
    ap.add_argument("--near-rate", type=float, default=0.05, help="share of records that are near copies")
    ap.add_argument(
        "--near-band",
        type=float,
        nargs=2,
        default=(0.85, 0.95),
        metavar=("LO", "HI"),
        help="shingle Jaccard of a near copy to its original",
    )
    ap.add_argument(
        "--mutate", type=float, default=0.1, help="share of words changed in the pool copies pages are drawn from"
    )
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--lid-model", type=Path, default=LID_MODEL)
    ap.add_argument("--smoke", action="store_true", help="2 MB in files of 0.5 MB: checks that it runs")
    a = ap.parse_args()
    if a.gb is None and not a.smoke:
        ap.error("--gb is required (or --smoke)")
    if a.gb is None:
        a.gb = 0.002
    if a.file_mb is None:
        a.file_mb = 0.5 if a.smoke else 150
    if a.gb <= 0 or a.file_mb <= 0:
        ap.error("--gb and --file-mb must be positive")
    try:
        info = build(
            a.out,
            a.gb,
            a.seed,
            a.file_mb,
            a.exact_rate,
            a.near_rate,
            tuple(a.near_band),
            a.mutate,
            a.data,
            a.lid_model,
            progress=True,
        )
    except (OSError, ValueError) as e:  # a missing model or data file, a full disk: one line
        raise SystemExit(f"make_wet_corpus: {e}") from None
    print(
        f"wrote {info['files']} files, {info['records']:,} records ({info['originals']:,} pages, "
        f"{info['exact']:,} exact + {info['near']:,} near copies, {info['cross_file']:,} in a later file), "
        f"{info['bytes'] / 1e9:.3f} GB compressed ({info['text_bytes'] / 1e9:.3f} GB text) to {a.out} "
        f"in {info['seconds']:.1f} s: {info['bytes'] / 1e6 / info['seconds']:.1f} MB/s "
        f"({info['bytes'] / 1e6 / info['cpu_seconds']:.1f} MB/s of CPU time); "
        f"planted pairs in {a.out / 'truth.jsonl'}"
    )


if __name__ == "__main__":
    main()
