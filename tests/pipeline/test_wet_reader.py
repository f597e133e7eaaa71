"""The WET reader on the real Common Crawl samples, intact and damaged in known ways.

Damaged files are built from the real 2014 file by locating its gzip members with plain zlib
(independently of the reader), so each test knows exactly which record should be lost or kept.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import re
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import pytest

import gristmill
from gristmill.input.wet import BadRecord, SkippedRecord, WetReader, WetRecord, iter_wet_records

UUID = re.compile(r"^<urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}>$")


def members(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """(offset, compressed member, decompressed member) for each gzip member of `data`."""
    out, pos = [], 0
    while pos < len(data):
        d = zlib.decompressobj(31)
        plain = d.decompress(data[pos:])
        assert d.eof
        size = len(data) - pos - len(d.unused_data)
        out.append((pos, data[pos : pos + size], plain))
        pos += size
    return out


def starts(plains) -> list[int]:
    """Offset of each decompressed member in the decompressed stream (their concatenation)."""
    out, pos = [], 0
    for p in plains:
        out.append(pos)
        pos += len(p)
    return out


def record_id(plain: bytes) -> str:
    return re.search(rb"WARC-Record-ID: (\S+)", plain).group(1).decode()


def payload(plain: bytes) -> bytes:
    header, _, rest = plain.partition(b"\r\n\r\n")
    length = int(re.search(rb"Content-Length: (\d+)", header).group(1))
    return rest[:length]


def split(events):
    events = list(events)
    recs = [e for e in events if isinstance(e, WetRecord)]
    bad = [e for e in events if isinstance(e, BadRecord)]
    skipped = [e for e in events if isinstance(e, SkippedRecord)]
    assert len(recs) + len(bad) + len(skipped) == len(events)
    return recs, bad, skipped


@pytest.fixture(scope="module")
def wet2014(wet_files) -> tuple[bytes, list[tuple[int, bytes, bytes]]]:
    data = wet_files[0].read_bytes()
    mem = members(data)
    assert len(mem) == 567 and b"WARC-Type: warcinfo" in mem[0][2]
    return data, mem


def rebuild(mem, index: int, new_plain: bytes) -> bytes:
    """The file with member `index` replaced by a fresh single-member gzip of `new_plain`."""
    parts = [m[1] for m in mem]
    parts[index] = gzip.compress(new_plain)
    return b"".join(parts)


def write(tmp_path: Path, data: bytes, name="x.warc.wet.gz") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("which,count,crawl", [(0, 566, "CC-MAIN-2014-10"), (1, 43, "CC-MAIN-2017-30")])
def test_real_files(wet_files, which, count, crawl):
    path = wet_files[which]
    recs, bad, skipped = split(iter_wet_records(path))
    assert bad == [] and skipped == []
    assert len(recs) == count
    ids = [r.record_id for r in recs]
    assert len(set(ids)) == count and all(UUID.match(i) for i in ids)
    assert {r.crawl for r in recs} == {crawl}
    assert {r.source for r in recs} == {str(path)}
    offsets = [r.offset for r in recs]
    assert offsets[0] > 0 and all(a < b for a, b in zip(offsets, offsets[1:]))
    assert all(r.url.startswith("http") and r.date.startswith(crawl[8:12]) for r in recs)
    # texts and offsets agree with an independent zlib + Content-Length reading of the file;
    # offsets are those of the records in the decompressed stream, not of their gzip members
    mem = members(path.read_bytes())
    assert offsets == starts([m[2] for m in mem])[1:]
    mem = mem[1:]
    assert [r.text for r in recs] == [payload(m[2]).decode("utf-8", errors="replace") for m in mem]
    assert ids == [record_id(m[2]) for m in mem]


def test_fileobj_and_source_name(wet_files):
    recs, bad, _ = split(iter_wet_records(io.BytesIO(wet_files[1].read_bytes()), source_name="s3://x/y.gz"))
    assert len(recs) == 43 and not bad and {r.source for r in recs} == {"s3://x/y.gz"}


def test_truncated_member(tmp_path, wet2014):
    data, mem = wet2014
    off, comp, _ = mem[560]
    recs, bad, _ = split(iter_wet_records(write(tmp_path, data[: off + len(comp) // 2])))
    assert [(b.reason, b.offset) for b in bad] == [("truncated_member", off)]
    assert [r.record_id for r in recs] == [record_id(m[2]) for m in mem[1:560]]


@pytest.mark.parametrize("where", ["deflate", "crc"])
def test_corrupt_member_loses_only_that_record(tmp_path, wet2014, where):
    data, mem = wet2014
    off, comp, _ = mem[100]
    broken = bytearray(data)
    # a byte in the middle of the deflate stream, or the CRC32 in the member's 8-byte trailer
    broken[off + len(comp) // 2 if where == "deflate" else off + len(comp) - 8] ^= 0xFF
    recs, bad, _ = split(iter_wet_records(write(tmp_path, bytes(broken))))
    assert [(b.reason, b.offset) for b in bad] == [("gzip_error", off)]
    # the damaged member's bytes do not count in the stream: later offsets move up by its size
    intact = [m for i, m in enumerate(mem) if i != 100]
    expected = list(zip([record_id(m[2]) for m in intact], starts([m[2] for m in intact])))[1:]
    assert len(recs) == 565
    assert [(r.record_id, r.offset) for r in recs] == expected


def test_garbage_between_members(tmp_path, wet2014):
    data, mem = wet2014
    cut = mem[51][0]
    junk = random.Random(1).randbytes(5000).replace(b"\x1f\x8b", b"..")
    recs, bad, _ = split(iter_wet_records(write(tmp_path, data[:cut] + junk + data[cut:])))
    assert [(b.reason, b.offset) for b in bad] == [("garbage", cut)]
    # offsets count decompressed bytes only: the junk moves nothing
    assert len(recs) == 566 and recs[50].offset == starts([m[2] for m in mem])[51]


def test_empty_file(tmp_path):
    path = write(tmp_path, b"")
    assert list(iter_wet_records(path)) == [BadRecord("empty_file", str(path), 0)]


def test_not_gzip(tmp_path):
    junk = b"\x00" + random.Random(0).randbytes(10000)
    (event,) = iter_wet_records(write(tmp_path, junk))
    assert isinstance(event, BadRecord) and event.reason == "not_gzip"


@pytest.mark.parametrize("delta", [-10, 1000, 10**12, None])
def test_bad_content_length_keeps_text(tmp_path, wet2014, delta):
    data, mem = wet2014
    plain = mem[200][2]
    declared = len(payload(plain))
    new = b"Content-Length: " + (str(declared + delta).encode() if delta is not None else b"lots")
    edited = plain.replace(f"Content-Length: {declared}".encode(), new, 1)
    assert edited != plain
    recs, bad, _ = split(iter_wet_records(write(tmp_path, rebuild(mem, 200, edited))))
    assert [(b.reason, b.offset) for b in bad] == [("wrong_content_length", starts([m[2] for m in mem])[200])]
    assert len(recs) == 566
    # the whole text is recovered from the member boundary, and the neighbours are untouched
    for i in (198, 199, 200, 201):
        assert recs[i].text == payload(mem[i + 1][2]).decode()
        assert recs[i].record_id == record_id(mem[i + 1][2])


def test_invalid_utf8_is_counted_and_kept(tmp_path, wet2014):
    data, mem = wet2014
    plain = mem[300][2]
    header, _, rest = plain.partition(b"\r\n\r\n")
    n = len(payload(plain))
    header = header.replace(f"Content-Length: {n}".encode(), f"Content-Length: {n + 3}".encode())
    edited = header + b"\r\n\r\n" + b"\xff\xfe\xc3" + rest  # stays length-consistent
    recs, bad, _ = split(iter_wet_records(write(tmp_path, rebuild(mem, 300, edited))))
    assert [(b.reason, b.offset) for b in bad] == [("invalid_utf8", starts([m[2] for m in mem])[300])]
    assert len(recs) == 566
    rec = recs[299]
    assert rec.record_id == record_id(plain)
    assert rec.text.startswith("\ufffd") and rec.text.endswith(payload(plain).decode())


def test_bad_warc_header_and_other_types(tmp_path, wet2014):
    data, mem = wet2014
    no_id = re.sub(rb"WARC-Record-ID: \S+\r\n", b"", mem[10][2])
    request = mem[20][2].replace(b"WARC-Type: conversion", b"WARC-Type: request")
    not_warc = b"HTTP/1.1 200 OK\r\n\r\nhello"
    plains = [m[2] for m in mem]
    plains[10], plains[20] = no_id, request
    plains.insert(30, not_warc)
    parts = [gzip.compress(p) for p in plains]
    recs, bad, skipped = split(iter_wet_records(write(tmp_path, b"".join(parts))))
    assert Counter(b.reason for b in bad) == {"malformed_warc_header": 2}
    assert [(s.type, s.offset) for s in skipped] == [("request", starts(plains)[20])]
    assert len(recs) == 564
    assert record_id(mem[10][2]) not in {r.record_id for r in recs}


def test_uncompressed_warc(tmp_path, wet_files, wet2014):
    data, mem = wet2014
    plain = gzip.decompress(data)
    want = [(r.record_id, r.text, r.crawl) for r in iter_wet_records(wet_files[0])]
    recs, bad, _ = split(iter_wet_records(write(tmp_path, plain, "x.warc.wet")))
    assert not bad
    assert [(r.record_id, r.text, r.crawl) for r in recs] == want and len(recs) == 566
    # offsets are those of the records in the uncompressed file
    assert all(plain[r.offset : r.offset + 9] == b"WARC/1.0\r" for r in recs)
    assert all(a < b for a, b in zip([r.offset for r in recs], [r.offset for r in recs][1:]))


def test_uncompressed_warc_bad_content_length(tmp_path, wet2014):
    data, mem = wet2014
    plain = mem[400][2]
    n = len(payload(plain))
    edited = plain.replace(f"Content-Length: {n}".encode(), f"Content-Length: {n + 77}".encode())
    whole = b"".join(m[2] for m in mem[:400]) + edited + b"".join(m[2] for m in mem[401:])
    recs, bad, _ = split(iter_wet_records(write(tmp_path, whole, "x.warc.wet")))
    assert [b.reason for b in bad] == ["wrong_content_length"]
    assert len(recs) == 566
    assert [r.text for r in recs[398:402]] == [payload(m[2]).decode() for m in mem[399:403]]


def stat_totals(reader: WetReader) -> dict[str, int]:
    return {k: v.total for k, v in reader.stats.stats.items()}


def test_reader_shards_files_by_rank(wet_files):
    sources = [str(p) for p in wet_files]
    results = {}
    for rank in (0, 1):
        reader = WetReader(sources)
        docs = list(reader.run(rank=rank, world_size=2))
        results[rank] = (docs, stat_totals(reader))
    docs0, stats0 = results[0]
    docs1, stats1 = results[1]
    assert len(docs0) == 566 and {d.metadata["source"] for d in docs0} == {sources[0]}
    assert len(docs1) == 43 and {d.metadata["source"] for d in docs1} == {sources[1]}
    assert {d.metadata["crawl"] for d in docs1} == {"CC-MAIN-2017-30"}
    for docs, stats in results.values():
        assert stats == {"files": 1, "documents": len(docs), "bytes": sum(len(d.text.encode()) for d in docs)}
        assert set(docs[0].metadata) == {"url", "date", "crawl", "cc_language", "source", "offset"}
        assert all(UUID.match(d.id) for d in docs)


def test_reader_counts_bad_records_and_survives_missing_files(tmp_path, wet2014, wet_files):
    data, mem = wet2014
    off, comp, _ = mem[100]
    broken = bytearray(data)
    broken[off + len(comp) // 2] ^= 0xFF
    bad_file = write(tmp_path, bytes(broken))
    reader = WetReader([str(tmp_path / "missing.gz"), str(bad_file), str(wet_files[1])])
    docs = list(reader.run())
    assert len(docs) == 565 + 43
    assert stat_totals(reader) == {
        "bad_unreadable_file": 1,
        "bad_gzip_error": 1,
        "files": 2,
        "documents": 608,
        "bytes": sum(len(d.text.encode()) for d in docs),
    }


def test_reader_resolve_and_limit(wet_files):
    calls = []

    def resolve(url: str) -> str:
        calls.append(url)
        return str(wet_files[1] if url.endswith("2017") else wet_files[0])

    reader = WetReader(["cc://2014", "cc://2017"], resolve=resolve, limit=570)
    docs = list(reader.run())
    assert len(docs) == 570 and calls == ["cc://2014", "cc://2017"]
    assert [d.metadata["source"] for d in docs[565:]] == ["cc://2014"] + ["cc://2017"] * 4
    assert stat_totals(reader)["documents"] == 570
    assert len(list(WetReader([str(wet_files[0])], limit=0).run())) == 0


@pytest.mark.parametrize("chunk", [997, 64 << 10])
def test_results_do_not_depend_on_chunking(tmp_path, monkeypatch, wet2014, chunk):
    """Records and damage cross read-chunk boundaries; tiny chunks exercise every refill path."""
    from gristmill.input import wet as wet_reader

    data, mem = wet2014
    broken = bytearray(data)
    broken[mem[100][0] + len(mem[100][1]) // 2] ^= 0xFF
    plain = b"".join(m[2] for m in mem)
    n = len(payload(mem[400][2]))
    plain = plain.replace(f"Content-Length: {n}\r".encode(), f"Content-Length: {n - 5}\r".encode(), 1)
    files = [write(tmp_path, bytes(broken), "a.gz"), write(tmp_path, plain, "b.warc")]
    want = [list(iter_wet_records(f)) for f in files]
    monkeypatch.setattr(wet_reader, "CHUNK", chunk)
    got = [list(iter_wet_records(f)) for f in files]
    assert got == want
    assert Counter(type(e).__name__ for e in want[0]) == {"WetRecord": 565, "BadRecord": 1}
    assert Counter(getattr(e, "reason", "") for e in want[1]) == {"": 566, "wrong_content_length": 1}


# --- one WARC, three layouts: a gzip member per record, one member for the file, uncompressed ---


def layouts(tmp_path: Path, plains: list[bytes], original: Path | None = None) -> dict[str, Path]:
    whole = b"".join(plains)
    per_record = original or write(tmp_path, b"".join(gzip.compress(p) for p in plains), "a.warc.wet.gz")
    return {
        "per_record": per_record,
        "one_member": write(tmp_path, gzip.compress(whole), "b.warc.wet.gz"),
        "uncompressed": write(tmp_path, whole, "c.warc.wet"),
    }


def test_offsets_do_not_depend_on_how_the_file_was_gzipped(tmp_path, wet_files, wet2014):
    data, mem = wet2014
    plains = [m[2] for m in mem]
    got = {}
    for name, path in layouts(tmp_path, plains, original=wet_files[0]).items():
        recs, bad, skipped = split(iter_wet_records(path))
        assert not bad and not skipped
        got[name] = [(r.record_id, r.offset, r.text, r.crawl) for r in recs]
    assert got["per_record"] == got["one_member"] == got["uncompressed"]
    whole = b"".join(plains)
    offsets = [g[1] for g in got["one_member"]]
    assert len(set(offsets)) == 566 and all(whole.startswith(b"WARC/1.0\r\n", o) for o in offsets)


# --- records over max_record_bytes --------------------------------------------------------------

SEP, NEXT_RECORD = b"\r\n\r\n", b"\r\n\r\nWARC/"
LIMIT = 500_000  # the real records are up to 177 kB


def big_header(plain: bytes, size: int, declare: str) -> bytes:
    """`plain`'s header block declaring `size` ("honest"), 100 bytes ("small": the payload has
    no separator where that length ends) or no Content-Length at all."""
    header = plain.partition(SEP)[0]
    cl = re.compile(rb"\r\nContent-Length: \d+")
    header = {
        "honest": cl.sub(f"\r\nContent-Length: {size}".encode(), header),
        "small": cl.sub(b"\r\nContent-Length: 100", header),
        "none": cl.sub(b"", header),
    }[declare]
    assert header.count(b"Content-Length") == (declare != "none")
    return header + SEP


def oversized(plain: bytes, size: int, declare: str) -> bytes:
    """`plain`'s record with its real text repeated to `size` bytes (see `big_header`)."""
    text = payload(plain)
    big = (text * (size // len(text) + 1))[:size]
    assert NEXT_RECORD not in big
    return big_header(plain, size, declare) + big + SEP


@pytest.mark.parametrize("declare", ["honest", "small", "none"])
def test_record_over_the_limit_is_skipped_and_counted_in_every_layout(tmp_path, wet2014, declare):
    data, mem = wet2014
    plains = [m[2] for m in mem]
    plains[100] = oversized(plains[100], 3 * LIMIT, declare)
    want = [record_id(p) for i, p in enumerate(plains) if i not in (0, 100)]
    got = []
    for name, path in layouts(tmp_path, plains).items():
        recs, bad, _ = split(iter_wet_records(path, max_record_bytes=LIMIT))
        assert [(b.reason, b.offset) for b in bad] == [("record_too_large", starts(plains)[100])], name
        assert f"{3 * LIMIT} bytes, over the limit of {LIMIT}" in bad[0].detail
        assert [r.record_id for r in recs] == want
        got.append([(r.offset, r.text) for r in recs])
    assert got[0] == got[1] == got[2]
    assert got[0][99] == (starts(plains)[101], payload(plains[101]).decode())


@pytest.mark.parametrize("declare", ["honest", "none"])
def test_record_at_the_limit_is_kept(tmp_path, wet2014, declare):
    data, mem = wet2014
    plains = [m[2] for m in mem]
    plains[100] = oversized(plains[100], LIMIT, declare)
    for path in layouts(tmp_path, plains).values():
        recs, bad, _ = split(iter_wet_records(path, max_record_bytes=LIMIT))
        assert [b.reason for b in bad] == ([] if declare == "honest" else ["wrong_content_length"])
        assert len(recs) == 566 and len(recs[99].text) == LIMIT
        recs, bad, _ = split(iter_wet_records(path, max_record_bytes=LIMIT - 1))
        assert [b.reason for b in bad] == ["record_too_large"] and len(recs) == 565


def test_reader_counts_records_too_large(tmp_path, wet2014):
    data, mem = wet2014
    plains = [m[2] for m in mem]
    plains[7] = oversized(plains[7], 2 * LIMIT, "honest")  # 2014 record 7 is 25 kB
    reader = WetReader([str(write(tmp_path, b"".join(gzip.compress(p) for p in plains)))], max_record_bytes=LIMIT)
    docs = list(reader.run())
    assert len(docs) == 565 and stat_totals(reader)["bad_record_too_large"] == 1


# --- a gzip bomb: a record that declares and holds 1.2 GB of text, 9 MB compressed -------------

BOMB = 1200 << 20

CHILD = r"""
import io, json, resource, sys
spec = json.loads(sys.argv[1])
# a reader that held the whole record would take the machine's memory, one whose window copy
# grew with the record would run for hours: fail instead (the record takes ~2 s CPU here)
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
resource.setrlimit(resource.RLIMIT_CPU, (300, 300))
from gristmill.input.wet import iter_wet_records


class Stream(io.RawIOBase):
    # an uncompressed WARC made on the fly: head records, the bomb's header, its text, the rest
    def __init__(self, spec):
        self.parts = [open(spec["head"], "rb").read(), open(spec["header"], "rb").read()]
        self.unit, self.copies = open(spec["unit"], "rb").read(), spec["copies"]
        self.tail = open(spec["tail"], "rb").read()

    def readable(self):
        return True

    def readinto(self, buf):
        while not self.parts:
            if self.copies:
                self.copies -= 1
                self.parts.append(self.unit)
            elif self.tail is not None:
                self.parts.append(self.tail)
                self.tail = None
            else:
                return 0
        part = self.parts.pop(0)
        n = min(len(buf), len(part))
        buf[:n] = part[:n]
        if n < len(part):
            self.parts.insert(0, part[n:])
        return n


src = io.BufferedReader(Stream(spec), 1 << 20) if "unit" in spec else spec["path"]
ids, bad = [], []
for e in iter_wet_records(src, source_name="bomb"):
    if hasattr(e, "record_id"):
        ids.append(e.record_id)
    elif hasattr(e, "reason"):
        bad.append([e.reason, e.offset, e.detail])
# VmHWM, not ru_maxrss: after exec, Linux reports the parent's peak in ru_maxrss when larger
peak = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")) * 1024
print(json.dumps({"ids": ids, "bad": bad, "peak_rss": peak}))
"""


def bomb_text(plains: list[bytes]) -> bytes:
    """1 MiB of real paragraphs, repeating every 2 KiB (so deflate shrinks it ~140x)."""
    text = b"\n".join(payload(p) for p in plains[5:40])[:2048]
    assert b"\r" not in text
    return text * 512


def deflate_bomb(prefix: bytes, block: bytes, copies: int, suffix: bytes) -> bytes:
    """One gzip member of prefix + block * copies + suffix, compressed in a few seconds.

    After a full flush the compressor starts afresh, so the same block compresses to the same
    bytes every time: it is compressed once and repeated.
    """
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    body = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(block) + c.flush(zlib.Z_FULL_FLUSH) == body
    tail = c.compress(suffix) + c.flush()
    crc = zlib.crc32(prefix)
    for _ in range(copies):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(suffix, crc)
    size = len(prefix) + copies * len(block) + len(suffix)
    return (
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
        + head
        + body * copies
        + tail
        + struct.pack("<II", crc, size % (1 << 32))
    )


def run_child(spec: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(gristmill.__file__).parents[1]))
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "layout,declare", [("per_record", "honest"), ("one_member", "small"), ("uncompressed", "none")]
)
def test_gzip_bomb_is_streamed_past_in_bounded_memory(tmp_path, wet2014, layout, declare):
    data, mem = wet2014
    plains = [m[2] for m in mem]
    block = bomb_text(plains)
    copies = BOMB // len(block)
    head, tail = b"".join(plains[:300]), b"".join(plains[300:])
    # the bomb takes the place of a real record between records 299 and 300, with its header
    header = big_header(plains[299], copies * len(block), declare)
    header = header.replace(record_id(plains[299]).encode(), b"<urn:uuid:00000000-0000-0000-0000-00000000b0b0>")
    if layout == "per_record":
        path = tmp_path / "bomb.warc.wet.gz"
        with open(path, "wb") as f:
            f.writelines(gzip.compress(p) for p in plains[:300])
            f.write(deflate_bomb(header, block, copies, SEP))
            f.writelines(gzip.compress(p) for p in plains[300:])
        spec = {"path": str(path)}
    elif layout == "one_member":
        path = write(tmp_path, deflate_bomb(head + header, block, copies, SEP + tail), "bomb.warc.wet.gz")
        spec = {"path": str(path)}
    else:
        spec = {}
        for name, content in (("head", head), ("header", header), ("unit", block), ("tail", SEP + tail)):
            spec[name] = str(write(tmp_path, content, name))
        spec["copies"] = copies
    if "path" in spec:
        assert os.path.getsize(spec["path"]) < 12 << 20
    got = run_child(spec)
    assert got["ids"] == [record_id(p) for p in plains[1:]]  # every real record, before and after
    assert [b[:2] for b in got["bad"]] == [["record_too_large", len(head)]]
    assert f"{copies * len(block)} bytes" in got["bad"][0][2]
    assert got["peak_rss"] < 300 << 20, got["peak_rss"]


def test_one_member_file_cut_short_keeps_the_records_before_the_cut(tmp_path, wet2014):
    data, mem = wet2014
    whole = b"".join(m[2] for m in mem)
    full = [(r.record_id, r.offset, r.text) for r in iter_wet_records(write(tmp_path, whole, "full.warc"))]
    comp = gzip.compress(whole)
    recs, bad, _ = split(iter_wet_records(write(tmp_path, comp[: len(comp) // 2])))
    assert [(b.reason, b.offset) for b in bad] == [("truncated_member", 0)]
    # records stream out as they are inflated: only the one the cut went through is lost
    assert 200 < len(recs) < 400
    assert [(r.record_id, r.offset, r.text) for r in recs] == full[: len(recs)]
    inflated = len(zlib.decompressobj(31).decompress(comp[: len(comp) // 2]))
    lost = len(recs)  # the next record began before the cut and ends after it
    assert full[lost][1] < inflated < full[lost + 1][1]
