"""Finding and fetching Common Crawl WET files: the crawl's path listing, streams, a download cache.

A base URL is Common Crawl's HTTP front (`https://data.commoncrawl.org`), its S3 bucket
(`s3://commoncrawl`), or a local directory (or `file://` URL) laid out the same way, so a
mirror on shared disk needs no download step at all. With `cache: none` (`Fetcher.open`) a
task streams each remote file (`cc_stream.RemoteStream`: inflated as it arrives, resumed with a
Range request after a lost connection, nothing written to disk); with `cache: keep` remote files
land in a cache directory that mirrors the URL path, as follows.

Downloads go to `<name>.part` and are renamed into place only once they check out: the length
the server announced, and for a `.gz` name a whole gzip file (magic, every member inflating
with a good CRC, the last one complete, nothing after it; a WARC's first record starting
`WARC/`). A proxy or captive portal may answer 200 with an HTML page, and a connection closed
early without a Content-Length looks like a complete body; both are retried, never cached. An
interrupted download resumes from its `.part` with a Range request. An exclusive `flock` on
`<name>.lock` makes concurrent tasks (processes or threads) that want the same file download it
once: the others wait, then find it cached.

A cached `.gz` file is trusted only while its `<name>.ok` marker (size and mtime at the time it
was verified) matches it, so verification costs one pass per file, not one per run; a file
without a matching marker (left by an older version, truncated or replaced since) is verified
again and, if bad, removed and downloaded afresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import http.client
import os
import random
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

from isal import isal_zlib
from loguru import logger

from gristmill.input.deadlines import (
    MAX_OBJECT_BYTES,
    MIN_RATE_BYTES_S,
    RATE_WINDOW_S,
    RateGuard,
    RetryPolicy,
    Sockets,
    cut_after,
    read_deadline,
    recording_opener,
)
from gristmill.input.stream import USER_AGENT, DownloadError, RemoteStream, transport_for
from gristmill.input.stream import retry_after as _retry_after
from gristmill.input.stream import snippet as _snippet

__all__ = ["DownloadError", "Fetcher", "gzip_problem", "list_wet_paths"]

CHUNK = 1 << 20
# Errors that say "the network or the server hiccupped", worth another try. Deliberately not
# bare OSError: a full disk while writing the .part must fail at once, not be retried 8 times.
# Nor a host name that does not resolve (`Fetcher._attempt`): offline, that took two minutes.
_TRANSIENT = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError)
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
GZIP_MAGIC = b"\x1f\x8b"
# Input slice per inflate call: at a member's end the decoder copies the rest of its input into
# unused_data, and WET members are a few KB, so 1 MiB slices would copy far more than they
# inflate (measured on 150 MB of real WET members: 133 MB/s with 16 KiB, 66 MB/s with 1 MiB).
FEED = 16 << 10
# Output cap per inflate call: a gzip bomb (1000:1) must not turn one slice into gigabytes.
MAX_OUT = 4 << 20
#: what a line of `<kind>.paths.gz` names: WET files end .warc.wet.gz, WARC files .warc.gz
_LISTING_LINE = {"wet": re.compile(r"crawl-data/\S+\.wet\.gz"), "warc": re.compile(r"crawl-data/\S+\.warc\.gz")}


class _Retry(Exception):
    """Internal: this attempt failed in a way worth retrying; `wait` is the server's Retry-After;
    `slow`: cut for slowness (its trickle of bytes does not start the count afresh)."""

    def __init__(self, reason: str, wait: float | None = None, slow: bool = False):
        super().__init__(reason)
        self.wait, self.slow = wait, slow


#: a largest listing: a crawl's wet.paths.gz is ~1 MB (90,000 lines); held in memory when streaming
MAX_LISTING_BYTES = 64 << 20


def _is_remote(url: str) -> bool:
    return urllib.parse.urlsplit(str(url)).scheme in ("http", "https", "s3")


def _as_local(path_or_url: str | os.PathLike) -> Path:
    s = str(path_or_url)
    if s.startswith("file://"):
        return Path(urllib.request.url2pathname(urllib.parse.urlsplit(s).path))
    if "://" in s:
        raise ValueError(f"unsupported URL scheme (use http(s)://, s3://, file:// or a directory): {s}")
    return Path(s)


def gzip_problem(path: str | os.PathLike, starts_with: bytes = b"") -> tuple[str, str] | None:
    """None if `path` is one or more complete gzip members and nothing else, else (kind, detail).

    kind is `not_gzip` (detail: the start of the file), `truncated` (a sound prefix that ends
    inside a member: more bytes could complete it), `corrupt`, `trailing` (bytes after the
    last member) or `unexpected` (the first member does not decompress to `starts_with`).
    Streams member by member: memory stays at a few MB whatever the file's size or ratio.
    """
    with open(path, "rb") as f:
        data = f.read(CHUNK)
        if not data.startswith(GZIP_MAGIC):
            return "not_gzip", _snippet(data) if data else ""
        base, i = 0, 0  # file offset of data[0]; position in data
        d, member, head = None, 0, b""
        keep = max(len(starts_with), 48) if starts_with else 0  # enough to show in an error
        while True:
            if d is None:  # between members: the next one must start with the magic
                if len(data) - i < len(GZIP_MAGIC):
                    base, data, i = base + i, data[i:] + f.read(CHUNK), 0
                    if not data:
                        return None
                    if GZIP_MAGIC.startswith(data):  # the file ends one byte into a member
                        return "truncated", f"ends inside the gzip member at byte {base:,}"
                if not data.startswith(GZIP_MAGIC, i):
                    return "trailing", (
                        f"bytes after the last gzip member, from byte {base + i:,}, starting {_snippet(data[i:])}"
                    )
                d, member = isal_zlib.decompressobj(31), base + i
            elif i == len(data):
                base, data, i = base + len(data), f.read(CHUNK), 0
                if not data:
                    return "truncated", f"ends inside the gzip member at byte {member:,}"
            piece = memoryview(data)[i : i + FEED]
            try:
                inp = piece
                while True:
                    out = d.decompress(inp, MAX_OUT)
                    if len(head) < keep:
                        head += out[: keep - len(head)]
                    inp = d.unconsumed_tail
                    if d.eof or (not inp and len(out) < MAX_OUT):
                        break
            except isal_zlib.error as e:
                return "corrupt", f"gzip member at byte {member:,} does not inflate ({e})"
            if d.eof:
                if member == 0 and not head.startswith(starts_with):
                    return "unexpected", f"decompresses to {_snippet(head)}, not {starts_with.decode()!r}..."
                i += len(piece) - len(d.unused_data)
                d = None
            else:
                i += len(piece)


def _wants_gzip(url: str) -> bool:
    return urllib.parse.urlsplit(url).path.endswith(".gz")


def _expected_start(url: str) -> bytes:
    # a gzip-encoded error page passes the gzip checks; a WARC always opens with its version line
    return b"WARC/" if urllib.parse.urlsplit(url).path.endswith((".warc.gz", ".wet.gz", ".wat.gz")) else b""


def _describe(problem: tuple[str, str], size: int, ctype: str | None) -> str:
    kind, detail = problem
    if kind == "not_gzip":
        start = f" starting {detail}" if detail else ""
        return f"got {size:,} bytes{start}" + (f" ({ctype})" if ctype else "") + " instead of gzip"
    return f"got {size:,} bytes" + (f" ({ctype})" if ctype else "") + f" that are not a whole gzip file: {detail}"


def _marker(dest: Path) -> Path:
    return dest.with_name(dest.name + ".ok")


def _stamp(dest: Path) -> str:
    st = dest.stat()
    return f"{st.st_size} {st.st_mtime_ns}\n"


def _is_marked(dest: Path) -> bool:
    try:
        return _marker(dest).read_text() == _stamp(dest)
    except OSError:
        return False


def _mark(dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".ok.tmp")
    tmp.write_text(_stamp(dest))
    os.replace(tmp, _marker(dest))


class Fetcher:
    """Opens a WET URL or path for reading: `open` streams a remote file (`cache="none"`) or
    resolves it to a local file, downloading http(s) and s3 URLs into `cache_dir` (`"keep"`).

    `retries` is the number of further attempts after the first. Waits grow as
    `backoff * 2**n` (capped at `max_backoff`) with jitter, so many tasks throttled together
    by S3 do not all come back in the same second; a server's Retry-After wins (also capped).
    `timeout`: seconds to connect, and without a byte on an open connection. `min_rate` (bytes
    per second of waiting, judged over `rate_window` seconds) and `max_bytes` (of one object)
    bound every transfer, streamed or downloaded (`cc_stream`, "Deadlines"). `read_bytes`: the
    most a stream reads from the network at a time.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike,
        retries: int = 8,
        backoff: float = 1.0,
        max_backoff: float = 60,
        timeout: float = 60,
        cache: str = "keep",
        read_bytes: int = CHUNK,
        min_rate: float = MIN_RATE_BYTES_S,
        rate_window: float = RATE_WINDOW_S,
        max_bytes: int = MAX_OBJECT_BYTES,
    ):
        if cache not in ("none", "keep"):
            raise ValueError(f"cache must be none or keep, got {cache!r}")
        self.cache_dir = Path(cache_dir)
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout
        self.cache = cache
        self.read_bytes = read_bytes
        self.min_rate, self.rate_window, self.max_bytes = min_rate, rate_window, max_bytes
        self._transports: dict = {}  # per URL scheme, made in the process that reads

    def __getstate__(self):  # pickled into each task: no client or socket goes along
        return {**self.__dict__, "_transports": {}}

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            self.retries, self.backoff, self.max_backoff, self.timeout, self.min_rate, self.rate_window, self.max_bytes
        )

    def _transport(self, url: str):
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in self._transports:
            self._transports[scheme] = transport_for(url, self.timeout, read_deadline(self.policy))
        return self._transports[scheme]

    def stream(self, url: str, start: int = 0) -> RemoteStream:
        """The remote file's bytes from `start` on, as they arrive (see `cc_stream`)."""
        return RemoteStream(url, self._transport(url), self.policy, self.read_bytes, start=start)

    def open(self, source: str | os.PathLike) -> Path | RemoteStream:
        """What the WET reader reads for `source`: a stream over a remote file with `cache: none`
        (the reader closes it, and adds its `counters` to its stats), else a local path: the
        file itself, or its verified copy in the cache."""
        if self.cache == "none" and _is_remote(str(source)):
            return self.stream(str(source))
        return self.local_path(source)

    def cache_path(self, url: str) -> Path:
        rel = urllib.parse.unquote(urllib.parse.urlsplit(url).path).lstrip("/")
        if not rel or any(part in ("", ".", "..") for part in rel.split("/")):
            raise ValueError(f"cannot map URL to a cache path: {url}")
        return self.cache_dir / rel

    def local_path(self, url_or_path: str | os.PathLike) -> Path:
        if not _is_remote(str(url_or_path)):
            path = _as_local(url_or_path)
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            return path
        url = str(url_or_path)
        dest = self.cache_path(url)
        if dest.is_file() and (not _wants_gzip(url) or _is_marked(dest)):
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self._locked(dest):
            # another task may have verified or downloaded it while we waited
            if dest.is_file() and _wants_gzip(url) and not _is_marked(dest):
                self._check_cached(url, dest)
            if not dest.is_file():
                self._download(url, dest)
        return dest

    def forget(self, url: str) -> None:
        """Drop a cached file whose content proved wrong, so that the next use fetches it again."""
        dest = self.cache_path(url)
        if dest.parent.is_dir():
            with self._locked(dest):
                dest.unlink(missing_ok=True)
                _marker(dest).unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self, dest: Path):
        # The lock file is left behind: unlinking it would let a waiter lock a stale inode
        # while a newcomer locks a fresh one, and both would download.
        with open(dest.with_name(dest.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _check_cached(self, url: str, dest: Path) -> None:
        """Mark a verified cached file; remove a bad one (older versions cached HTML pages)."""
        problem = gzip_problem(dest, _expected_start(url))
        if problem is None:
            _mark(dest)
            return
        logger.warning(
            f"{dest}: the cached copy of {url} is bad "
            f"({_describe(problem, dest.stat().st_size, None)}); removing it and downloading again"
        )
        _marker(dest).unlink(missing_ok=True)
        dest.unlink()

    def fetch_bytes(self, url_or_path: str | os.PathLike) -> bytes:
        """A small file's bytes (e.g. a paths listing), retried like any download; cached with
        `cache: keep`, held in memory (at most MAX_LISTING_BYTES) with `cache: none`."""
        if self.cache == "keep" or not _is_remote(str(url_or_path)):
            return self.local_path(url_or_path).read_bytes()
        url, data = str(url_or_path), bytearray()
        with self.stream(url) as stream:
            while chunk := stream.read(CHUNK):
                data += chunk
                if len(data) > MAX_LISTING_BYTES:
                    raise DownloadError(f"{url}: larger than {MAX_LISTING_BYTES >> 20} MiB: not a paths listing")
        return bytes(data)

    def _download(self, url: str, dest: Path) -> None:
        if urllib.parse.urlsplit(url).scheme == "s3":
            return self._download_stream(url, dest)
        part = dest.with_name(dest.name + ".part")
        attempt, best = 0, part.stat().st_size if part.exists() else 0
        fresh_at = best + 1
        while True:
            try:
                self._attempt(url, part, dest)
                return
            except _Retry as err:
                size = part.stat().st_size if part.exists() else 0
                if size > best:
                    # New bytes arrived: the connection works, it just drops. Count afresh so
                    # a 100 MB file on a flaky link is not abandoned after 8 short reads; not
                    # for a trickle cut for slowness (a window's worth of bytes is progress)
                    if size >= fresh_at:
                        attempt = 0
                    best = size
                fresh_at = size + (max(1, int(self.min_rate * self.rate_window)) if err.slow else 1)
                attempt += 1
                if attempt > self.retries:
                    raise DownloadError(f"giving up on {url} after {attempt} attempts: {err}") from None
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                if err.wait is not None:
                    wait = min(self.max_backoff, err.wait)
                else:
                    wait = delay * random.uniform(0.5, 1.0)
                logger.warning(
                    f"retrying {url}: {err} (attempt {attempt}/{self.retries}, have {size} bytes), waiting {wait:.2f}s"
                )
                time.sleep(wait)

    def _download_stream(self, url: str, dest: Path) -> None:
        """An s3:// file into the cache: the stream retries and resumes within this call; a
        `.part` left by an earlier run is resumed from its end."""
        part = dest.with_name(dest.name + ".part")
        start = part.stat().st_size if part.exists() else 0
        with self.stream(url, start=start) as stream, open(part, "ab" if start else "wb") as out:
            while chunk := stream.read(CHUNK):
                out.write(chunk)
            length_known = stream.total is not None
        try:
            self._finish(url, part, dest, None, length_known=length_known)
        except _Retry as err:  # the transfer was retried already; what arrived is not the file
            part.unlink(missing_ok=True)
            raise DownloadError(f"{url}: {err}") from None

    def _attempt(self, url: str, part: Path, dest: Path) -> None:
        offset = part.stat().st_size if part.exists() else 0
        headers = {"User-Agent": USER_AGENT}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        sockets = Sockets()
        answer_s = 2 * self.timeout
        resp = failed = None
        with cut_after(answer_s, sockets.shut) as cut:
            try:
                req = urllib.request.Request(url, headers=headers)
                resp = recording_opener(sockets).open(req, timeout=self.timeout)
            except Exception as err:  # noqa: BLE001 - sorted by _open_failed
                failed = err
        if cut.fired:  # the watchdog shut the connection: whatever urllib made of that
            for done in (resp, failed):
                if hasattr(done, "close"):
                    done.close()
            raise _Retry(f"no answer (status and headers) within {answer_s:g} s", slow=True)
        if failed is not None:
            self._open_failed(url, failed, part, dest, offset)
            return
        with resp:
            self._receive(url, resp, part, dest, offset, sockets)

    def _open_failed(self, url: str, err: Exception, part: Path, dest: Path, offset: int) -> None:
        try:
            raise err
        except urllib.error.HTTPError as err:
            self._http_error(url, err, part, dest, offset)
            return
        except urllib.error.URLError as err:
            if isinstance(err.reason, socket.gaierror):
                # the host's name did not resolve: offline, a typo in base_url, no DNS on a
                # compute node. Minutes of retries would not change that; one line now does.
                raise DownloadError(f"{url}: name resolution failed (offline?): {err.reason.strerror}") from None
            raise _Retry(f"{type(err).__name__}: {err}") from None
        except _TRANSIENT as err:
            raise _Retry(f"{type(err).__name__}: {err}") from None

    def _receive(self, url: str, resp, part: Path, dest: Path, offset: int, sockets: Sockets) -> None:
        ctype = resp.headers.get("Content-Type")
        if resp.status == 206:
            m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != offset:
                part.unlink(missing_ok=True)  # a range we did not ask for: start clean
                raise _Retry(f"unexpected Content-Range {resp.headers.get('Content-Range')!r}")
            total = None if m.group(3) == "*" else int(m.group(3))
            mode = "ab"
        else:
            # 200 to a Range request: the server ignores ranges, the body is the whole file.
            length = resp.headers.get("Content-Length")
            total, mode = (int(length) if length else None), "wb"
        if total is not None and total > self.max_bytes:
            raise DownloadError(
                f"{url}: {total:,} bytes announced, more than max_object_bytes ({self.max_bytes:,}); not downloaded"
            )
        start = offset if mode == "ab" else 0
        with open(part, mode) as out:
            self._copy(url, resp, out, start, sockets)
        size = part.stat().st_size
        if total is not None and size != total:
            # http.client may return a short body without raising; the length is the proof.
            raise _Retry(f"short body: have {size} of {total} bytes")
        self._finish(url, part, dest, ctype, length_known=total is not None)

    def _copy(self, url: str, resp, out, start: int, sockets: Sockets) -> None:
        """The body into `out` as it arrives, at the minimum rate, to at most max_bytes."""
        rate, deadline, size = RateGuard(self.min_rate, self.rate_window), read_deadline(self.policy), start
        while True:
            began = time.monotonic()
            failed = None
            with cut_after(deadline, sockets.shut) as cut:
                try:
                    piece = resp.read1(CHUNK)
                except (*_TRANSIENT, ValueError) as err:  # ValueError: a chunk-size line cut short
                    failed, piece = err, b""
            if cut.fired:  # what this read returned stays out: the resume asks for it again
                raise _Retry(f"one read took over {deadline:g} s (bytes trickling in)", slow=True)
            if isinstance(failed, ValueError):
                raise failed
            if failed is not None:
                raise _Retry(f"connection lost mid-body: {type(failed).__name__}: {failed}") from None
            if not piece:
                return
            if size + len(piece) > self.max_bytes:
                raise DownloadError(f"{url}: more than {self.max_bytes:,} bytes and still going: over max_object_bytes")
            out.write(piece)
            size += len(piece)
            if (slow := rate.add(time.monotonic() - began, len(piece))) is not None:
                out.flush()
                raise _Retry(slow, slow=True)

    def _finish(self, url: str, part: Path, dest: Path, ctype: str | None, length_known: bool) -> None:
        """Move a fully received `.part` into the cache if its content is what the name says."""
        if _wants_gzip(url):
            problem = gzip_problem(part, _expected_start(url))
            if problem is not None:
                size = part.stat().st_size
                if problem[0] == "truncated" and not length_known:
                    # a connection closed early, with no length to tell: keep what came, resume
                    raise _Retry(f"short body: {problem[1]} after {size:,} bytes (no Content-Length)")
                part.unlink()  # not a prefix of the file: resuming from it would keep the damage
                raise _Retry(_describe(problem, size, ctype))
        _marker(dest).unlink(missing_ok=True)
        os.replace(part, dest)
        if _wants_gzip(url):
            _mark(dest)

    def _http_error(self, url: str, err: urllib.error.HTTPError, part: Path, dest: Path, offset: int) -> None:
        try:
            body = err.read(4096).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - the body is only a hint; the status decides
            body = ""
        code = re.search(r"<Code>([^<]+)</Code>", body)
        what = f"HTTP {err.code}" + (f" {code.group(1)}" if code else "")
        if err.code == 416 and offset:
            # Range starts at/after the end: the .part may already be the whole file (killed
            # between the last byte and the rename). Keep it only if the sizes agree.
            m = re.search(r"/(\d+)", err.headers.get("Content-Range", ""))
            if m and int(m.group(1)) == offset:
                self._finish(url, part, dest, None, length_known=True)
                return
            part.unlink(missing_ok=True)
            raise _Retry(f"{what}: .part of {offset} bytes does not fit the file; restarting")
        if err.code == 429 or err.code >= 500 or "SlowDown" in body:
            raise _Retry(what, _retry_after(err.headers.get("Retry-After")))
        raise DownloadError(f"{url}: {what}") from None


def _listing_entries(raw: bytes, where: str, kind: str = "wet") -> list[str]:
    """The non-blank lines of a gzipped paths listing, each checked to be a path of a `kind` file."""
    try:
        text = gzip.decompress(raw).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        what = (
            f"starting {_snippet(raw)} instead of gzip"
            if not raw.startswith(GZIP_MAGIC)
            else f"that do not decompress to UTF-8 text ({e})"
        )
        raise ValueError(f"{where}: not a {kind.upper()} paths listing: {len(raw):,} bytes {what}") from None
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    entries = [e for _, e in lines]
    bad = [(n, e) for n, e in lines if not _LISTING_LINE[kind].fullmatch(e) or ".." in e.split("/")]
    if bad or not entries:
        first = f"line {bad[0][0]} is {bad[0][1][:80]!r}" if bad else "it is empty"
        raise ValueError(
            f"{where}: not a {kind.upper()} paths listing: {first}, expected crawl-data/...{kind}.gz"
            + (f" ({len(bad):,} of {len(entries):,} lines are not such paths)" if bad else "")
        )
    return entries


def list_wet_paths(
    base_url: str | os.PathLike,
    crawl: str,
    files: int | None = None,
    paths: list[str] | None = None,
    fetcher: Fetcher | None = None,
    kind: str = "wet",
) -> list[str]:
    """WET files of `crawl` under `base_url`: the first `files` of the listing, the named
    `paths` (in the order given), or all of them. Remote bases give URLs, local bases paths.
    `kind="warc"` lists the crawl's WARC files instead (`warc.paths.gz`).

    `paths` entries are listing entries (`crawl-data/...`), optionally with the base prepended.
    """
    if kind not in _LISTING_LINE:
        raise ValueError(f"kind must be one of {', '.join(_LISTING_LINE)}, got {kind!r}")
    if files is not None and paths is not None:
        raise ValueError("give either files or paths, not both")
    if files is not None and files < 0:
        raise ValueError(f"files must be >= 0, got {files}")
    remote = _is_remote(str(base_url))
    base = str(base_url).rstrip("/") if remote else str(_as_local(base_url)).rstrip("/")
    listing_rel = f"crawl-data/{crawl}/{kind}.paths.gz"
    if remote:
        if fetcher is None:
            raise ValueError(f"a Fetcher (with a cache_dir) is needed to list {base}")
        listing_url = f"{base}/{listing_rel}"
        try:
            entries = _listing_entries(fetcher.fetch_bytes(listing_url), listing_url, kind)
        except ValueError:
            fetcher.forget(listing_url)  # gzip, but not a listing: fetch afresh next time
            raise
    else:
        listing = Path(base) / listing_rel
        if not listing.is_file():
            raise FileNotFoundError(f"no {kind.upper()} listing for crawl {crawl}: {listing}")
        entries = _listing_entries(listing.read_bytes(), str(listing), kind)

    if paths is not None:
        known, chosen, missing = set(entries), [], []
        for p in paths:
            rel = str(p).strip()
            rel = rel[len(base) :] if rel.startswith(base + "/") else rel
            rel = rel.lstrip("/")
            (chosen if rel in known else missing).append(rel)
        if missing:
            raise ValueError(f"not in the {crawl} {kind.upper()} listing ({base}/{listing_rel}): " + ", ".join(missing))
        # A file named twice would be processed twice, i.e. its documents duplicated.
        chosen = list(dict.fromkeys(chosen))
    elif files is not None:
        if files > len(entries):
            logger.warning(f"asked for {files} {kind.upper()} files of {crawl}; the listing has only {len(entries)}")
        chosen = entries[:files]
    else:
        chosen = entries

    if remote:
        return [f"{base}/{rel}" for rel in chosen]
    out = [str(Path(base) / rel) for rel in chosen]
    absent = [p for p in out if not Path(p).is_file()]
    if absent:
        raise FileNotFoundError(
            f"listed but absent from the local mirror: {', '.join(absent[:5])}"
            + (f" (+{len(absent) - 5} more)" if len(absent) > 5 else "")
        )
    return out
