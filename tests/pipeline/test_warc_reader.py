"""The WARC reader: HTML responses of the real Common Crawl sample extracted by both extractors,
a whole run on it, crafted records for every fault, and Common Crawl by crawl name.

The sample (CC-MAIN-2020-34, from resiliparse's tests) holds 50 records: a warcinfo, 17
requests, 16 responses (all HTML) and 16 metadata records. Its records are located here with
plain zlib, independently of the reader, so the tests know each response's offset and id.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import textwrap
import tracemalloc
import uuid
import zlib
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gristmill.config import ConfigError, from_dict
from gristmill.core.step import DOCUMENT_BYTES_PER_BYTE, Workload
from gristmill.input.commoncrawl import list_wet_paths
from gristmill.input.warc import (
    DEFAULT_EXTRACTOR,
    DEPTH_CHECK_TAGS,
    EXTRACTION_BYTES_PER_BYTE,
    EXTRACTORS,
    MAX_ATTRIBUTES,
    MAX_DEPTH,
    MAX_HTML_TAGS,
    TREE_BYTES_PER_TAG,
    WarcConverter,
    WarcReader,
    dechunk,
    decode_html,
    dom_depth,
    iter_warc_documents,
    start_tags,
)
from gristmill.input.wet import MAX_RECORD_BYTES, BadRecord, WetRecord, iter_records
from gristmill.pipeline.planning.planner import estimate_memory, plan
from gristmill.pipeline.report.journey import funnel, journey, journey_notes, language_funnel, language_summary
from gristmill.pipeline.runner import run

from .test_wet_reader import members, starts

SAMPLE = "cc/warc/CC-MAIN-20200808165417-20200808195417-00395.sample.warc.gz"
CRAWL = "CC-MAIN-2020-34"
UUID = re.compile(r"^<urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}>$")


@pytest.fixture(scope="session")
def sample(shared_data) -> Path:
    path = shared_data / SAMPLE
    if not path.is_file():
        pytest.skip(f"test data missing: {path}")
    return path


def field(plain: bytes, name: str) -> str:
    return re.search(rb"\r\n" + name.encode() + rb": ([^\r]*)\r\n", plain).group(1).decode()


@pytest.fixture(scope="session")
def responses(sample) -> list[tuple[int, str, str]]:
    """(stream offset, WARC-Record-ID, URL) of each response record, read with zlib alone."""
    plains = [m[2] for m in members(sample.read_bytes())]
    return [
        (off, field(p, "WARC-Record-ID"), field(p, "WARC-Target-URI"))
        for off, p in zip(starts(plains), plains)
        if b"WARC-Type: response\r\n" in p.partition(b"\r\n\r\n")[0]
    ]


def split(events):
    events = list(events)
    recs = [e for e in events if isinstance(e, WetRecord)]
    reasons = Counter(  # as `pipeline stats` names them
        e.reason if isinstance(e, BadRecord) else f"skipped_{e.type}" for e in events if not isinstance(e, WetRecord)
    )
    return recs, reasons


# --- the real sample ------------------------------------------------------------------------------

#: text each extractor keeps of a page, as read on the sample (docs/warc.md): decoded right (the
#: windows-1251 and GBK pages too) and the main text there
KEPT = {
    "http://01spb.ru/company/": "Стратегия пожарной безопасности",
    "http://0900-hovenier.nl/gelderland/oosterbeek/": "Bent u verhuisd en is uw nieuwe tuin",
    "http://044545.com/topic/20200207/015849.html": "新一轮的赔付活动继续上线",
    "http://06.live-radsport.ch/fahrerstatistik_801/Anthony_Ravard.html": "ranglisten_teams_2020' doesn't exist",
}


@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_sample_pages_by_both_extractors(sample, responses, extractor):
    recs, reasons = split(iter_warc_documents(sample, extractor=extractor))
    # every record is accounted for: 16 responses, 17 requests, 16 metadata (warcinfo: the crawl)
    empty = {"resiliparse": 0, "trafilatura": 1}[extractor]  # a video page trafilatura keeps nothing of
    assert len(recs) == 16 - empty
    assert reasons == {"skipped_request": 17, "skipped_metadata": 16, **({"empty_text": 1} if empty else {})}
    by_id = {r.record_id: r for r in recs}
    for off, rid, url in responses:
        if rid not in by_id:
            assert extractor == "trafilatura" and url == "http://096355.com/video/11073.html?11073-0-2"
            continue
        r = by_id[rid]
        assert (r.offset, r.url, r.crawl, r.source, r.cc_language) == (off, url, CRAWL, str(sample), None)
        assert r.date.startswith("2020-08-08T") and UUID.match(r.record_id)
        assert r.text == r.text.strip() and r.text
        assert "\ufffd" not in r.text  # every page's charset was found
        assert "<script" not in r.text and "function(" not in r.text and "{" not in r.text[:200]
    for url, words in KEPT.items():
        assert words in next(r.text for r in recs if r.url == url), url
    assert [r.offset for r in recs] == sorted(r.offset for r in recs)


def test_what_each_extractor_keeps_of_the_sample(sample):
    """docs/warc.md's page-by-page reading, as checks that fail if an extractor or its settings change."""
    res, traf = (
        {r.url.split("//")[1]: r.text for r in iter_warc_documents(sample, extractor=name) if isinstance(r, WetRecord)}
        for name in EXTRACTORS
    )
    # a listing: trafilatura keeps the post rows, resiliparse the pagination and the copyright
    page = "041696.com/15477/list_6_4.html"
    assert "2020-04-09 admin" in traf[page] and "2020-04-09" not in res[page]
    assert "末页" in res[page] and "Copyright" in res[page] and "Copyright" not in traf[page]
    # a product grid: resiliparse keeps it, trafilatura keeps the footer's addresses instead
    page = "0615235.com/02mjqjo%7Bibotij2.btq?odmbtt=106&tdmbtt=121"
    assert "WJ-BJB_1" in res[page] and "WJ-BJB_1" not in traf[page] and "上海总部" in traf[page]
    # an article: both keep the body, resiliparse the byline too
    page = "003338.cn/l41/481397.html"
    assert "警方逮捕一些抗议者" in res[page] and "警方逮捕一些抗议者" in traf[page]
    assert "来源： 南方日报网络版" in res[page] and "南方日报" not in traf[page]
    # resiliparse's main-content mode drops brackets standing alone in <span>s
    page = "044545.com/topic/20200207/015849.html"
    assert "128期〖大水牛〗下注一万" in traf[page] and "128期大水牛下注一万" in res[page]
    # no alt texts (image file names, a diagram's caption), no stray byte-order marks
    assert "98a8e084f2bc4be1.jpg" not in res[page]
    assert "Schematische" not in res["0900-hovenier.nl/gelderland/oosterbeek/"]
    assert not any("\ufeff" in t for t in (*res.values(), *traf.values()))
    assert (sum(map(len, res.values())), sum(map(len, traf.values()))) == (22_707, 22_664)


def test_reader_step_counts_and_shards(sample, tmp_path):
    copy = tmp_path / "second.warc.gz"
    copy.write_bytes(sample.read_bytes())
    sources = [str(sample), str(copy)]
    got = {}
    for rank in (0, 1):
        reader = WarcReader(sources)
        docs = list(reader.run(rank=rank, world_size=2))
        got[rank] = docs
        totals = {k: v.total for k, v in reader.stats.stats.items()}
        assert totals == {
            "files": 1,
            "documents": 16,
            "bytes": sum(len(d.text.encode()) for d in docs),
            "skipped_request": 17,
            "skipped_metadata": 16,
        }
        assert {d.metadata["source"] for d in docs} == {sources[rank]}
        assert set(docs[0].metadata) == {"url", "date", "crawl", "cc_language", "source", "offset"}
    assert [d.id for d in got[0]] == [d.id for d in got[1]]
    assert len(list(WarcReader(sources, limit=5).run())) == 5
    assert WarcReader(sources).step_name == "read_warc" and DEFAULT_EXTRACTOR == "resiliparse"
    with pytest.raises(ValueError, match="unknown extractor 'boilerpipe'"):
        WarcReader(sources, extractor="boilerpipe")


# --- crafted records ------------------------------------------------------------------------------

ZH = "委员会今天上午发布了关于地区水质的年度报告，报告指出水质在过去一年中明显改善。marker"
RU = "Пожарная безопасность на предприятии: требования, проверки и обучение сотрудников."
EN = "The committee published its annual report on regional water quality this morning."


def page(text: str, title: str = "Report", meta: str = '<meta charset="utf-8">') -> str:
    return (
        f"<!DOCTYPE html><html><head>{meta}<title>{title}</title><style>p{{margin:0}}</style>"
        "<script>var tracker = function(a){return a.push(1)};</script></head><body>"
        '<nav><ul><li><a href="/">Home</a></li><li><a href="/about">About us</a></li></ul></nav>'
        f"<main><article><h1>{title}</h1>" + "".join(f"<p>{text} {i}</p>" for i in range(6)) + "</article></main>"
        "<!-- footer --><footer><p>Copyright 2020. All rights reserved.</p></footer></body></html>"
    )


def warc_record(rtype: str, payload: bytes, url: str = "http://example.com/", **fields: str) -> bytes:
    """One WARC record, uncompressed; `fields` add or override header fields (`_` for `-`)."""
    head = {
        "WARC-Type": rtype,
        "WARC-Date": "2020-08-08T17:27:41Z",
        "WARC-Record-ID": f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, url + rtype + str(len(payload)))}>",
        "Content-Length": str(len(payload)),
        "Content-Type": "application/http; msgtype=response" if rtype == "response" else "application/warc-fields",
        "WARC-Target-URI": url,
    }
    head.update({k.replace("_", "-"): v for k, v in fields.items()})
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items() if v is not None)
    return f"WARC/1.0\r\n{lines}\r\n".encode() + payload + b"\r\n\r\n"


def http(body: bytes, status: str = "200 OK", **headers: str) -> bytes:
    head = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return f"HTTP/1.1 {status}\r\n{head}\r\n".encode() + body


def chunked(body: bytes, size: int = 100) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: 1\r\n\r\n"


def warcinfo() -> bytes:
    return warc_record("warcinfo", f"isPartOf: {CRAWL}\r\n".encode(), url="")


def write_warc(tmp_path: Path, records: list[bytes], name: str = "crafted.warc.gz") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join(gzip.compress(r, mtime=0) for r in [warcinfo(), *records]))
    return path


def ok(url: str, body: bytes, ctype: str = "text/html; charset=utf-8", **headers: str) -> bytes:
    return warc_record("response", http(body, Content_Type=ctype, **headers), url=url)


def test_crafted_faults_are_counted_and_never_fatal(tmp_path):
    html = page(EN).encode()
    gz = gzip.compress(html)
    records = {
        "plain": ok("http://a/plain", html),
        "pdf": ok("http://a/doc.pdf", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj <<>> endobj\n", "application/pdf"),
        "png": ok("http://a/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png"),
        "json": ok("http://a/api", b'{"html": "<p>not a page</p>"}', "application/json"),
        # Common Crawl's own label wins over the server's: a PDF served as text/html
        "pdf_as_html": warc_record(
            "response",
            http(b"%PDF-1.7 ...", Content_Type="text/html"),
            "http://a/x",
            WARC_Identified_Payload_Type="application/pdf",
        ),
        "sniffed_html": warc_record("response", http(html), url="http://a/no-type"),
        "sniffed_binary": warc_record("response", http(b"\x00\x01binary"), url="http://a/no-type-bin"),
        # UTF-8 with two bytes that are not: no charset decodes it cleanly
        "bad_bytes": ok("http://a/bad-bytes", page(ZH).encode().replace(b"marker", b"\xff\xfe marker", 1)),
        "cp1251_meta_only": ok(
            "http://a/ru",
            page(RU, "Новости", '<meta http-equiv="Content-Type" content="text/html; charset=windows-1251">').encode(
                "cp1251"
            ),
            "text/html",
        ),
        "no_http_headers": warc_record("response", html, url="http://a/no-http"),
        "chunked": ok("http://a/chunked", chunked(html), Transfer_Encoding="chunked"),
        "chunked_gzip": ok(
            "http://a/chunked-gzip", chunked(gz, 333), Transfer_Encoding="chunked", Content_Encoding="gzip"
        ),
        "gzip": ok("http://a/gzip", gz, Content_Encoding="gzip"),
        "gzip_cut": ok("http://a/cut-gzip", gz[: len(gz) * 4 // 5], Content_Encoding="gzip"),  # a truncated record
        "deflate_raw": ok("http://a/deflate", zlib.compress(html)[2:-4], Content_Encoding="deflate"),
        # Common Crawl before it renamed the headers: decoded body, original header
        "stored_decoded": ok("http://a/stored-decoded", html, Content_Encoding="gzip", Transfer_Encoding="chunked"),
        "corrupt_gzip": ok("http://a/corrupt", gz[:10] + bytes(len(gz) - 10), Content_Encoding="gzip"),
        "bad_chunks": ok("http://a/bad-chunks", b"zz\r\n" + gz, Transfer_Encoding="chunked"),
        "br_unsupported": ok("http://a/zstd", b"\x28\xb5\x2f\xfd binary", Content_Encoding="zstd"),
        "not_found": warc_record("response", http(html, "404 Not Found", Content_Type="text/html"), "http://a/404"),
        "only_script": ok("http://a/empty", b"<html><head><script>var a = 1;</script></head><body></body></html>"),
        "request": warc_record("request", b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "http://a/plain"),
        "metadata": warc_record("metadata", b"fetchTimeMs: 224\r\n", "http://a/plain"),
        "revisit": warc_record("revisit", http(b"", "304 Not Modified"), "http://a/plain"),
        "no_record_id": warc_record("response", http(html), "http://a/no-id", WARC_Record_ID=None),
    }
    path = write_warc(tmp_path, list(records.values()))
    events = list(iter_warc_documents(path))
    recs, reasons = split(events)
    assert reasons == {
        "skipped_non_html": 5,  # pdf, png, json, the PDF served as HTML, the binary without a type
        "skipped_http_status": 1,
        "skipped_request": 1,
        "skipped_metadata": 1,
        "skipped_revisit": 1,
        "undecodable_bytes": 1,  # kept: flagged, not lost
        "malformed_http_header": 1,
        "malformed_content_encoding": 2,  # the corrupt gzip stream, zstd
        "malformed_chunked_encoding": 1,
        "empty_text": 1,
        "malformed_warc_header": 1,
    }
    texts = {r.url.removeprefix("http://a/"): r.text for r in recs}
    assert sorted(texts) == sorted(
        [
            "plain",
            "no-type",
            "bad-bytes",
            "ru",
            "chunked",
            "chunked-gzip",
            "gzip",
            "cut-gzip",
            "deflate",
            "stored-decoded",
        ]
    )
    assert EN in texts["cut-gzip"] and texts["plain"].startswith(texts["cut-gzip"][:100])
    # the same page through every encoding gives the same text
    for name in ("no-type", "chunked", "chunked-gzip", "gzip", "deflate", "stored-decoded"):
        assert texts[name] == texts["plain"], name
    assert EN in texts["plain"] and "Home" not in texts["plain"] and "tracker" not in texts["plain"]
    assert RU in texts["ru"] and "\ufffd" not in texts["ru"]  # windows-1251, declared only in the meta tag
    assert "\ufffd" in texts["bad-bytes"] and "marker" in texts["bad-bytes"]
    # offsets are the records' in the decompressed stream, in file order
    offsets = [e.offset for e in events]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(records)


@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_crafted_pages_by_both_extractors(tmp_path, extractor):
    cp1251 = page(RU, "Новости", '<meta charset="windows-1251">').encode("cp1251")
    path = write_warc(tmp_path, [ok("http://a/ru", cp1251, "text/html"), ok("http://a/en", page(EN).encode())])
    recs, reasons = split(iter_warc_documents(path, extractor=extractor))
    assert not reasons and [r.url for r in recs] == ["http://a/ru", "http://a/en"]
    assert RU in recs[0].text and EN in recs[1].text
    assert "Copyright" not in recs[1].text or extractor == "resiliparse"  # trafilatura drops the footer


def test_an_extractor_that_raises_costs_its_page_only(tmp_path):
    path = write_warc(tmp_path, [ok("http://a/ru", page(RU).encode()), ok("http://a/en", page(EN).encode())])
    convert = WarcConverter()
    extract = convert.extract

    def fragile(html: str) -> str:  # as lxml does on a page nested too deep
        if RU in html:
            raise RecursionError("maximum recursion depth exceeded")
        return extract(html)

    convert.extract = fragile
    events = list(iter_records(path, convert))
    recs, reasons = split(events)
    assert reasons == {"extraction_error": 1} and [r.url for r in recs] == ["http://a/en"]
    assert "RecursionError: maximum recursion depth exceeded" in next(
        e.detail for e in events if isinstance(e, BadRecord)
    )


def test_charset_order():
    ru = RU.encode("cp1251")
    meta = b'<html><head><meta charset="windows-1251"></head><body>' + ru + b"</body></html>"
    # the header wins over the meta tag when it decodes the page
    assert decode_html(meta, "text/html; charset=koi8-r")[1] == "koi8-r"
    # a header that does not fit (utf-8 over cp1251 bytes) gives way to the meta tag
    assert decode_html(meta, "text/html; charset=utf-8")[:2] == (meta.decode("cp1251"), "cp1251")
    # nothing declared: detection
    text, codec, bad = decode_html(b"<html><body>" + ru * 5 + b"</body></html>", None)
    assert RU in text and codec == "cp1251" and bad == 0
    # iso-8859-1 is read as windows-1252 (WHATWG), gb2312 as GB18030
    assert decode_html("caf\u00e9 \u20ac".encode("cp1252"), "text/html; charset=iso-8859-1")[:2] == ("café €", "cp1252")
    assert decode_html("中文𠀀".encode("gb18030"), "text/html; charset=gb2312")[:2] == ("中文𠀀", "gb18030")
    # a byte-order mark wins over everything
    assert decode_html(b"\xef\xbb\xbf" + "é".encode(), "text/html; charset=cp1251")[:2] == ("é", "utf-8-sig")
    # a character cut at the end of a truncated payload is dropped, not replaced
    assert decode_html("añb€".encode()[:-1], "text/html; charset=utf-8") == ("añb", "utf-8", 0)
    # the declared charset does not fit, detection's does: an ASCII page with a Latin-1 byte
    assert decode_html(b"plain ascii \xff text", "text/html; charset=utf-8") == ("plain ascii ÿ text", "cp1252", 0)
    # nothing decodes cleanly (UTF-8 Chinese with two stray bytes): the fewest replacements
    broken = (ZH * 3).encode().replace("报告".encode(), b"\xff\xfe", 1)
    text, codec, bad = decode_html(broken, "text/html; charset=gbk")
    assert (codec, bad) == ("utf-8", 2) and text == broken.decode("utf-8", errors="replace")


def test_dechunk_keeps_what_a_cut_body_holds():
    body = b"Hello, chunked world! " * 20
    assert dechunk(bytearray(chunked(body, 7))) == body
    cut = chunked(body, 50)[:120]
    assert body.startswith(bytes(dechunk(bytearray(cut)))) and len(dechunk(bytearray(cut))) > 50


def test_a_chunk_size_that_lies_is_counted_not_read_as_text(tmp_path):
    """`ffffffffffffffff` (or any size past the body's last chunk) would make the framing after it
    text: such a record is malformed_chunked_encoding; a body cut short keeps its chunks; the
    reader's counters are `bad_<reason>` once, never `bad_bad_...`."""
    html = page(EN).encode()
    lies = {
        "huge": b"ffffffffffffffff\r\n" + html + b"\r\n0\r\n\r\n",
        "past-the-end": b"%x\r\n" % (len(html) + 500) + html + b"\r\n0\r\n\r\n",
        "over-the-limit": b"%x\r\n" % (MAX_RECORD_BYTES + 1) + html,
    }
    records = [ok(f"http://a/{k}", v, Transfer_Encoding="chunked") for k, v in lies.items()]
    records.append(ok("http://a/cut", chunked(html, 300)[:-400], Transfer_Encoding="chunked"))
    records.append(warc_record("response", html, url="http://a/no-http"))
    path = write_warc(tmp_path, records)
    events = list(iter_warc_documents(path))
    recs, reasons = split(events)
    assert reasons == {"malformed_chunked_encoding": 3, "malformed_http_header": 1}
    assert [r.url for r in recs] == ["http://a/cut"] and EN in recs[0].text and "\r\n0" not in recs[0].text
    details = [e.detail for e in events if isinstance(e, BadRecord)]
    assert "a chunk of 18,446,744,073,709,551,615 bytes at body byte 0, over 8,388,608" in details[0]
    assert "runs past the body's last chunk" in details[1]
    reader = WarcReader([str(path)])
    assert len(list(reader.run())) == 1
    counters = set(reader.stats.stats)
    assert {"bad_malformed_chunked_encoding", "bad_malformed_http_header"} <= counters
    assert not [c for c in counters if c.startswith(("bad_bad_", "skipped_skipped_"))]


# --- size limits: a huge page and gzip bombs ------------------------------------------------------


def test_page_over_the_limit_is_streamed_past(tmp_path):
    big = b"<html><body>" + (b"<p>" + EN.encode() + b"</p>\n") * (52_000_000 // (len(EN) + 8)) + b"</body></html>"
    assert len(big) > 50_000_000
    path = write_warc(
        tmp_path,
        [ok("http://a/before", page(EN).encode()), ok("http://a/big", big), ok("http://a/after", page(RU).encode())],
    )
    del big
    tracemalloc.start()
    try:
        recs, reasons = split(iter_warc_documents(path))  # default limit: 8 MiB
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reasons == {"record_too_large": 1}
    assert [r.url for r in recs] == ["http://a/before", "http://a/after"]
    # the reader looks at most the limit ahead for the record's end, then streams past the rest
    assert peak < MAX_RECORD_BYTES + (8 << 20) < 50_000_000, peak


def test_a_text_longer_than_the_limit_in_utf8_is_too_large(tmp_path):
    """A page in a single-byte charset decodes to 3 bytes of UTF-8 a Thai letter: under the record
    limit as HTML, over it as text, which no document may be (every memory model counts documents
    up to the limit). Half as much Thai fits and is kept."""
    limit = 1 << 20
    thai = bytes(range(0xA1, 0xDA)) + b" "  # TIS-620 letters, windows-874's lower half

    def body(n: int) -> bytes:
        head = b'<html><head><meta charset="windows-874"><title>t</title></head><body><main><article>'
        return head + b"<p>" + thai * (n // len(thai)) + b"</p></article></main></body></html>"

    path = write_warc(
        tmp_path,
        [ok("http://a/long", body(900_000), ctype="text/html"), ok("http://a/ok", body(300_000), ctype="text/html")],
    )
    events = list(iter_warc_documents(path, max_record_bytes=limit))
    recs, reasons = split(events)
    assert reasons == {"record_too_large": 1} and [r.url for r in recs] == ["http://a/ok"]
    assert limit // 2 < len(recs[0].text.encode()) <= limit
    bad = next(e for e in events if isinstance(e, BadRecord))
    assert "bytes of text extracted, over the limit of 1048576 (input.max_record_bytes)" in bad.detail


def test_gzip_bomb_record_is_streamed_past(tmp_path):
    """A WARC gzip member of 200 KB that inflates to 200 MB: over the limit, never held."""
    head = warc_record("response", b"", "http://a/bomb").partition(b"\r\n\r\n")[0]
    size = 200_000_000
    body_start = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<html><body>"
    header = head.replace(b"Content-Length: 0", f"Content-Length: {len(body_start) + size}".encode()) + b"\r\n\r\n"
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"a" * (1 << 20)
    bomb = c.compress(header + body_start) + b"".join(c.compress(zeros) for _ in range(size >> 20))
    bomb += c.compress(b"\r\n\r\n") + c.flush()
    assert len(bomb) < 1 << 20
    path = tmp_path / "bomb.warc.gz"
    path.write_bytes(
        gzip.compress(warcinfo())
        + gzip.compress(ok("http://a/before", page(EN).encode()))
        + bomb
        + gzip.compress(ok("http://a/after", page(EN).encode()))
    )
    recs, reasons = split(iter_warc_documents(path, max_record_bytes=8 << 20))
    assert reasons == {"record_too_large": 1}
    assert [r.url for r in recs] == ["http://a/before", "http://a/after"]


def test_content_encoding_bomb_stops_at_the_limit(tmp_path):
    """A 100 KB gzip body that inflates to 100 MB, in a record well under the limit."""
    bomb = gzip.compress(b"<html><body>" + b" " * 100_000_000, compresslevel=9)
    assert len(bomb) < 200_000
    path = write_warc(
        tmp_path, [ok("http://a/bomb", bomb, Content_Encoding="gzip"), ok("http://a/next", page(EN).encode())]
    )
    tracemalloc.start()
    try:
        events = list(iter_warc_documents(path, max_record_bytes=4 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    recs, reasons = split(events)
    assert reasons == {"record_too_large": 1} and [r.url for r in recs] == ["http://a/next"]
    bad = next(e for e in events if isinstance(e, BadRecord))
    assert "inflates past 4194304 bytes" in bad.detail
    assert peak < 16 << 20, peak  # inflated no further than the limit


def test_truncated_member_loses_only_its_record(tmp_path):
    records = [ok(f"http://a/{i}", page(f"{EN} {i}").encode()) for i in range(3)]
    full = write_warc(tmp_path, records)
    data = full.read_bytes()
    cut = tmp_path / "cut.warc.gz"
    cut.write_bytes(data[: len(data) - len(gzip.compress(records[2], mtime=0)) // 2])
    events = list(iter_warc_documents(cut))
    recs, reasons = split(events)
    assert reasons == {"truncated_member": 1}
    assert [r.url for r in recs] == ["http://a/0", "http://a/1"]


def test_a_page_of_too_many_tags_is_counted_not_parsed(tmp_path):
    """Markup costs an extractor per element, not per byte: 150,000 nested <div>s (750 KB) would
    take resiliparse minutes (quadratic in depth) and trafilatura's tree ~200 MB."""
    nested = b"<html><body>" + b"<div>" * 150_000 + b"</body></html>"
    at_limit = page(EN).replace("<main>", "<main>" + "<b>w</b>" * 900).encode()  # 900 tags and the page's
    path = write_warc(
        tmp_path,
        [ok("http://a/nested", nested), ok("http://a/at-limit", at_limit), ok("http://a/after", page(EN).encode())],
    )
    events = list(iter_warc_documents(path))
    recs, reasons = split(events)
    assert reasons == {"too_many_tags": 1} and [r.url for r in recs] == ["http://a/at-limit", "http://a/after"]
    assert "150,002 start tags, over the limit of 100,000 (input.max_html_tags)" in next(
        e.detail for e in events if isinstance(e, BadRecord)
    )
    # the limit is the page's start tags: the same page is over a limit just below them
    tags = start_tags(at_limit.decode())
    assert 900 < tags < 1000
    for limit, kept in ((tags, ["at-limit", "after"]), (tags - 1, ["after"])):
        recs, reasons = split(iter_warc_documents(path, max_html_tags=limit))
        assert [r.url.removeprefix("http://a/") for r in recs] == kept
        assert reasons == {"too_many_tags": 3 - len(kept)}
    assert start_tags("<p>a</p><!-- x --><!DOCTYPE html><br/>") == 4  # comments make nodes too


_WS = " \t\n\f\r"


def _attribute_step(state: str, c: str) -> tuple[str | None, int]:
    """The HTML standard's tokenizer from "tag name" to "self-closing start tag", one character:
    (the next state, None once the tag ends; 1 if a new attribute began). The reference
    `gristmill.native._html` is tested equal to."""
    while True:
        if state == "tag":
            return ("before" if c in _WS else "self" if c == "/" else None if c == ">" else "tag"), 0
        if state == "before":
            if c in _WS:
                return "before", 0
            if c in "/>":
                state = "after"
                continue
            return "name", 1
        if state == "name":
            if c in _WS or c in "/>":
                state = "after"
                continue
            return ("value?" if c == "=" else "name"), 0
        if state == "after":
            if c in _WS:
                return "after", 0
            if c in "/=>":
                return {"/": "self", "=": "value?", ">": None}[c], 0
            return "name", 1
        if state == "value?":
            return ("value?" if c in _WS else {'"': "dq", "'": "sq", ">": None}.get(c, "unquoted")), 0
        if state in ("dq", "sq"):
            return ("quoted" if c == {"dq": '"', "sq": "'"}[state] else state), 0
        if state == "unquoted":
            return ("before" if c in _WS else None if c == ">" else "unquoted"), 0
        if state == "quoted":
            if c in _WS + "/>":
                return {"/": "self", ">": None}.get(c, "before"), 0
            state = "before"
            continue
        if c == ">":  # self-closing start tag
            return None, 0
        state = "before"


def most_attributes_reference(html: str) -> tuple[int, int]:
    """(most attributes, first `<` with that many) over a scan from every `<` and `</` before
    an ASCII letter, each scan on its own: quadratic, for tests."""
    best, at = 0, -1
    for s in range(len(html) - 1):
        if html[s] != "<":
            continue
        j = s + 1 + (html[s + 1] == "/")
        if j >= len(html) or not (html[j].isascii() and html[j].isalpha()):
            continue
        state, k = "tag", 0
        for c in html[j + 1 :]:
            state, added = _attribute_step(state, c)
            if state is None:
                break
            k += added
        if k > best:
            best, at = k, s
    return best, at


def test_attributes_are_counted_as_the_tokenizer_reads_tags(sample):
    """`most_attributes` (C) equals the quadratic reference on the sample's 16 pages and on 5,000
    random strings of markup characters, and finds the tags a parser would not see as such."""
    import random

    from gristmill.input.warc import decode_body, http_head
    from gristmill.native._html import most_attributes

    pages = []

    def keep(rec):
        head = http_head(rec.payload)
        if rec.fields["warc-type"] == "response" and head is not None:
            pages.append(decode_html(decode_body(rec.payload, head[2], head[1], 1 << 25), None)[0])
        return []

    list(iter_records(sample, keep, None, 1 << 25))
    assert len(pages) == 16
    for html in pages:
        assert most_attributes(html, 1 << 40) == most_attributes_reference(html)
        assert most_attributes(html, 1 << 40)[0] < 100  # real elements have a few
    rnd = random.Random(7)
    pieces = list("<>/=\"' \t\nab") + ["é", "<a", "</b", "\u4e00", "\U0001f600"]
    for _ in range(5000):
        html = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 50)))
        assert most_attributes(html, 1 << 40) == most_attributes_reference(html), repr(html)
    cases = {
        "<div a b c>": (3, 0),
        "<p x=\"1\"y='2'z=3/v /w>": (4, 0),  # none needed after a quoted value; `/` separates, not in a value
        "<p =x>": (1, 0),  # `=` begins a name here
        "<!-- <p a b> -->x": (2, 5),  # a tag in a comment is counted too (it may be none)
        '<p a=">" b=">" c>': (3, 0),  # `>` inside quotes ends nothing
        "</p a b>": (2, 0),  # an end tag's attributes (parsers read them, then drop them)
        "a < b c d": (0, -1),  # `<` before a space starts no tag
    }
    for html, expected in cases.items():
        assert most_attributes(html, 1 << 40) == most_attributes_reference(html) == expected, html
    assert most_attributes("<div " + "a " * 5000, 10) == (11, 0)  # it stops once over the limit


def test_an_element_of_300000_attributes_is_counted_not_parsed(tmp_path):
    """One `<div a0=1 ... a299999=1>` (2.7 MB) would keep either parser busy for minutes: the
    reader counts it `too_many_attributes` and reads on; attributes hidden from a naive count
    (quoted `>`s, a tag opened in a script) are found too; a page at the limit is extracted."""
    hostile = "<html><body><div " + " ".join(f"a{i}=1" for i in range(300_000)) + f">{EN}</div></body></html>"
    quoted = "<html><body><p " + " ".join(f'a{i}=">"' for i in range(5000)) + f">{EN}</p></body></html>"
    # a `<b` in a script opens a quote that a tokenizer never sees; `<style>` in `<svg>` is markup
    in_script = "<html><head><script>if (a<b) { s = '' }</script></head><body>"
    in_script += "<svg><style><p " + " ".join(f"b{i}" for i in range(2000)) + f"></style></svg><p>{EN}</p>"
    at_limit = page(EN).replace("<main>", "<main><p " + " ".join(f"a{i}" for i in range(MAX_ATTRIBUTES)) + ">", 1)
    pages = {"hostile": hostile, "quoted": quoted, "in-script": in_script, "at-limit": at_limit, "after": page(EN)}
    path = write_warc(tmp_path, [ok(f"http://a/{k}", v.encode()) for k, v in pages.items()])
    for extractor in EXTRACTORS:
        events = list(iter_warc_documents(path, extractor=extractor))
        recs, reasons = split(events)
        assert reasons == {"too_many_attributes": 3}, extractor
        assert [r.url for r in recs] == ["http://a/at-limit", "http://a/after"] and EN in recs[0].text
        details = [e.detail for e in events if isinstance(e, BadRecord)]
        assert f"an element with over {MAX_ATTRIBUTES:,} attributes (its tag at character 12)" in details[0]
    # the limit is the most attributes of one element
    recs, reasons = split(iter_warc_documents(path, max_attributes=MAX_ATTRIBUTES - 1))
    assert reasons == {"too_many_attributes": 4} and [r.url for r in recs] == ["http://a/after"]


def test_a_page_nested_too_deep_is_counted_not_parsed(tmp_path):
    """resiliparse's main-content pass is quadratic in nesting depth (50,000 nested <div>s: 44 CPU
    seconds); a page of more than DEPTH_CHECK_TAGS start tags nested deeper than MAX_DEPTH is lost
    as too_deep, whatever the extractor. Depth is the tree's, as a browser builds it."""
    body = "<p>" + EN
    pages = {
        "deep": "<html><body>" + "<div>" * 600 + body * 5000,  # 5,602 start tags, 600 deep
        "deep-few-tags": "<html><body>" + "<div>" * 600 + body * 100,  # as deep, too few tags to cost much
        "wide": "<html><body>" + "<span>" * 500 + body * 5000,  # the <p>s nest in the spans, not in each other
        "unclosed": "<html><body>" + "<li>" * 6000 + "<td>1" * 6000,  # lists and cells close themselves
    }
    assert dom_depth(pages["deep"]) == MAX_DEPTH + 1 and dom_depth(pages["wide"]) < MAX_DEPTH
    assert dom_depth(pages["unclosed"]) < 10 and start_tags(pages["unclosed"]) > DEPTH_CHECK_TAGS
    path = write_warc(tmp_path, [ok(f"http://a/{name}", html.encode()) for name, html in pages.items()])
    # lxml stops building trafilatura's tree 256 levels down: what is deeper is lost as empty text
    kept = {"resiliparse": ["deep-few-tags", "wide", "unclosed"], "trafilatura": ["unclosed"]}
    for extractor in EXTRACTORS:
        events = list(iter_warc_documents(path, extractor=extractor))
        recs, reasons = split(events)
        assert reasons == {"too_deep": 1, **({"empty_text": 2} if extractor == "trafilatura" else {})}
        assert [r.url.removeprefix("http://a/") for r in recs] == kept[extractor]
        bad = next(e for e in events if isinstance(e, BadRecord))
        assert bad.detail.endswith("elements nested more than 512 deep (5,602 start tags)")


# --- the pipeline ---------------------------------------------------------------------------------


def recrawl(sample: Path, dest: Path) -> Path:
    """The sample as if crawled again: the same pages under new record ids (one gzip member each)."""
    out = []
    for _, _, plain in members(sample.read_bytes()):
        rid = field(plain, "WARC-Record-ID")
        new = f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, rid)}>"
        out.append(gzip.compress(plain.replace(rid.encode(), new.encode()), mtime=0))
    dest.write_bytes(b"".join(out))
    return dest


def warc_config(run_dir: Path, paths: list[Path], lid_model: Path, tasks: int) -> dict:
    return {
        "run_dir": str(run_dir),
        "executor": {"type": "local", "tasks": tasks, "workers": 1},
        "input": {"paths": [str(p) for p in paths], "format": "warc"},
        "steps": [
            {"langid": {"model": str(lid_model), "languages": None, "min_score": 0.0}},
            # the sample is short pages, mostly Chinese: thresholds that let most of it through
            {
                "gopher_quality": {
                    "min_doc_words": 5,
                    "min_stop_words": 0,
                    "min_avg_word_length": 1,
                    "max_non_alpha_words_ratio": 0.0,
                }
            },
            {"gopher_repetition": {"dup_line_frac": None, "dup_para_frac": None, "top_n_grams": [], "dup_n_grams": []}},
            # a filter sized for the sample's pages: the default (100M items) is a 274 MB file a run
            {"exact_dedup": {"capacity": 100_000}},
            {"near_dedup": {}},
        ],
        "output": {"dropped_sample": 0.0},
    }


def final_rows(run_dir: Path) -> list[tuple]:
    outputs = sorted(p for p in run_dir.iterdir() if p.is_dir() and (p / "output").is_dir())
    table = pq.read_table(outputs[-1] / "output")
    rows = zip(*(table.column(c).to_pylist() for c in ("source", "offset", "id", "text", "language")))
    return sorted(rows)


@pytest.mark.slow
def test_pipeline_run_on_warc_is_stable_across_runs_and_task_counts(tmp_path, sample, lid_model, responses):
    first = tmp_path / "a" / sample.name
    first.parent.mkdir()
    first.write_bytes(sample.read_bytes())
    again = recrawl(sample, tmp_path / "b.warc.gz")
    results = {}
    for name, tasks in (("t1", 1), ("t2", 2), ("t2-again", 2)):
        merged = run(from_dict(warc_config(tmp_path / name, [first, again], lid_model, tasks)))
        results[name] = (final_rows(tmp_path / name), merged)
    rows, merged = results["t1"]
    assert rows == results["t2"][0] == results["t2-again"][0]
    reader = funnel(merged)[0]
    assert reader.step == "read_warc" and reader.docs_out == 32  # 16 pages in each file
    by_step = {r.step: r for r in journey(merged)}
    passed = by_step["03_exact_dedup"].docs_in
    assert passed > 20  # most pages of both files reach dedup
    # exact dedup keeps the first crawl's copy of every page, whatever the task count: it drops
    # the second file's half of what reached it, by (source, offset) order
    assert by_step["03_exact_dedup"].drops == {"exact_duplicate": passed // 2}
    assert rows and {r[0] for r in rows} == {str(first)}
    assert {(r[1], r[2]) for r in rows} <= {(off, rid) for off, rid, _ in responses}
    assert all(r[3] and r[4] for r in rows)  # text, and langid's label


def test_a_warc_runs_stats_count_every_fault(tmp_path, lid_model):
    """What the reader counts reaches the run's stats: non-HTML responses and requests (records,
    not documents), a page no charset decodes (kept, flagged), a page over max_record_bytes, one of
    too many tags, one nested too deep, a truncated gzip member (lost, by reason); none ends the run."""
    records = [
        ok("http://a/plain", page(EN).encode()),
        ok("http://a/doc.pdf", b"%PDF-1.4\n1 0 obj <<>> endobj\n", "application/pdf"),
        warc_record("request", b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "http://a/plain"),
        ok("http://a/bad-bytes", page(ZH).encode().replace(b"marker", b"\xff\xfe marker", 1)),
        ok("http://a/big", page(EN * 30_000).encode()),  # ~15 MB
        ok("http://a/tags", b"<html><body>" + b"<b>w</b>" * 9000 + b"</body></html>"),
        ok("http://a/deep", b"<html><body>" + b"<div>" * 600 + b"<p>w" * 4000),  # 4,602 start tags
        ok("http://a/after", page(RU).encode()),
    ]
    path = write_warc(tmp_path, records, "faults.warc.gz")
    last = gzip.compress(ok("http://a/cut", page(EN + " cut").encode()), mtime=0)
    path.write_bytes(path.read_bytes() + last[: len(last) // 2])
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "executor": {"type": "local", "tasks": 1, "workers": 1},
        "input": {"paths": [str(path)], "format": "warc", "max_record_bytes": 8 << 20, "max_html_tags": 8000},
        "steps": [{"langid": {"model": str(lid_model), "languages": None, "min_score": 0.0}}],
        "output": {"dropped_sample": 0.0},
    }
    merged = run(from_dict(cfg))
    reader = journey(merged)[0]
    assert (reader.step, reader.docs_in, reader.docs_out) == ("read_warc", 7, 3)
    assert reader.drops == {"record_too_large": 1, "too_many_tags": 1, "too_deep": 1, "truncated_member": 1}
    assert {k: v for k, v in reader.counters.items() if k != "files"} == {
        "skipped_non_html": 1,
        "skipped_request": 1,
        "bad_undecodable_bytes": 1,
    }
    assert journey_notes(reader) == "1 files; 2 records skipped (not documents); kept despite undecodable_bytes 1"
    # per language, the lost pages are the reader's drops, and records that are no pages are none
    unknown = next(x for x in language_summary(language_funnel(merged)) if x["language"] == "unknown")
    assert (unknown["read"], unknown["drops_by_step"]) == (4, {"read_warc": 4})


def test_plan_models_the_warc_readers_memory(tmp_path):
    """`pipeline plan` holds a WARC task to a page at both limits: per byte of max_record_bytes and
    per tag of max_html_tags, each extractor its own, and refuses a stage that does not fit."""

    def estimate(**inp):
        cfg = from_dict({"input": {"paths": ["x.warc.gz"], "format": "warc", **inp}, "steps": []})
        return estimate_memory(cfg, plan(cfg, input_size=1e9, sources=["x.warc.gz"], check_memory=False))[0]

    def task_bytes(**inp) -> int:
        return estimate(**inp).bytes

    for name in EXTRACTORS:
        base = task_bytes(extractor=name, max_record_bytes=1 << 20, max_html_tags=10_000)
        # per byte of the limit: the page's extraction, and the document the page before it made
        # (held downstream meanwhile) with the reader's window
        per_byte = EXTRACTION_BYTES_PER_BYTE[name] + DOCUMENT_BYTES_PER_BYTE + 1.2
        grown = task_bytes(extractor=name, max_record_bytes=9 << 20, max_html_tags=10_000) - base
        assert abs(grown - per_byte * (8 << 20)) <= 2
        more_tags = task_bytes(extractor=name, max_record_bytes=1 << 20, max_html_tags=90_000) - base
        assert more_tags == TREE_BYTES_PER_TAG[name] * 80_000
        # the tags are no part of the largest record's share: a lower record limit does not shrink them
        e = estimate(extractor=name, max_record_bytes=1 << 20, max_html_tags=90_000)
        assert abs(e.record_bytes - per_byte * (1 << 20)) <= 2
    wet = from_dict({"input": {"paths": ["x.warc.wet.gz"]}, "steps": []})
    wet_stage = plan(wet, input_size=1e9, sources=["x"], check_memory=False)[0]
    wet_bytes = estimate_memory(wet, [wet_stage])[0].bytes
    # at the defaults the WARC reader takes the WET reader's place in a task, its page's extraction
    # the largest of what the stage's steps need for one document: ~0.3 GB with resiliparse,
    # ~0.75 GB with trafilatura (8 MiB pages, 100,000 tags)
    work = Workload(documents=1, text_bytes=1, tasks=1, max_document_bytes=MAX_RECORD_BYTES)
    wet_reader, wet_document = wet_stage.pipeline[0], max(s.document_bytes(work) for s in wet_stage.pipeline)
    for name in EXTRACTORS:
        warc = WarcReader([], extractor=name)
        held = warc.memory_bytes(work) - wet_reader.memory_bytes(work)
        assert task_bytes(extractor=name) - wet_bytes == held + warc.document_bytes(work) - wet_document
    readers = {name: WarcReader([], extractor=name) for name in EXTRACTORS}
    readers = {name: r.memory_bytes(work) + r.document_bytes(work) for name, r in readers.items()}
    assert 0.25e9 < readers["resiliparse"] < 0.32e9 and 0.7e9 < readers["trafilatura"] < 0.8e9
    cfg = {"input": {"paths": ["x.warc.gz"], "format": "warc", "extractor": "trafilatura"}, "steps": []}
    cfg["executor"] = {"type": "local", "memory_gb_per_task": 0.5}
    with pytest.raises(ConfigError, match=r"01_curate.*executor.memory_gb_per_task"):
        plan(from_dict(cfg), input_size=1e9, sources=["x.warc.gz"])


@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_a_page_at_both_limits_peaks_below_the_estimate(tmp_path, extractor):
    """A child process (its own peak RSS, VmHWM) reads a page of prose near max_record_bytes and
    a page of tags at max_html_tags; what it reaches over its imports stays under what the reader
    declares: what it holds (`memory_bytes`) and what reading a page needs (`document_bytes`)."""
    limit, tags = 2 << 20, 20_000
    article = "<article><h1>Report</h1>" + "".join(f"<p>{EN} {RU} {ZH} {i}</p>" for i in range(20)) + "</article>"
    head = "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Report</title></head><body><main>"
    prose = head + article * ((limit - 4096) // len(article.encode())) + "</main></body></html>"
    dense = "<html><body><main>" + "<p>word " * (tags - 10) + "</main></body></html>"
    assert limit - 16384 < len(prose.encode()) < limit and start_tags(prose) < tags
    assert tags - 10 <= start_tags(dense) <= tags
    path = write_warc(tmp_path, [ok("http://a/prose", prose.encode()), ok("http://a/dense", dense.encode())])
    script = textwrap.dedent(
        f"""
        import re
        def peak():
            return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        from gristmill.input.warc import iter_warc_documents
        base = peak()
        events = list(iter_warc_documents({str(path)!r}, extractor={extractor!r}, max_record_bytes={limit},
                                          max_html_tags={tags}))
        print(base, peak(), *(len(e.text) for e in events if hasattr(e, "text")))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True).stdout
    base, peak, *kept = map(int, out.split())
    assert len(kept) == 2 and min(kept) > 90_000  # both pages read and kept
    reader = WarcReader([], extractor=extractor, max_record_bytes=limit, max_html_tags=tags)
    work = Workload(documents=1, text_bytes=limit, tasks=1, max_document_bytes=limit)
    estimate = reader.memory_bytes(work) + reader.document_bytes(work)
    print(f"{extractor}: {(peak - base) / 2**20:.0f} MiB over the imports, estimate {estimate / 2**20:.0f} MiB")
    assert peak - base <= estimate


# --- configuration and Common Crawl by crawl name ------------------------------------------------


def test_config_keys(tmp_path):
    cfg = from_dict({"input": {"paths": ["x.warc.gz"], "format": "warc", "extractor": "trafilatura"}, "steps": []})
    assert (cfg.input.format, cfg.input.extractor) == ("warc", "trafilatura")
    assert from_dict({"input": {"paths": ["x"]}, "steps": []}).input.format == "wet"
    with pytest.raises(ConfigError, match=r"input.*extractor: trafilatura.*needs `format: warc`"):
        from_dict({"input": {"paths": ["x"], "extractor": "trafilatura"}, "steps": []})
    with pytest.raises(ConfigError, match=r"input.extractor"):
        from_dict({"input": {"paths": ["x"], "format": "warc", "extractor": "jusText"}, "steps": []})
    with pytest.raises(ConfigError, match=r"input.format"):
        from_dict({"input": {"paths": ["x"], "format": "arc"}, "steps": []})
    assert cfg.input.max_html_tags == MAX_HTML_TAGS == 100_000
    with pytest.raises(ConfigError, match=r"max_html_tags: 5000.*needs `format: warc`"):
        from_dict({"input": {"paths": ["x"], "max_html_tags": 5000}, "steps": []})
    with pytest.raises(ConfigError, match=r"input.max_html_tags"):
        from_dict({"input": {"paths": ["x"], "format": "warc", "max_html_tags": 0}, "steps": []})


WARC_REL = f"crawl-data/{CRAWL}/segments/1596439737319.74/warc/CC-MAIN-20200808165417-20200808195417-00395.warc.gz"


@pytest.fixture
def warc_mirror(server, sample):
    """The mirror of the Common Crawl tests, with CC-MAIN-2020-34's warc.paths.gz and WARC file."""
    path = server.root / WARC_REL
    path.parent.mkdir(parents=True)
    path.write_bytes(sample.read_bytes())
    wet = WARC_REL.replace("/warc/", "/wet/").replace(".warc.gz", ".warc.wet.gz")
    (server.root / f"crawl-data/{CRAWL}/warc.paths.gz").write_bytes(gzip.compress(f"{WARC_REL}\n".encode()))
    (server.root / f"crawl-data/{CRAWL}/wet.paths.gz").write_bytes(gzip.compress(f"{wet}\n".encode()))
    return server


@pytest.mark.network
@pytest.mark.parametrize("cache", ["none", "keep"])
def test_commoncrawl_by_crawl_name_reads_warc_paths(warc_mirror, fetcher, tmp_path, lid_model, cache):
    """WARC files of a crawl by name, streamed (`cache: none`, the default) or downloaded and kept."""
    srv = warc_mirror
    assert list_wet_paths(srv.base, CRAWL, files=1, fetcher=fetcher, kind="warc") == [f"{srv.base}/{WARC_REL}"]
    assert list_wet_paths(srv.base, CRAWL, files=1, fetcher=fetcher)[0].endswith(".warc.wet.gz")
    cfg = {
        "run_dir": str(tmp_path / "cc"),
        "executor": {"type": "local", "tasks": 2, "workers": 1},
        "input": {
            "format": "warc",
            "extractor": "trafilatura",
            "commoncrawl": {
                "crawl": CRAWL,
                "files": 1,
                "base_url": srv.base,
                "cache": cache,
                "cache_dir": str(tmp_path / "run-cache"),
            },
        },
        "steps": [{"langid": {"model": str(lid_model), "languages": None, "min_score": 0.0}}],
    }
    srv.requests.clear()
    merged = run(from_dict(cfg))
    reader = funnel(merged)[0]
    assert (reader.step, reader.docs_out, reader.drops) == (
        "read_warc",
        15,
        {"empty_text": 1, "skipped_request": 17, "skipped_metadata": 16},
    )
    assert [r for r in srv.requests if r[0].endswith("warc.paths.gz")] and not [
        r for r in srv.requests if r[0].endswith("wet.paths.gz")
    ]
    assert (tmp_path / "run-cache" / WARC_REL).is_file() == (cache == "keep")
    table = pq.read_table(tmp_path / "cc" / "01_curate" / "output")
    assert set(table.column("source").to_pylist()) == {f"{srv.base}/{WARC_REL}"}
    assert table.num_rows == 15


@pytest.mark.network
def test_warc_listing_refuses_wet_paths(warc_mirror, fetcher):
    srv = warc_mirror
    listing = srv.root / f"crawl-data/{CRAWL}/warc.paths.gz"
    listing.write_bytes(gzip.compress(WARC_REL.replace(".warc.gz", ".warc.wet.gz").encode()))
    with pytest.raises(ValueError, match=r"not a WARC paths listing: line 1 is .*expected crawl-data/\.\.\.warc\.gz"):
        list_wet_paths(srv.base, CRAWL, files=1, fetcher=fetcher, kind="warc")
