"""Reading Common Crawl WARC files: the text of each HTML response, extracted by resiliparse or
trafilatura, as the `read_warc` step (`input: {format: warc}`).

The WARC container is read by the WET reader's code (`wet_reader.iter_records`): gzip members,
damage, record framing and `max_record_bytes` work exactly as for WET files, offsets included, so
(source, offset of the response record) orders documents for dedup as it does for WET. This
module turns one record at a time into events (`WarcConverter`), in the reader's own task:

- Only `response` records are read; request, metadata, revisit, resource... records are
  counted as `skipped_<type>`, as the WET reader counts records that are not conversions.
- The payload is an HTTP message. No status line and header block: `malformed_http_header`. A status
  other than 2xx: `skipped_http_status`. A body that is not HTML: `skipped_non_html`. The type is
  Common Crawl's `WARC-Identified-Payload-Type` (detected from the bytes) when the record has
  one, else the HTTP `Content-Type`, else the body's first bytes (`<!doctype html`, `<html`, ...).
- Transfer and content encodings. Common Crawl stores bodies as received after undoing both,
  renaming the headers (`X-Crawler-Transfer-Encoding`, `X-Crawler-Content-Encoding`), so its
  records need nothing. Other writers (wget, warcprox, browsertrix) store the bytes on the wire:
  `Transfer-Encoding: chunked` is de-chunked and `Content-Encoding` gzip, deflate or br is
  inflated, never past `max_record_bytes` (a gzip bomb stops there: `record_too_large`). A body
  that is plainly not in the encoding its header names (no gzip magic, or no such stream, and it
  starts with `<`) was stored decoded under the original header, and is used as it is. A body
  cut short (a truncated record) keeps what its chunks and stream gave. Chunks that do not
  parse: `malformed_chunked_encoding`; a stream that does not inflate or an encoding we do not know:
  `malformed_content_encoding`.
- Charset, in this order: a byte-order mark (it decides); the HTTP `Content-Type` charset; a
  `<meta charset>` or `<meta http-equiv=Content-Type>` in the first 4,096 bytes; uchardet's
  detection (resiliparse `detect_encoding`). Labels are read as browsers read them (WHATWG:
  iso-8859-1 and ascii are windows-1252, gb2312 is GBK, decoded as its superset GB18030, ...).
  The first declared charset that decodes the whole body without error wins (a multi-byte
  character cut by a truncated payload at the very end is dropped), else detection's; if even
  that does not decode cleanly, the bytes it cannot decode become U+FFFD and the record is
  kept, flagged `undecodable_bytes`.
- Markup. A page with more start tags than `max_html_tags` is `too_many_tags` (lost): an
  extractor's tree costs memory per element, not per byte (up to 630 bytes a tag with
  resiliparse, 2,150 with trafilatura: up to 78 and 294 per byte of a page of tags against 18
  and 45 for prose), and time worse than linear in them.
  A page of more than `DEPTH_CHECK_TAGS` start tags whose elements nest deeper than `MAX_DEPTH`
  is `too_deep` (lost): resiliparse's main-content pass takes time quadratic in the depth
  (20,000 nested `<div>`s: 9 CPU seconds), and Chrome's HTML parser stops nesting at 512
  levels too.
  An element with more than `MAX_ATTRIBUTES` attributes is `too_many_attributes` (lost): both
  parsers compare each attribute of an element with those before it, so their time is
  quadratic in one element's attributes (16,000 distinct ones: 0.7 s resiliparse, 2.7 s
  trafilatura; 300,000 never finish) while the page stays within both limits above. They are
  counted before parsing, as the HTML standard's tokenizer reads tags, from every `<` that could
  start one (`gristmill.native._html`, linear in the page whatever its markup).
- The extractor's text, stripped; nothing left: `empty_text` (counted, not logged: it is what
  boilerplate removal is for, not damage). An extractor that raises: `extraction_error`. A text
  longer than `max_record_bytes` in UTF-8 (a page in a single-byte charset of Thai or Cyrillic
  letters takes 2-3 bytes a character once decoded) is `record_too_large` (lost), as a WET
  record that long is: every step's memory model counts documents up to that limit.

Memory holds one record at a time: its payload (up to `max_record_bytes`), the decoded body,
the page as a string and the extractor's tree of it, at most `max_html_tags` elements
(`WarcReader.document_bytes`), while the document made of the page before it is downstream
(`WarcReader.memory_bytes`).
"""

from __future__ import annotations

import codecs
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Literal

import brotli
from isal import isal_zlib

from gristmill.core.step import Workload
from gristmill.input.wet import (
    MAX_RECORD_BYTES,
    BadRecord,
    Record,
    SkippedRecord,
    WetEvent,
    WetReader,
    WetRecord,
    _warn,
    iter_records,
)
from gristmill.native._html import most_attributes

Extractor = Literal["resiliparse", "trafilatura"]
EXTRACTORS: tuple[str, ...] = ("resiliparse", "trafilatura")
#: the faster per core: the reader with it reads 12-15x the pages per CPU second that it does
#: with trafilatura, on the real sample and on generated pages (docs/warc.md)
DEFAULT_EXTRACTOR: Extractor = "resiliparse"

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
MAX_HTTP_HEADER = 256 << 10  # an HTTP header block larger than this is not one
META_PRESCAN = 4096  # bytes searched for a <meta> charset (WHATWG says 1024; 2 of the 16 sample pages need more)
#: start tags a page may have (`input.max_html_tags`): the sample's densest page has 3,809 (28 bytes
#: a tag), so a page at Common Crawl's 1 MiB cap needs fewer than 11 bytes a tag to go over
MAX_HTML_TAGS = 100_000
#: elements nested deeper than this make a page `too_deep` (Chrome's parser nests no deeper either)
MAX_DEPTH = 512
#: attributes an element may have: parsers take time quadratic in an element's distinct attributes
#: (lexbor and libxml2 compare each with those before it); the sample's pages have at most 57 (in a
#: scan from a `<` inside a script), and pages of elements of 1,000 attributes up to the 8 MiB
#: record limit take resiliparse ~2.3 and trafilatura ~9 CPU seconds (docs/warc.md#pages-of-tags)
MAX_ATTRIBUTES = 1000
#: pages with more start tags than this have their depth measured (lexbor's tree, walked in Python at
#: ~5 us an element); fewer cannot nest deep enough to cost resiliparse much (4,096: ~0.4 s at worst)
DEPTH_CHECK_TAGS = 4096
#: bytes of an extractor's tree per start tag (its element and text nodes), the most measured on
#: pages of tags (benchmarks/warc_extract_throughput.py --tag-pages; docs/warc.md#pages-of-tags):
#: resiliparse 626, trafilatura 2,149, and ~10% more
TREE_BYTES_PER_TAG = {"resiliparse": 700, "trafilatura": 2400}
#: peak bytes of reading one page per byte of it: its payload, body, string, the extractor's
#: tree and text, the document made of it. Measured on pages of prose of 2-30 MB (docs/warc.md
#: #memory): resiliparse 17.4-17.7, trafilatura 40.6-44.6 (most for prose, which it keeps)
EXTRACTION_BYTES_PER_BYTE = {"resiliparse": 18, "trafilatura": 46}
#: the extractor's modules once imported and first called (measured: resiliparse 7 MB,
#: trafilatura with lxml 54 MB)
EXTRACTOR_MODULE_BYTES = {"resiliparse": 10 << 20, "trafilatura": 60 << 20}
#: characters of a text encoded at a time to measure its UTF-8 (`utf8_size`)
_SIZE_PIECE = 1 << 20
SNIFF = 1024  # bytes of a body without a declared type looked at for HTML
DETECT_SAMPLE = 128 << 10  # bytes uchardet sees: half from each end of a larger body (resiliparse's default)
_META_CHARSET = re.compile(rb"<meta[^>]{0,512}?charset\s*=\s*[\"']?\s*([A-Za-z0-9_.:-]{1,40})", re.I)
_CT_CHARSET = re.compile(r"charset\s*=\s*[\"']?\s*([A-Za-z0-9_.:-]{1,40})", re.I)
_HTML_START = re.compile(rb"\s*(<!--.*?-->\s*)*<(!doctype\s+html|html|head|body|title|meta)\b", re.I | re.S)
_CHUNK_SIZE = re.compile(rb"[ \t]*([0-9A-Fa-f]{1,16})[ \t]*(;[^\r\n]*)?\r?\n")
#: WHATWG decodes these labels with a superset of the codec Python has under the same name
_SUPERSET = {"gbk": "gb18030", "gb2312": "gb18030", "big5": "big5hkscs", "shift_jis": "cp932", "euc_kr": "cp949"}
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


class _BodyError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def http_head(payload: bytes | bytearray) -> tuple[int, dict[str, str], int] | None:
    """(status, header fields with lower-cased names, where the body starts) of an HTTP response
    message, or None if it has no status line and header block (CRLF or bare LF line ends)."""
    if not payload.startswith(b"HTTP/"):
        return None
    end, sep = payload.find(b"\r\n\r\n", 0, MAX_HTTP_HEADER), 4
    lf = payload.find(b"\n\n", 0, MAX_HTTP_HEADER if end < 0 else end)
    if lf >= 0:
        end, sep = lf, 2
    if end < 0:
        return None
    lines = bytes(payload[:end]).decode("latin-1").split("\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers.setdefault(name.strip().lower(), value.strip())
    return int(parts[1]), headers, end + sep


def _mime(value: str | None) -> str | None:
    """`text/html` of `text/html; charset=utf-8`; None for a missing or empty value."""
    if not value:
        return None
    return value.split(";", 1)[0].strip().lower() or None


def _is_markup(body: bytes | bytearray) -> bool:
    """Whether `body` starts as markup does: then a body whose header names an encoding it is
    plainly not in was stored decoded under the original header."""
    return body[:256].lstrip()[:1] == b"<"


def _inflate(body: bytearray, wbits: int, limit: int, what: str) -> bytearray:
    """`body` inflated (gzip members one after another for wbits 31), never past `limit` bytes."""
    out, data = bytearray(), body
    while data:
        d = isal_zlib.decompressobj(wbits)
        piece = d.decompress(data, limit + 1 - len(out))
        while True:
            out += piece
            if len(out) > limit:
                detail = f"{what} body inflates past {limit} bytes (input.max_record_bytes)"
                raise _BodyError("record_too_large", detail)
            if d.eof or not d.unconsumed_tail:
                break
            piece = d.decompress(d.unconsumed_tail, limit + 1 - len(out))
        if not d.eof:  # the stream is cut short (a truncated record): what it gave is the page
            return out
        data = d.unused_data if wbits == 31 and d.unused_data.startswith(b"\x1f\x8b") else b""
    return out


def _brotli(body: bytearray, limit: int) -> bytearray:
    d, out = brotli.Decompressor(), bytearray()
    piece = d.process(bytes(body), output_buffer_limit=1 << 20)
    while True:
        out += piece
        if len(out) > limit:
            raise _BodyError("record_too_large", f"br body inflates past {limit} bytes (input.max_record_bytes)")
        if d.is_finished():
            return out
        if d.can_accept_more_data():  # cut short, as `_inflate` takes it
            return out
        piece = d.process(b"", output_buffer_limit=1 << 20)


#: what ends a chunked body (the last chunk, no trailers): a chunk that claims to run past the
#: body's end while the body ends so was a lie, not a record cut short
_LAST_CHUNKS = (b"\r\n0\r\n\r\n", b"\n0\n\n")


def dechunk(body: bytearray, limit: int = MAX_RECORD_BYTES) -> bytearray:
    """The body of `Transfer-Encoding: chunked`; a body cut short (a truncated record) keeps its
    whole chunks and the start of the last one. A chunk larger than `limit`, or one running past
    the end of a body that ends with the last chunk, is `malformed_chunked_encoding`: its size
    is a lie, and taking it would make the framing after it text."""
    out, pos = bytearray(), 0
    while pos < len(body):
        m = _CHUNK_SIZE.match(body, pos)
        if m is None:
            raise _BodyError("malformed_chunked_encoding", f"no chunk size line at body byte {pos}")
        size, pos = int(m.group(1), 16), m.end()
        if size == 0:  # the last chunk; trailers follow
            return out
        if size > limit:
            detail = f"a chunk of {size:,} bytes at body byte {m.start()}, over {limit:,} (input.max_record_bytes)"
            raise _BodyError("malformed_chunked_encoding", detail)
        if pos + size > len(body) and body.endswith(_LAST_CHUNKS):
            detail = f"a chunk of {size:,} bytes at body byte {m.start()} runs past the body's last chunk"
            raise _BodyError("malformed_chunked_encoding", detail)
        out += body[pos : pos + size]
        pos += size
        if body.startswith(b"\r\n", pos):
            pos += 2
        elif body.startswith(b"\n", pos):
            pos += 1
    return out


def decode_body(payload: bytearray, start: int, headers: dict[str, str], limit: int) -> bytearray:
    """The HTTP body of `payload` (which it consumes) with its transfer and content encodings undone."""
    del payload[:start]  # in place: a bytearray drops its head without copying the rest
    body = payload
    if "chunked" in headers.get("transfer-encoding", "").lower():
        if _CHUNK_SIZE.match(body):
            body = dechunk(body, limit)
        elif not _is_markup(body):
            raise _BodyError("malformed_chunked_encoding", "no chunk size line at body byte 0")
    for coding in reversed([c.strip() for c in headers.get("content-encoding", "").lower().split(",") if c.strip()]):
        if coding in ("identity", "none"):
            continue
        try:
            if coding in ("gzip", "x-gzip"):
                if not body.startswith(b"\x1f\x8b") and _is_markup(body):
                    continue  # stored decoded under the original header
                body = _inflate(body, 31, limit, coding)
            elif coding == "deflate":  # zlib-wrapped as the RFC says, or raw as some servers send it
                wrapped = len(body) >= 2 and (body[0] & 0x0F) == 8 and (body[0] << 8 | body[1]) % 31 == 0
                body = _inflate(body, 15 if wrapped else -15, limit, coding)
            elif coding == "br":
                body = _brotli(body, limit)
            else:
                raise _BodyError("malformed_content_encoding", f"Content-Encoding {coding!r} is not supported")
        except (isal_zlib.error, zlib.error, brotli.error) as e:
            if _is_markup(body):
                continue
            raise _BodyError("malformed_content_encoding", f"{coding} body does not decode ({e})") from None
    return body


def _codec(label: str | None, from_meta: bool = False) -> str | None:
    """The Python codec browsers would decode `label` with; None for a label they do not know."""
    from resiliparse.parse.encoding import map_encoding_to_html5

    if not label:
        return None
    name = map_encoding_to_html5(label.strip().strip("\"'"), fallback_utf8=False)
    if not name:
        return None
    if from_meta and name.startswith("utf-16"):  # a meta tag readable as ASCII is not UTF-16 (WHATWG)
        name = "utf-8"
    name = _SUPERSET.get(name, name)
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def _strict(body: bytes | bytearray, codec: str) -> str | None:
    try:
        return str(body, codec)
    except UnicodeDecodeError as e:
        if e.reason != "unexpected end of data" or len(body) - e.start > 3:
            return None
        with memoryview(body) as m, m[: e.start] as head:  # a character cut where the payload was cut
            try:
                return str(head, codec)
            except UnicodeDecodeError:
                return None


def decode_html(body: bytes | bytearray, content_type: str | None) -> tuple[str, str, int]:
    """(text, codec, replacement characters) of an HTML body; see the module docstring for the order."""
    for bom, codec in _BOMS:
        if body.startswith(bom):
            return _lenient(body, codec)
    header = _CT_CHARSET.search(content_type or "")
    meta = _META_CHARSET.search(body, 0, META_PRESCAN)
    declared = [_codec(header and header.group(1)), _codec(meta and meta.group(1).decode("ascii"), from_meta=True)]
    for codec in dict.fromkeys(c for c in declared if c):
        text = _strict(body, codec)
        if text is not None:
            return text, codec, 0
    # no declared charset fits (or none is declared): uchardet's, which weighs the bytes, and if
    # even that does not decode cleanly it is still the best guess (a count of replacements is
    # not: GB18030 decodes almost any bytes without one)
    codec = _codec(_detect(body)) or "utf-8"
    text = _strict(body, codec)
    return (text, codec, 0) if text is not None else _lenient(body, codec)


def _lenient(body: bytes | bytearray, codec: str) -> tuple[str, str, int]:
    text = str(body, codec, errors="replace")
    return text, codec, text.count("\ufffd")


def _detect(body: bytes | bytearray) -> str:
    from resiliparse.parse.encoding import detect_encoding

    half = DETECT_SAMPLE // 2
    sample = bytes(body) if len(body) <= DETECT_SAMPLE else bytes(body[:half]) + bytes(body[-half:])
    return detect_encoding(sample, max_len=0)


def _is_html_start(body: bytes | bytearray) -> bool:
    head = bytes(body[:SNIFF])
    for bom, _ in _BOMS:
        head = head.removeprefix(bom)
    return _HTML_START.match(head) is not None


def load_extractor(name: str) -> Callable[[str], str]:
    """The extraction function of `name`: HTML as a string in, plain text out."""
    if name == "resiliparse":
        from resiliparse.extract.html2text import extract_plain_text

        # main_content: resiliparse's boilerplate heuristics (navigation, footers, sidebars out);
        # preserve_formatting (its default) keeps paragraphs and list items on their own lines;
        # no alt texts: on the sample they were image file names and captions of logos
        # (trafilatura leaves images out too)
        return lambda html: extract_plain_text(html, main_content=True, alt_texts=False)
    if name == "trafilatura":
        import trafilatura

        # FineWeb's settings (favor_precision, no comments) but deduplicate=False: trafilatura's
        # deduplication counts text segments in one cache per process, so a page's text would
        # depend on the pages the same task read before it, and change with the number of tasks
        return lambda html: (
            trafilatura.extract(html, favor_precision=True, include_comments=False, deduplicate=False) or ""
        )
    raise ValueError(f"unknown extractor {name!r}; one of {', '.join(EXTRACTORS)}")


class WarcConverter:
    """Turns one WARC record into events: a WetRecord of the page's extracted text, or why not."""

    def __init__(
        self,
        extractor: str = DEFAULT_EXTRACTOR,
        max_record_bytes: int = MAX_RECORD_BYTES,
        max_html_tags: int = MAX_HTML_TAGS,
        max_attributes: int = MAX_ATTRIBUTES,
    ):
        self.extract = load_extractor(extractor)
        self.limit = max_record_bytes
        self.max_tags = max_html_tags
        self.max_attributes = max_attributes

    def __call__(self, rec: Record) -> list[WetEvent]:
        fields, source, off = rec.fields, rec.source, rec.offset
        rtype, rid = fields["warc-type"], fields["warc-record-id"]
        if rtype != "response":
            return [SkippedRecord(rtype, source, off)]
        head = http_head(rec.payload)
        if head is None:
            detail = f"{rid}: no HTTP status line and header block"
            return [_warn(BadRecord("malformed_http_header", source, off, detail))]
        status, headers, start = head
        if not 200 <= status < 300:
            return [SkippedRecord("http_status", source, off)]
        mime = _mime(fields.get("warc-identified-payload-type")) or _mime(headers.get("content-type"))
        if mime is not None and mime not in HTML_TYPES:
            return [SkippedRecord("non_html", source, off)]
        try:
            body = decode_body(rec.payload, start, headers, self.limit)
        except _BodyError as e:
            return [_warn(BadRecord(e.reason, source, off, f"{rid}: {e}"))]
        rec.payload = bytearray()  # the body is all that is needed now (an inflated one is another object)
        if mime is None and not _is_html_start(body):
            return [SkippedRecord("non_html", source, off)]
        html, codec, replaced = decode_html(body, headers.get("content-type"))
        del body
        # one count of "<" (~15 us a page) clears nearly every page; the exact count costs more
        # (a two-character search) and is made only for pages with more "<" than a limit
        tags = start_tags(html) if html.count("<") > min(self.max_tags, DEPTH_CHECK_TAGS) else 0
        if tags > self.max_tags:
            detail = f"{rid}: {tags:,} start tags, over the limit of {self.max_tags:,} (input.max_html_tags)"
            return [_warn(BadRecord("too_many_tags", source, off, detail))]
        # every page (~4 counts of "<"): one tag is enough to take a parser minutes
        attributes, at = most_attributes(html, self.max_attributes)
        if attributes > self.max_attributes:
            detail = f"{rid}: an element with over {self.max_attributes:,} attributes (its tag at character {at:,})"
            return [_warn(BadRecord("too_many_attributes", source, off, detail))]
        if tags > DEPTH_CHECK_TAGS and dom_depth(html) > MAX_DEPTH:
            detail = f"{rid}: elements nested more than {MAX_DEPTH} deep ({tags:,} start tags)"
            return [_warn(BadRecord("too_deep", source, off, detail))]
        try:
            # U+FEFF is no text: byte-order marks of pages pasted together (PHP includes) stay in them
            text = self.extract(html).replace("\ufeff", "").strip()
        except Exception as e:  # noqa: BLE001 - one page the extractor chokes on must not end a task
            return [_warn(BadRecord("extraction_error", source, off, f"{rid}: {type(e).__name__}: {e}"))]
        del html
        if not text:
            return [BadRecord("empty_text", source, off, rid)]
        # a character is 1-4 bytes of UTF-8: only a text of over a quarter of the limit in
        # characters can be over it in bytes (decoded from a single-byte charset, 2-3x the body)
        if 4 * len(text) > self.limit and (size := utf8_size(text)) > self.limit:
            detail = f"{rid}: {size} bytes of text extracted, over the limit of {self.limit} (input.max_record_bytes)"
            return [_warn(BadRecord("record_too_large", source, off, detail))]
        events: list[WetEvent] = []
        if replaced:
            detail = f"{rid}: {replaced} characters replaced (decoded as {codec})"
            events.append(_warn(BadRecord("undecodable_bytes", source, off, detail)))
        record = WetRecord(
            record_id=rid,
            url=fields.get("warc-target-uri"),
            date=fields.get("warc-date"),
            crawl=rec.crawl,
            cc_language=None,  # WARC responses have none: langid labels the text
            text=text,
            source=source,
            offset=off,
            type="response",
        )
        return [*events, record]


def utf8_size(text: str) -> int:
    """Bytes of `text` in UTF-8, encoded `_SIZE_PIECE` characters at a time (no copy of a long
    text)."""
    if text.isascii():
        return len(text)
    return sum(len(text[i : i + _SIZE_PIECE].encode("utf-8")) for i in range(0, len(text), _SIZE_PIECE))


def dom_depth(html: str, stop: int = MAX_DEPTH) -> int:
    """How deep the elements of `html` nest as a browser builds them (lexbor, resiliparse's
    parser: linear time), walked without recursion; the walk ends once deeper than `stop`."""
    from resiliparse.parse.html import HTMLTree

    node, depth, deepest = HTMLTree.parse(html).document, 0, 0
    while node is not None:
        child = node.first_child
        if child is not None:
            node, depth = child, depth + 1
            if depth > deepest:
                deepest = depth
                if deepest > stop:
                    return deepest
            continue
        while node is not None and node.next is None:
            node, depth = node.parent, depth - 1
        node = node.next if node is not None else None
    return deepest


def start_tags(html: str) -> int:
    """An upper bound of the nodes with markup a parser makes of `html` (elements, comments): its
    `<` not followed by `/` (a `<` in a script or in text counts too). Two counts, no tokenizing."""
    return html.count("<") - html.count("</")


def iter_warc_documents(
    path_or_fileobj,
    source_name: str | None = None,
    max_record_bytes: int = MAX_RECORD_BYTES,
    extractor: str = DEFAULT_EXTRACTOR,
    max_html_tags: int = MAX_HTML_TAGS,
    max_attributes: int = MAX_ATTRIBUTES,
) -> Iterator[WetEvent]:
    """Yield, in file order, a WetRecord per HTML response with text, a SkippedRecord per record
    that is no page, and a BadRecord per problem (the WET reader's, and this module's)."""
    convert = WarcConverter(extractor, max_record_bytes, max_html_tags, max_attributes)
    return iter_records(path_or_fileobj, convert, source_name, max_record_bytes)


class WarcReader(WetReader):
    """Yields one datatrove Document per HTML response of this task's share of WARC files."""

    step_name = "read_warc"

    def __init__(
        self,
        sources: list[str],
        resolve: Callable[[str], str] | None = None,
        limit: int = -1,
        step_id: str | None = None,
        max_record_bytes: int = MAX_RECORD_BYTES,
        extractor: str = DEFAULT_EXTRACTOR,
        max_html_tags: int = MAX_HTML_TAGS,
        stream_bytes: int = 0,
        max_html_attributes: int = MAX_ATTRIBUTES,
    ):
        super().__init__(
            sources,
            resolve=resolve,
            limit=limit,
            step_id=step_id,
            max_record_bytes=max_record_bytes,
            stream_bytes=stream_bytes,
        )
        if extractor not in EXTRACTORS:
            raise ValueError(f"unknown extractor {extractor!r}; one of {', '.join(EXTRACTORS)}")
        self.extractor = extractor
        self.max_html_tags = max_html_tags
        self.max_html_attributes = max_html_attributes

    def memory_bytes(self, work: Workload) -> int:
        """Held throughout: what the WET reader holds while a document is downstream (the
        record's bytes in its window, the document: an extracted text is at most
        `max_record_bytes` of UTF-8, see `WarcConverter`), and the extractor's modules."""
        return super().memory_bytes(work) + EXTRACTOR_MODULE_BYTES[self.extractor]

    def document_bytes(self, work: Workload) -> int:
        """While one page is read: its payload, body, string, the extractor's tree and text and
        the document made of it, `EXTRACTION_BYTES_PER_BYTE` per byte of a page as long as the
        largest (`work.max_document_bytes`, this reader's `max_record_bytes`); plus the tree's
        elements, at most `max_html_tags` of them (`TREE_BYTES_PER_TAG`: a page of tags costs
        more per byte than one of prose), which the record limit does not bound."""
        per_byte = EXTRACTION_BYTES_PER_BYTE[self.extractor] * work.max_document_bytes
        return int(per_byte) + TREE_BYTES_PER_TAG[self.extractor] * self.max_html_tags

    def _events(self, path, source: str) -> Iterator[WetEvent]:
        return iter_warc_documents(
            path, source, self.max_record_bytes, self.extractor, self.max_html_tags, self.max_html_attributes
        )
