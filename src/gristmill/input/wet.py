"""Reading Common Crawl WET files: a damage-tolerant record iterator and the `read_wet` step.

Common Crawl writes every WARC record as its own gzip member; other tools gzip a whole WARC as
one member, and a WARC may come uncompressed. All three are read the same way: the file is
inflated member by member (isal, ~3x zlib) in small slices, and records are cut from the
decompressed bytes through a window that drops what it has passed. Memory is bounded by one
record, never by a member or the file; a record longer than `max_record_bytes` is not held at
all: it is passed over as it streams by and reported as `record_too_large`. Every problem is
yielded as a `BadRecord` (and logged) rather than raised or dropped, so a run's stats account
for every record; datatrove's WarcReader is not used because it silently drops records and runs
libmagic on each one.

Offsets. A record's `offset` is its byte offset in the file's *decompressed* WARC stream (the
contents of its gzip members one after the other; the file itself when uncompressed). It does
not depend on how the file was gzipped, so (source, offset) identifies a document for dedup.
A damaged member counts only up to the end of its last complete record, and bytes between
members count nothing. A `BadRecord` about a record (wrong_content_length, malformed_warc_header,
invalid_utf8, record_too_large) carries that record's stream offset; one about the gzip
container (gzip_error, truncated_member, garbage) carries the byte offset in the file itself,
where the damage is.

Damage. A damaged member costs the record it is in: the record in progress is dropped and we
resynchronise on the next gzip magic, retrying from the byte after the failed member's magic
(the decoder may have run past the member's real end) as long as that byte is still within the
last `RETAIN` bytes read. The damaged region is reported once, when the next good member ends
or the file does.

Content-Length policy: a record's extent is decided by its container, not trusted blindly. The
declared length is accepted when the payload it delimits is followed by the `\\r\\n\\r\\n`
record separator and then the end of the member (or the next `WARC/` record). Otherwise the
record is reported as `wrong_content_length` and is KEPT, with its payload running to the next
`\\r\\n\\r\\nWARC/` separator or to the end of the member (minus the trailing separator). So a
too-small or too-large declared length loses no text, and a too-short payload keeps what is there.
The size limit applies to the extent so found, whatever the header declares: a record that
declares a small length (or none) and runs on for a gigabyte is still too large.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass

from datatrove.data import Document, DocumentsPipeline
from isal import isal_zlib
from loguru import logger

from gristmill.core import storage
from gristmill.core.documents import text_bytes
from gristmill.core.messages import printable
from gristmill.core.step import DOCUMENT_BYTES_PER_BYTE, Step, Workload

CHUNK = 1 << 20  # bytes read from the file at a time
FEED = 16 << 10  # compressed bytes per decompress call
OUT = 1 << 20  # at most this many decompressed bytes per call: a gzip bomb arrives in slices
RETAIN = 4 << 20  # compressed bytes kept behind the read position, to resync after damage
MAX_RECORD_BYTES = 8 << 20  # default limit on a record's payload (input.max_record_bytes)
GZIP_MAGIC = b"\x1f\x8b\x08"
SEP = b"\r\n\r\n"
NEXT_RECORD = b"\r\n\r\nWARC/"
META = ("url", "date", "crawl", "cc_language", "source", "offset")  # Document.metadata keys
MAX_HEADER = 1 << 20  # a header block bigger than this is garbage, not a header
#: problems reported about a record that is still read as a document (not lost: not a drop)
KEPT_REASONS = frozenset({"wrong_content_length", "invalid_utf8", "undecodable_bytes"})


@dataclass
class WetRecord:
    record_id: str
    url: str | None
    date: str | None
    crawl: str | None
    cc_language: str | None
    text: str
    source: str
    offset: int  # of the record in the decompressed WARC stream (see the module docstring)
    type: str = "conversion"


@dataclass
class BadRecord:
    reason: str  # gzip_error, truncated_member, wrong_content_length, record_too_large, ...
    source: str
    offset: int  # in the decompressed stream for a record, in the file for gzip damage
    detail: str = ""


@dataclass
class SkippedRecord:
    """A well-formed record of a type we do not turn into documents (request, response, ...)."""

    type: str
    source: str
    offset: int


WetEvent = WetRecord | BadRecord | SkippedRecord


@dataclass
class Record:
    """A well-formed WARC record other than warcinfo, as `_iter_file` found it: what a format's
    `convert` turns into events (`wet_events` here, HTML extraction in `warc_reader`)."""

    fields: dict[str, str]  # WARC header fields, names lower-cased; warc-type and warc-record-id present
    payload: bytearray
    source: str
    offset: int
    crawl: str | None  # isPartOf of the file's warcinfo record


#: a record's events; a list, not a generator, so that the payload is freed before they are yielded
Convert = Callable[[Record], list[WetEvent]]


class _Buf:
    """A window on a byte stream: the bytes from `pos` on, refilled from `read()` on demand.

    Consumed bytes are dropped as the window refills (all but the last `retain`), so memory
    holds what the caller is looking at, not what it has passed.
    """

    def __init__(self, read: Callable[[], bytes], first: bytes = b"", base: int = 0, retain: int = 0):
        self.read, self.data, self.pos, self.base, self.retain = read, bytearray(first), 0, base, retain
        self.eof = False
        self.mark = base  # stream offset where the record in progress began

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def _more(self) -> bool:
        if self.eof:
            return False
        chunk = self.read()
        if not chunk:
            self.eof = True
            return False
        drop = self.pos - self.retain
        if drop > 0:  # O(1) on a bytearray: CPython moves its start
            del self.data[:drop]
            self.base, self.pos = self.base + drop, self.pos - drop
        self.data += chunk
        return True

    def ensure(self, n: int) -> bool:
        while len(self.data) - self.pos < n:
            if not self._more():
                return False
        return True

    def find(self, sub: bytes, limit: int | None = None) -> int:
        """Index of `sub` relative to pos, reading more as needed; -1 if absent (within ~limit)."""
        start = 0
        while True:
            j = self.data.find(sub, self.pos + start)
            if j >= 0:
                return j - self.pos
            start = max(0, len(self.data) - self.pos - len(sub) + 1)
            if (limit is not None and start > limit) or not self._more():
                return -1

    def skip_to(self, sub: bytes) -> int:
        """Pass over the bytes before the next `sub` (or to the end), holding none; how many."""
        n = 0
        while True:
            j = self.data.find(sub, self.pos)
            if j >= 0:
                n, self.pos = n + j - self.pos, j
                return n
            keep = max(self.pos, len(self.data) - len(sub) + 1)
            n, self.pos = n + keep - self.pos, keep
            if not self._more():
                n, self.pos = n + len(self.data) - self.pos, len(self.data)
                return n

    def take(self, n: int) -> bytearray:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    def take_rest(self) -> bytearray:  # callers have already read to the end (a failed find)
        return self.take(len(self.data))

    def seek(self, offset: int) -> None:
        """Back to `offset`, or to the oldest byte still held if that was dropped."""
        self.pos = max(0, offset - self.base)


def _split_records(b: _Buf, limit: int) -> Iterator[tuple[int, bytes | None, bytearray | None, bool, int]]:
    """Yield (offset, header block or None if unparseable, payload or None if over `limit`,
    content_length_ok, payload size)."""
    while True:
        b.mark = b.base + b.pos
        while b.ensure(1) and b.data[b.pos] in b"\r\n":  # stray blank lines between records
            b.pos += 1
        if not b.ensure(1):
            return
        off = b.offset
        h = b.find(SEP, MAX_HEADER) if b.ensure(5) and b.data.startswith(b"WARC/", b.pos) else -1
        if h < 0:  # not a record start: skip to the next one (or the end)
            b.skip_to(b"\r\nWARC/")
            b.take(2)
            yield off, None, None, False, 0
            continue
        header = bytes(b.take(h))
        b.take(len(SEP))
        declared = _content_length(header)
        if declared is not None and declared <= limit and b.ensure(declared + len(SEP)):
            b.ensure(declared + len(SEP) + 5)  # peek at what follows; may move b.pos, so first
            end = b.pos + declared
            after = b.data[end + len(SEP) : end + len(SEP) + 5]
            at_end = after.startswith(b"WARC/") or not after.strip(b"\r\n")
            if b.data[end : end + len(SEP)] == SEP and at_end:
                payload = b.take(declared)
                b.take(len(SEP))
                yield off, header, payload, True, declared
                continue
        n = b.find(NEXT_RECORD, limit)
        if 0 <= n <= limit:
            payload = b.take(n)
            b.take(len(SEP))
        elif n < 0 and b.eof and len(b.data) - b.pos <= limit + len(SEP):
            payload = b.take_rest()
            payload = payload[: -len(SEP)] if payload.endswith(SEP) else payload
        else:  # over the limit, whatever the header said: stream past it
            size = b.skip_to(NEXT_RECORD)
            if b.ensure(len(SEP)):
                b.take(len(SEP))
            elif b.data.endswith(SEP):  # the member's (or file's) final separator
                size -= len(SEP)
            yield off, header, None, False, size
            continue
        yield off, header, payload, False, len(payload)


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


class _Token:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


_END = _Token("END")  # the member ended intact (CRC and length checked)
_ABORT = _Token("ABORT")  # the member is damaged: what it gave since its last record is void


class _Damaged(Exception):
    pass


def _gzip_stream(f, first: bytes, source: str) -> Iterator[bytes | _Token | BadRecord]:
    """Decompressed pieces of each member, then _END or _ABORT; a BadRecord per damaged region.

    A damaged region (a member that fails, plus any false gzip magic found while resyncing)
    is reported once, when the next good member or the end of file is reached.
    """
    b = _Buf(lambda: f.read(CHUNK), first, retain=RETAIN)
    damaged: BadRecord | None = None
    while b.ensure(1):
        if not (b.ensure(len(GZIP_MAGIC)) and b.data.startswith(GZIP_MAGIC, b.pos)):
            damaged = damaged or BadRecord("garbage", source, b.offset, "bytes between gzip members")
            b.skip_to(GZIP_MAGIC)
            continue
        start, error = b.offset, None
        d = isal_zlib.decompressobj(31)
        try:
            while not d.eof:
                if d.unconsumed_tail:
                    out = d.decompress(d.unconsumed_tail, OUT)
                elif b.ensure(FEED) or b.pos < len(b.data):
                    # small slices: on member end the decoder copies what is left of its input
                    # into unused_data, and with 1 MiB inputs that copy costs more than inflating;
                    # a view, not a copy, released before the window may resize
                    with memoryview(b.data) as m, m[b.pos : b.pos + FEED] as piece:
                        out = d.decompress(piece, OUT)
                        b.pos += len(piece)
                else:
                    error = BadRecord("truncated_member", source, start, "file ends inside a gzip member")
                    break
                if out:
                    yield out
        except isal_zlib.error as e:
            error = BadRecord("gzip_error", source, start, str(e))
        if error is None:
            b.pos -= len(d.unused_data)  # still held: it came from the last slice
            if damaged is not None:
                yield _close_damage(damaged, start)
                damaged = None
            yield _END
        else:
            # retry from the byte after this member's magic: the decoder may have run past the
            # member's real end, so searching from where it failed could skip intact members
            yield _ABORT
            damaged = damaged or error
            b.seek(start + 1)
    if damaged is not None:
        yield _close_damage(damaged, b.offset)


def _plain_stream(f, first: bytes) -> Iterator[bytes | _Token]:
    yield first
    while chunk := f.read(CHUNK):
        yield chunk
    yield _END


def _close_damage(bad: BadRecord, end: int) -> BadRecord:
    bad.detail += f"; {end - bad.offset} bytes skipped"
    return bad


class _Members:
    """The token stream seen one member at a time: `read()` gives the current member's next
    piece, b"" at its end, raises _Damaged if it fails; damage reports wait in `reports`."""

    def __init__(self, tokens: Iterator[bytes | _Token | BadRecord]):
        self.tokens, self.reports, self.done = tokens, [], False

    def read(self) -> bytes:
        for t in self.tokens:
            if t.__class__ is bytes:
                return t
            if t is _END:
                return b""
            if t is _ABORT:
                raise _Damaged
            self.reports.append(t)
        self.done = True
        return b""

    def drain(self) -> Iterator[BadRecord]:
        while self.reports:
            yield _warn(self.reports.pop(0))


def iter_wet_records(
    path_or_fileobj, source_name: str | None = None, max_record_bytes: int = MAX_RECORD_BYTES
) -> Iterator[WetEvent]:
    """Yield, in file order, a WetRecord per conversion record and a BadRecord per problem.

    Raises OSError only if the file cannot be opened/read; damage inside it is yielded.
    """
    return iter_records(path_or_fileobj, wet_events, source_name, max_record_bytes)


def iter_records(
    path_or_fileobj, convert: Convert, source_name: str | None = None, max_record_bytes: int = MAX_RECORD_BYTES
) -> Iterator[WetEvent]:
    """Yield, in file order, the events `convert` makes of each record, and a BadRecord per problem
    of the file or of a record's WARC framing (the damage policy above, whatever the format)."""
    if isinstance(path_or_fileobj, str) and storage.is_url(path_or_fileobj):  # gs://, hf://: streamed by fsspec
        with storage.open_input(path_or_fileobj) as f:
            yield from _iter_file(f, source_name or path_or_fileobj, max_record_bytes, convert)
    elif isinstance(path_or_fileobj, (str, os.PathLike)):
        source = source_name or os.fspath(path_or_fileobj)
        with open(path_or_fileobj, "rb") as f:
            yield from _iter_file(f, source, max_record_bytes, convert)
    else:
        source = source_name or str(getattr(path_or_fileobj, "name", "<stream>"))
        yield from _iter_file(path_or_fileobj, source, max_record_bytes, convert)


def _iter_file(f: io.BufferedIOBase, source: str, limit: int, convert: Convert) -> Iterator[WetEvent]:
    first = f.read(CHUNK)
    while 0 < len(first) < 5 and (more := f.read(CHUNK)):  # enough to tell gzip from WARC/
        first += more
    if not first:
        yield _warn(BadRecord("empty_file", source, 0))
        return
    if first.startswith(GZIP_MAGIC):
        members = _Members(_gzip_stream(f, first, source))
    elif first.startswith(b"WARC/"):  # an uncompressed WARC: one stream, one "member"
        members = _Members(_plain_stream(f, first))
    else:
        # what it holds is nobody's business: a glob may have reached /etc/shadow
        detail = "does not start with a gzip header (1f 8b 08) or WARC/: not a WET or WARC file"
        yield _warn(BadRecord("not_gzip", source, 0, detail))
        return
    pos, crawl = 0, None  # pos: where the next member starts in the decompressed stream
    while not members.done:
        b = _Buf(members.read, base=pos)
        try:
            for off, header, payload, length_ok, size in _split_records(b, limit):
                if members.reports:
                    yield from members.drain()
                if header is None:
                    yield _warn(BadRecord("malformed_warc_header", source, off, "no WARC/ header block"))
                    continue
                fields = _parse_header(header)
                rtype, rid = fields.get("warc-type"), fields.get("warc-record-id")
                if payload is None:
                    detail = f"{rid}: {size} bytes, over the limit of {limit} (input.max_record_bytes)"
                    yield _warn(BadRecord("record_too_large", source, off, detail))
                    continue
                if not rtype or not rid:
                    yield _warn(BadRecord("malformed_warc_header", source, off, "missing WARC-Type or WARC-Record-ID"))
                    continue
                if not length_ok:
                    detail = f"{rid}: declared {fields.get('content-length')}, found {size} bytes"
                    yield _warn(BadRecord("wrong_content_length", source, off, detail))
                if rtype == "warcinfo":
                    for line in payload.decode("utf-8", errors="replace").splitlines():
                        if line.startswith("isPartOf:"):
                            crawl = line[9:].strip() or None
                    continue
                events = convert(Record(fields, payload, source, off, crawl))
                del payload
                yield from events
        except _Damaged:  # the member's record in progress is lost; its bytes do not count
            pos = b.mark
        else:
            pos = b.offset
        yield from members.drain()


def wet_events(rec: Record) -> list[WetEvent]:
    """A conversion record's text (UTF-8) as a WetRecord; a record of another type is skipped."""
    fields, rid, events = rec.fields, rec.fields["warc-record-id"], []
    if fields["warc-type"] != "conversion":
        return [SkippedRecord(fields["warc-type"], rec.source, rec.offset)]
    try:
        text = rec.payload.decode("utf-8")
    except UnicodeDecodeError as e:
        # keep the record: a few bad bytes do not make the rest of the text useless
        text = rec.payload.decode("utf-8", errors="replace")
        events.append(_warn(BadRecord("invalid_utf8", rec.source, rec.offset, f"{rid}: {e.reason} at {e.start}")))
    events.append(
        WetRecord(
            record_id=rid,
            url=fields.get("warc-target-uri"),
            date=fields.get("warc-date"),
            crawl=rec.crawl,
            cc_language=fields.get("warc-identified-content-language"),
            text=text,
            source=rec.source,
            offset=rec.offset,
        )
    )
    return events


def _warn(bad: BadRecord) -> BadRecord:
    where = "file byte" if bad.reason in ("gzip_error", "truncated_member", "garbage") else "byte"
    logger.warning(printable(f"{bad.source} @ {where} {bad.offset}: {bad.reason} {bad.detail}".rstrip()))
    return bad


class WetReader(Step):
    """Yields one datatrove Document per WET conversion record of this task's share of sources."""

    type = "📖 READER"
    step_name = "read_wet"

    def __init__(
        self,
        sources: list[str],
        #: source -> a path to read, or a binary stream (closed after use; see `_opened`)
        resolve: Callable[[str], str | os.PathLike | io.RawIOBase] | None = None,
        limit: int = -1,
        step_id: str | None = None,
        max_record_bytes: int = MAX_RECORD_BYTES,
        stream_bytes: int = 0,
    ):
        super().__init__(step_id=step_id)
        self.sources = list(sources)
        self.resolve = resolve
        self.limit = limit
        self.max_record_bytes = max_record_bytes
        #: what `resolve`'s streams hold when the files are read over the network (the planner
        #: sets it from `input.stream.stream_memory_bytes`): one read and the client
        self.stream_bytes = stream_bytes

    def memory_bytes(self, work: Workload) -> int:
        """Held while a document is downstream: the record's bytes, still in the sliding buffer
        (~1.2x `max_record_bytes`, the buffer grown to hold it), and the document decoded from
        it, as Python holds it (`DOCUMENT_BYTES_PER_BYTE`); and a stream's read and client when
        the files are streamed (`stream_bytes`). (`work.max_document_bytes` is this reader's
        `max_record_bytes`: the planner sets both from `input.max_record_bytes`.)"""
        return int((DOCUMENT_BYTES_PER_BYTE + 1.2) * work.max_document_bytes) + self.stream_bytes

    #: while a record is read: the payload cut from the buffer and the text's UTF-8 for the
    #: `bytes` stat (measured with the document it makes: 20, 68 and 246 MB over 2, 8 and 30 MB
    #: records)
    document_factor = 2.0
    document_fixed = 8 << 20

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if data:
            yield from data
        n_docs = 0
        for source in self.sources[rank::world_size]:
            if 0 <= self.limit <= n_docs:
                break
            try:
                path = self.resolve(source) if self.resolve else source
                with self._opened(path), closing(self._events(path, source)) as events:
                    for doc in self._documents(events):
                        yield doc
                        n_docs += 1
                        if 0 <= self.limit <= n_docs:
                            break
            except OSError as e:
                # one missing or unreadable file must not kill a task over hundreds of files
                logger.warning(printable(f"{source}: unreadable ({e}); going on with the next file"))
                self.stat_update("bad_unreadable_file")

    def _events(self, path, source: str) -> Iterator[WetEvent]:
        """The events of one file (opened on the first next(): an OSError is raised there)."""
        return iter_wet_records(path, source_name=source, max_record_bytes=self.max_record_bytes)

    @contextmanager
    def _opened(self, path):
        """`resolve` may hand back a stream it opened (a remote file read without a local copy):
        closed here when the file is done, its `counters` (bytes downloaded, retries, ...) added
        to this step's stats."""
        try:
            yield
        finally:
            if hasattr(path, "read"):
                path.close()
                for label, value in sorted(getattr(path, "counters", {}).items()):
                    if value:
                        self.stat_update(label, value=value)

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
                self.stat_update("bytes", value=text_bytes(event.text))
                meta = {k: getattr(event, k) for k in META}
                doc = Document(text=event.text, id=event.record_id, metadata=meta)
                # the document holds the text alone: a step that rewrites it (c4_lines) frees
                # the old one, not a copy kept here for the length of the document's visit
                event.text = ""
                yield doc
