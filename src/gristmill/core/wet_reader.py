"""Reading Common Crawl WET files: a damage-tolerant record iterator and the `read_wet` step.

Common Crawl writes every WARC record as its own gzip member, so we decompress member by member
(isal, ~3x zlib) from a file streamed in 1 MiB chunks: memory is bounded by one member, not the
file, and a damaged member costs only its own record. After damage we resynchronise on the next
gzip magic. Every problem is yielded as a `BadRecord` (and logged) rather than raised or dropped,
so a run's stats account for every record; datatrove's WarcReader is not used because it
silently drops records and runs libmagic on each one.

Content-Length policy: a record's extent is decided by its container, not trusted blindly. The
declared length is accepted when the payload it delimits is followed by the `\\r\\n\\r\\n`
record separator and then the end of the member (or the next `WARC/` record). Otherwise the
record is reported as `bad_content_length` and is KEPT, with its payload running to the next
`\\r\\n\\r\\nWARC/` separator or to the end of the member (minus the trailing separator). So a
too-small or too-large declared length loses no text, and a too-short payload keeps what is there.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass

from datatrove.data import Document, DocumentsPipeline
from isal import isal_zlib
from loguru import logger

from gristmill.core.step import Step

CHUNK = 1 << 20
FEED = 16 << 10
GZIP_MAGIC = b"\x1f\x8b\x08"
SEP = b"\r\n\r\n"
NEXT_RECORD = b"\r\n\r\nWARC/"
META = ("url", "date", "crawl", "cc_language", "source", "offset")  # Document.metadata keys
MAX_HEADER = 1 << 20  # a header block bigger than this is garbage, not a header


@dataclass
class WetRecord:
    record_id: str
    url: str | None
    date: str | None
    crawl: str | None
    cc_language: str | None
    text: str
    source: str
    offset: int  # of the record's gzip member (of the record itself in an uncompressed file)
    type: str = "conversion"


@dataclass
class BadRecord:
    reason: str  # gzip_error, truncated_member, bad_content_length, bad_warc_header, ...
    source: str
    offset: int
    detail: str = ""


@dataclass
class SkippedRecord:
    """A well-formed record of a type we do not turn into documents (request, response, ...)."""

    type: str
    source: str
    offset: int


WetEvent = WetRecord | BadRecord | SkippedRecord


class _Buf:
    """Bytes with a read position; refills from `f` on demand (f=None: a complete member)."""

    def __init__(self, data: bytes, f=None, base: int = 0):
        self.data, self.pos, self.f, self.base = data, 0, f, base

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def _more(self) -> bool:
        chunk = self.f.read(CHUNK) if self.f is not None else b""
        if not chunk:
            self.f = None
            return False
        # drop consumed bytes so memory holds only the current record
        self.data, self.base, self.pos = self.data[self.pos :] + chunk, self.base + self.pos, 0
        return True

    def ensure(self, n: int) -> bool:
        while len(self.data) - self.pos < n:
            if not self._more():
                return False
        return True

    def find(self, sub: bytes, limit: int | None = None) -> int:
        """Index of `sub` relative to pos, reading more as needed; -1 if absent."""
        start = 0
        while True:
            j = self.data.find(sub, self.pos + start)
            if j >= 0:
                return j - self.pos
            start = max(0, len(self.data) - self.pos - len(sub) + 1)
            if (limit is not None and start > limit) or not self._more():
                return -1

    def take_rest(self) -> bytes:  # callers have already read to EOF (a failed find)
        return self.take(len(self.data))

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out


def _split_records(b: _Buf) -> Iterator[tuple[int, bytes | None, bytes, bool]]:
    """Yield (offset, header block or None if unparseable, payload, content_length_ok)."""
    while True:
        while b.ensure(1) and b.data[b.pos] in b"\r\n":  # stray blank lines between records
            b.pos += 1
        if not b.ensure(1):
            return
        off = b.offset
        h = b.find(SEP, MAX_HEADER) if b.ensure(5) and b.data.startswith(b"WARC/", b.pos) else -1
        if h < 0:  # not a record start: skip to the next one (or the end)
            n = b.find(b"\r\nWARC/")
            b.take(n + 2) if n >= 0 else b.take_rest()
            yield off, None, b"", False
            continue
        header = b.take(h)
        b.take(len(SEP))
        declared = _content_length(header)
        if declared is not None and b.ensure(declared + len(SEP)):
            b.ensure(declared + len(SEP) + 5)  # peek at what follows; may move b.pos, so first
            end = b.pos + declared
            after = b.data[end + len(SEP) : end + len(SEP) + 5]
            at_end = after.startswith(b"WARC/") or not after.strip(b"\r\n")
            if b.data[end : end + len(SEP)] == SEP and at_end:
                payload = b.take(declared)
                b.take(len(SEP))
                yield off, header, payload, True
                continue
        n = b.find(NEXT_RECORD)
        if n >= 0:
            payload = b.take(n)
            b.take(len(SEP))
        else:
            payload = b.take_rest()
            payload = payload[: -len(SEP)] if payload.endswith(SEP) else payload
        yield off, header, payload, False


def _content_length(header: bytes) -> int | None:
    i = header.lower().find(b"\r\ncontent-length:")
    if i < 0:
        return None
    value = header[i + 17 :].split(b"\r\n", 1)[0].strip()
    return int(value) if value.isdigit() else None


def _parse_header(header: bytes) -> dict[str, str]:
    fields = {}
    for line in header.decode("utf-8", errors="replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return fields


def _gzip_members(f, first: bytes, source: str) -> Iterator[tuple[int, bytes] | BadRecord]:
    """Yield (offset, decompressed member) per intact member, BadRecord per damaged region.

    A damaged region (a member that fails, plus any false gzip magic found while resyncing)
    is reported once, when the next good member or the end of file is reached.
    """
    b = _Buf(first, f)
    damaged: BadRecord | None = None
    while b.ensure(1):
        if not (b.ensure(len(GZIP_MAGIC)) and b.data.startswith(GZIP_MAGIC, b.pos)):
            damaged = damaged or BadRecord("garbage", source, b.offset, "bytes between gzip members")
            i = b.find(GZIP_MAGIC)
            b.take(i) if i >= 0 else b.take_rest()
            continue
        start, fed, out, error = b.offset, 0, [], None
        d = isal_zlib.decompressobj(31)
        try:
            while True:
                if not b.ensure(fed + 1):
                    error = BadRecord("truncated_member", source, start, "file ends inside a gzip member")
                    break
                # feed small slices: on member end the decoder copies what is left of its input
                # into unused_data, and with 1 MiB inputs that copy costs more than inflating
                at = b.pos + fed
                piece = memoryview(b.data)[at : at + FEED]
                fed += len(piece)
                out.append(d.decompress(piece))
                if d.eof:
                    break
        except isal_zlib.error as e:
            error = BadRecord("gzip_error", source, start, str(e))
        if error is None:
            b.take(fed - len(d.unused_data))
            if damaged is not None:
                yield _close_damage(damaged, start)
                damaged = None
            yield start, b"".join(out)
        else:
            # retry from the byte after this member's magic: the decoder may have run past the
            # member's real end, so searching from where it failed could skip intact members
            damaged = damaged or error
            b.take(1)
    if damaged is not None:
        yield _close_damage(damaged, b.offset)


def _close_damage(bad: BadRecord, end: int) -> BadRecord:
    bad.detail += f"; {end - bad.offset} bytes skipped"
    return bad


def iter_wet_records(path_or_fileobj, source_name: str | None = None) -> Iterator[WetEvent]:
    """Yield, in file order, a WetRecord per conversion record and a BadRecord per problem.

    Raises OSError only if the file cannot be opened/read; damage inside it is yielded.
    """
    if isinstance(path_or_fileobj, (str, os.PathLike)):
        source = source_name or os.fspath(path_or_fileobj)
        with open(path_or_fileobj, "rb") as f:
            yield from _iter_file(f, source)
    else:
        source = source_name or str(getattr(path_or_fileobj, "name", "<stream>"))
        yield from _iter_file(path_or_fileobj, source)


def _iter_file(f: io.BufferedIOBase, source: str) -> Iterator[WetEvent]:
    first = f.read(CHUNK)
    while 0 < len(first) < 5 and (more := f.read(CHUNK)):  # enough to tell gzip from WARC/
        first += more
    if not first:
        yield _warn(BadRecord("empty_file", source, 0))
        return
    if first.startswith(GZIP_MAGIC):
        units = _gzip_members(f, first, source)
    elif first.startswith(b"WARC/"):  # an uncompressed WARC: one stream, offsets per record
        units = iter([(-1, _Buf(first, f))])
    else:
        yield _warn(BadRecord("not_gzip", source, 0, f"starts with {first[:8]!r}"))
        return
    crawl = None
    for unit in units:
        if isinstance(unit, BadRecord):
            yield _warn(unit)
            continue
        member_off, data = unit
        b = data if isinstance(data, _Buf) else _Buf(data)
        for rec_off, header, payload, length_ok in _split_records(b):
            off = rec_off if member_off < 0 else member_off
            if header is None:
                yield _warn(BadRecord("bad_warc_header", source, off, "no WARC/ header block"))
                continue
            fields = _parse_header(header)
            rtype, rid = fields.get("warc-type"), fields.get("warc-record-id")
            if not rtype or not rid:
                yield _warn(BadRecord("bad_warc_header", source, off, "missing WARC-Type or WARC-Record-ID"))
                continue
            if not length_ok:
                detail = f"{rid}: declared {fields.get('content-length')}, found {len(payload)} bytes"
                yield _warn(BadRecord("bad_content_length", source, off, detail))
            if rtype == "warcinfo":
                for line in payload.decode("utf-8", errors="replace").splitlines():
                    if line.startswith("isPartOf:"):
                        crawl = line[9:].strip() or None
                continue
            if rtype != "conversion":
                yield SkippedRecord(rtype, source, off)
                continue
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError as e:
                # keep the record: a few bad bytes do not make the rest of the text useless
                text = payload.decode("utf-8", errors="replace")
                yield _warn(BadRecord("invalid_utf8", source, off, f"{rid}: {e.reason} at {e.start}"))
            yield WetRecord(
                record_id=rid,
                url=fields.get("warc-target-uri"),
                date=fields.get("warc-date"),
                crawl=crawl,
                cc_language=fields.get("warc-identified-content-language"),
                text=text,
                source=source,
                offset=off,
            )


def _warn(bad: BadRecord) -> BadRecord:
    logger.warning(f"{bad.source} @ byte {bad.offset}: {bad.reason} {bad.detail}".rstrip())
    return bad


class WetReader(Step):
    """Yields one datatrove Document per WET conversion record of this task's share of sources."""

    type = "📖 READER"
    step_name = "read_wet"

    def __init__(
        self,
        sources: list[str],
        resolve: Callable[[str], str] | None = None,
        limit: int = -1,
        step_id: str | None = None,
    ):
        super().__init__(step_id=step_id)
        self.sources = list(sources)
        self.resolve = resolve
        self.limit = limit

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if data:
            yield from data
        n_docs = 0
        for source in self.sources[rank::world_size]:
            if 0 <= self.limit <= n_docs:
                break
            try:
                path = self.resolve(source) if self.resolve else source
                with closing(iter_wet_records(path, source_name=source)) as events:
                    for doc in self._documents(events):
                        yield doc
                        n_docs += 1
                        if 0 <= self.limit <= n_docs:
                            break
            except OSError as e:
                # one missing or unreadable file must not kill a task over hundreds of files
                logger.warning(f"{source}: unreadable ({e}); going on with the next file")
                self.stat_update("bad_unreadable_file")

    def _documents(self, events: Iterator[WetEvent]) -> DocumentsPipeline:
        opened = False
        while True:
            # time only the reading, not the downstream steps that consume our yields
            with self.track_time():
                event = next(events, None)
            if not opened:  # the first next() opened the file (or raised OSError)
                opened = True
                self.stat_update("files")
            if event is None:
                return
            if isinstance(event, BadRecord):
                self.stat_update(f"bad_{event.reason}")
            elif isinstance(event, SkippedRecord):
                self.stat_update(f"skipped_{event.type}")
            else:
                self.stat_update("documents")
                self.stat_update("bytes", value=len(event.text.encode("utf-8")))
                meta = {k: getattr(event, k) for k in META}
                yield Document(text=event.text, id=event.record_id, metadata=meta)
