"""Reading a remote file front to back as its bytes arrive: no local copy, bounded memory.

`RemoteStream` is a read-only binary file over an `http(s)://` or `s3://` URL. The WET reader
inflates what it gives as it arrives; nothing is written to disk. Memory is one read of at most
`read_bytes` plus the socket's buffers, whatever the file's size.

Resume. A connection lost mid-body (reset, a read that stalls past `timeout`, a body that ends
short of its Content-Length) is followed by a request for `Range: bytes=<next byte>-`. Its answer
must be a 206 whose Content-Range starts at that byte, for an object of the same length, with the
same ETag and Last-Modified as the first answer (with a strong ETag the request carries
`If-Match`, so a server that checks answers 412): otherwise the object changed between the two
reads, and the stream fails with one line rather than splice two versions. A 200 to a Range
request is the whole object again: the bytes already handed on are read and dropped, never
handed on twice. So every byte of the object reaches the reader exactly once, in order.

Retries. 429, 500, 502, 503, 504 and S3's `SlowDown` (under any status), dropped connections,
stalls, short bodies and, for a `.gz` name, a body that is not gzip (a proxy's HTML page served
with 200) are retried after `backoff * 2**n` seconds (capped at `max_backoff`) times a random
factor in [0.5, 1) so throttled tasks do not come back together; a server's Retry-After wins
(also capped). `retries` is how many further attempts follow a failed one before the stream gives
up; the count starts afresh whenever new bytes arrive (a long file on a link that drops now and
then is not abandoned). A host name that does not resolve fails at once: offline, minutes of
retries would change nothing. Other answers (403, 404, ...) fail at once. Every failure is one
line naming the URL and what came back: the status, S3's error code and the body's first
printable bytes.

Deadlines. `timeout` bounds each socket operation (connect; a read with no byte), which a
server that drips a byte every few seconds never trips. So every transfer also has a minimum
rate: a connection that delivers fewer than `min_rate` bytes per second of waiting on it, judged
over every `rate_window` seconds of waiting (time spent by the reader between reads does not
count: a slow consumer is no slow server), is cut and resumed like a lost one, counted as
`slow`. After a cut for slowness the retry count starts afresh only once a window's worth of
bytes (`min_rate * rate_window`) has arrived, so a drip runs out of retries and fails in one
line. Over http(s) one call may also hang while bytes trickle (a dripped header or chunk-size
line never completes): a request not answered (status and headers) within twice `timeout`, and
one read of the body that takes longer than `rate_window` (and `timeout`), are cut too, by a
watchdog thread that shuts the connection's socket. An object is read to at most `max_bytes`:
an announced length above it, or a body that goes past it (an endless chunked answer), fails at
once in one line, not retried (another attempt would do the same).

Counted (in `counters`, added to the reader's stats): `download_bytes`, `http_requests`,
`http_resumed` (Range requests after a loss), `http_retries` and `http_retries_<why>` where why
is the status (`503`, `429`, ...) or `reset`, `timeout`, `slow`, `short_body`, `bad_answer`,
`connect`; `http_range_ignored` and `http_bytes_dropped` for a server that answered a Range
request with the whole object.

S3 goes through botocore (`get_object` with `Range`/`IfMatch`), with botocore's own retries
turned off (`total_max_attempts: 1`): its standard mode retries `SlowDown` and 5xx silently, so
they would be neither backed off by this policy nor counted. Endpoint, region and credentials
come the standard way (`AWS_ENDPOINT_URL_S3`/`AWS_ENDPOINT_URL`, profiles, instance roles); with
no credentials the requests go unsigned (anonymous). URLs in messages never carry credentials.
"""

from __future__ import annotations

import email.utils
import http.client
import io
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from typing import Any, NamedTuple

from loguru import logger

from gristmill.compat.botocore import read_arrived
from gristmill.core.messages import printable, redact
from gristmill.input.deadlines import (
    RateGuard,
    RetryPolicy,
    Sockets,
    cut_after,
    read_deadline,
    recording_opener,
)

__all__ = ["DownloadError", "HttpTransport", "RemoteStream", "RetryPolicy", "S3Transport", "open_remote"]

USER_AGENT = "gristmill/0.1 (+https://commoncrawl.org/terms-of-use)"
#: statuses that say "busy, try again": throttling and a server or gateway in trouble
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)")
GZIP_MAGIC = b"\x1f\x8b"
# Errors of a connection or a server that hiccupped, worth another try. Not bare OSError: a
# local failure (a full disk in the caller) must not be retried.
_TRANSIENT = (http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError)


class DownloadError(RuntimeError):
    """A remote file that cannot be read: an answer that will not change (4xx other than 429),
    retries run out, a host that does not resolve, or an object that changed while being read."""


class _Retry(Exception):
    """This attempt failed in a way worth retrying: `why` names it in the stats, `wait` is the
    server's Retry-After."""

    def __init__(self, reason: str, why: str, wait: float | None = None):
        super().__init__(reason)
        self.why, self.wait = why, wait


def public_url(url: str) -> str:
    """The URL without user:password@ and with signature and token parameters blanked
    (credentials never reach a log line or a message)."""
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc:
        url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return redact(url)


def retry_after(value: str | None) -> float | None:
    """Retry-After is either delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def snippet(data: bytes) -> str:
    """The start of a body as a short quoted string, whitespace folded, for error messages."""
    text = " ".join(data[:48].decode("utf-8", "replace").split())[:40]
    return repr(text) if text else repr(data[:16])  # all whitespace: show the bytes (repr escapes controls)


def _cause(err: BaseException, kind: type) -> BaseException | None:
    """The first exception of type `kind` in the chain of causes (urllib's `reason`, botocore's
    `error`), or None."""
    seen, stack = set(), [err]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, kind):
            return e
        kwargs = getattr(e, "kwargs", None)
        more = [
            e.__cause__,
            e.__context__,
            getattr(e, "reason", None),
            kwargs.get("error") if isinstance(kwargs, dict) else None,
        ]
        stack += [x for x in more if isinstance(x, BaseException)]
    return None


def _name_unresolved(url: str, gai: BaseException) -> DownloadError:
    # offline, a typo in base_url, no DNS on a compute node: retries would not change that
    why = getattr(gai, "strerror", None) or str(gai)  # the resolver's words, e.g. "Name or service not known"
    return DownloadError(f"{public_url(url)}: name resolution failed (offline?): {why}")


class Answer(NamedTuple):
    """A response to a GET: status, headers (lower-case names) and a body with read(n)/close()."""

    status: int
    headers: dict[str, str]
    body: Any


def _is_throttle(status: int, body: str) -> bool:
    return status in RETRY_STATUS or "SlowDown" in body


class HttpTransport:
    """GETs over http(s) with urllib (proxies from the environment, redirects followed); a
    request not answered within twice `timeout`, or a body read past `read_deadline`, is cut."""

    def __init__(self, timeout: float = 60.0, read_deadline: float | None = None):
        self.timeout = timeout
        self.read_deadline = read_deadline

    def __getstate__(self):
        return {"timeout": self.timeout, "read_deadline": self.read_deadline}

    def get(self, url: str, offset: int, if_match: str | None) -> Answer:
        headers = {"User-Agent": USER_AGENT}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        if if_match:
            headers["If-Match"] = if_match
        sockets = Sockets()
        try:
            with cut_after(2 * self.timeout, sockets.shut) as cut:
                req = urllib.request.Request(url, headers=headers)
                resp = recording_opener(sockets).open(req, timeout=self.timeout)
        except Exception as err:  # noqa: BLE001 - sorted by _failed
            if cut.fired:  # the watchdog shut the connection: whatever urllib made of that
                if isinstance(err, urllib.error.HTTPError):
                    err.close()
                raise _Retry(f"no answer (status and headers) within {2 * self.timeout:g} s", "slow") from None
            return self._failed(url, err)
        if cut.fired:  # answered just as the watchdog shut it: the connection is gone
            resp.close()
            raise _Retry(f"no answer (status and headers) within {2 * self.timeout:g} s", "slow")
        body = _HttpBody(resp, self.timeout, sockets, self.read_deadline)
        return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, body)

    def _failed(self, url: str, err: Exception) -> Answer:
        try:
            raise err
        except urllib.error.HTTPError as err:
            return self._error(url, err)
        except urllib.error.URLError as err:
            if (gai := _cause(err, socket.gaierror)) is not None:
                raise _name_unresolved(url, gai) from None
            why = "timeout" if _cause(err, TimeoutError) is not None else "connect"
            raise _Retry(f"{type(err.reason).__name__}: {err.reason}", why) from None
        except TimeoutError as err:
            raise _Retry(f"no answer within {self.timeout:g} s ({err})", "timeout") from None
        except _TRANSIENT as err:
            raise _Retry(f"{type(err).__name__}: {err}", "reset") from None

    def _error(self, url: str, err: urllib.error.HTTPError) -> Answer:
        try:
            raw = err.read(4096)
        except Exception:  # noqa: BLE001 - the body is only a hint; the status decides
            raw = b""
        finally:
            err.close()
        text = raw.decode("utf-8", "replace")
        code = re.search(r"<Code>([^<]+)</Code>", text)
        message = re.search(r"<Message>([^<]+)</Message>", text)
        what = f"HTTP {err.code}" + (f" {code.group(1)}" if code else "")
        shown = snippet(message.group(1).encode()) if message else (snippet(raw) if raw.strip() and not code else "")
        what += f" {shown}" if shown else ""
        headers = {k.lower(): v for k, v in err.headers.items()} if err.headers else {}
        if err.code == 416 or err.code == 412:
            return Answer(err.code, headers, None)
        if _is_throttle(err.code, text):
            raise _Retry(what, str(err.code), retry_after(headers.get("retry-after")))
        raise DownloadError(f"{public_url(url)}: {what}")


class _HttpBody:
    def __init__(self, resp, timeout: float, sockets: Sockets | None = None, deadline: float | None = None):
        self.resp, self.timeout = resp, timeout
        self.sockets, self.deadline = sockets, deadline

    def read(self, n: int) -> bytes:
        deadline = self.deadline if self.sockets is not None else None
        try:
            with cut_after(deadline, self.sockets.shut if self.sockets else lambda: None) as cut:
                return self._read(n)
        finally:
            if cut.fired:
                raise _Retry(f"one read took over {deadline:g} s (bytes trickling in)", "slow") from None

    def _read(self, n: int) -> bytes:
        try:
            return self.resp.read1(n)  # what has arrived: kept if the connection drops next
        except TimeoutError:
            raise _Retry(f"no byte for {self.timeout:g} s (stalled)", "timeout") from None
        except http.client.IncompleteRead:
            return b""  # the stream compares its position with the length and resumes
        except _TRANSIENT as err:
            raise _Retry(f"connection lost mid-body: {type(err).__name__}: {err}", "reset") from None

    def close(self) -> None:
        try:
            self.resp.close()
        except OSError:
            pass


def split_s3_url(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    key = urllib.parse.unquote(parts.path.lstrip("/"))
    if parts.scheme != "s3" or not parts.netloc or not key:
        raise ValueError(f"not an s3://bucket/key URL: {public_url(url)}")
    return parts.netloc, key


class S3Transport:
    """GETs from S3 (or an S3-protocol server) through botocore, its retries off (see module)."""

    def __init__(self, timeout: float = 60.0):
        self.timeout = timeout
        self._client = None

    def __getstate__(self):  # a task process makes its own client (sockets do not pickle)
        return {"timeout": self.timeout, "_client": None}

    def client(self):
        if self._client is None:
            import botocore.session
            from botocore import UNSIGNED
            from botocore.config import Config

            from gristmill.core import storage

            s3 = storage.settings().s3  # the run config's storage.s3, over botocore's own chain
            session = botocore.session.Session(profile=s3.profile) if s3.profile else botocore.session.get_session()
            signed = not s3.anon and session.get_credentials() is not None
            config = Config(
                retries={"total_max_attempts": 1, "mode": "standard"},  # ours: backed off and counted
                connect_timeout=self.timeout,
                read_timeout=self.timeout,
                signature_version=None if signed else UNSIGNED,
                # the gzip members' own CRCs check the bytes; a whole-object checksum cannot be
                # checked over ranged reads anyway
                response_checksum_validation="when_required",
                request_checksum_calculation="when_required",
                s3={"addressing_style": s3.addressing_style} if s3.addressing_style else None,
            )
            # Common Crawl's bucket is in us-east-1; storage.s3.region, AWS_REGION, a profile's region win
            region = s3.region or session.get_config_variable("region") or "us-east-1"
            self._client = session.create_client("s3", region_name=region, config=config, endpoint_url=s3.endpoint_url)
        return self._client

    def get(self, url: str, offset: int, if_match: str | None) -> Answer:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            ReadTimeoutError,
        )

        bucket, key = split_s3_url(url)
        kwargs = {"Bucket": bucket, "Key": key}
        if offset:
            kwargs["Range"] = f"bytes={offset}-"
        if if_match:
            kwargs["IfMatch"] = if_match
        try:
            r = self.client().get_object(**kwargs)
        except ClientError as err:
            meta = err.response.get("ResponseMetadata", {})
            status = int(meta.get("HTTPStatusCode") or 0)
            headers = meta.get("HTTPHeaders") or {}
            error = err.response.get("Error", {})
            code, message = str(error.get("Code", "")), str(error.get("Message", ""))
            if status in (412, 416):
                return Answer(status, headers, None)
            what = f"HTTP {status}" + (f" {code}" if code and code != str(status) else "")
            what += f" {snippet(message.encode())}" if message.strip() else ""
            if _is_throttle(status, code):
                raise _Retry(what, str(status), retry_after(headers.get("retry-after"))) from None
            raise DownloadError(f"{public_url(url)}: {what}") from None
        except (ConnectTimeoutError, ReadTimeoutError) as err:
            raise _Retry(f"no answer within {self.timeout:g} s ({err})", "timeout") from None
        except EndpointConnectionError as err:
            if (gai := _cause(err, socket.gaierror)) is not None:
                raise _name_unresolved(url, gai) from None
            raise _Retry(str(err), "connect") from None
        except BotoCoreError as err:  # connection closed, a malformed answer, ...
            raise _Retry(f"{type(err).__name__}: {err}", "reset") from None
        meta = r["ResponseMetadata"]
        return Answer(
            int(meta["HTTPStatusCode"]), dict(meta.get("HTTPHeaders") or {}), _S3Body(r["Body"], self.timeout)
        )


class _S3Body:
    def __init__(self, body, timeout: float):
        self.body, self.timeout = body, timeout

    def read(self, n: int) -> bytes:
        from botocore.exceptions import BotoCoreError, IncompleteReadError, ReadTimeoutError
        from urllib3.exceptions import IncompleteRead, ProtocolError
        from urllib3.exceptions import ReadTimeoutError as Urllib3ReadTimeout

        try:
            return read_arrived(self.body, n)
        except (ReadTimeoutError, Urllib3ReadTimeout):
            raise _Retry(f"no byte for {self.timeout:g} s (stalled)", "timeout") from None
        except (IncompleteReadError, IncompleteRead):
            return b""  # the stream compares its position with the length and resumes
        except (BotoCoreError, ProtocolError, *_TRANSIENT) as err:
            if _cause(err, IncompleteRead) is not None or _cause(err, http.client.IncompleteRead) is not None:
                return b""
            raise _Retry(f"connection lost mid-body: {type(err).__name__}: {err}", "reset") from None

    def close(self) -> None:
        try:
            self.body.close()
        except Exception:  # noqa: BLE001 - a broken connection may fail to close; nothing to keep
            pass


def _validators(headers: dict[str, str]) -> tuple[str | None, str | None]:
    return headers.get("etag"), headers.get("last-modified")


class RemoteStream(io.RawIOBase):
    """The bytes of a remote object from `start` on, resumed across lost connections (module)."""

    def __init__(
        self,
        url: str,
        transport: HttpTransport | S3Transport,
        policy: RetryPolicy | None = None,
        read_bytes: int = 1 << 20,
        counters: Counter | None = None,
        start: int = 0,
        expect_gzip: bool | None = None,
    ):
        super().__init__()
        self.url, self.transport = url, transport
        self.policy = policy or RetryPolicy()
        self.read_bytes = read_bytes
        self.counters = counters if counters is not None else Counter()
        self.pos = self._start = start
        self.name = url  # as a file's name: the WET reader names its source by it
        #: bytes of the whole object once an answer said; None while unknown (no Content-Length)
        self.total: int | None = None
        self.validators: tuple[str | None, str | None] | None = None
        self.expect_gzip = urllib.parse.urlsplit(url).path.endswith(".gz") if expect_gzip is None else expect_gzip
        self._body = None
        self._ctype = ""  # the answer's Content-Type, for messages
        self._failures = 0  # failed attempts since bytes last arrived
        self._fresh_at = 0  # the position past which arriving bytes start the count afresh
        self._rate = RateGuard(self.policy.min_rate, self.policy.rate_window)
        self._slow: str | None = None  # the last window was too slow: cut before the next read

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        chunk = self.read(len(b))
        b[: len(chunk)] = chunk
        return len(chunk)

    def read(self, n: int = -1) -> bytes:
        """At most `min(n, read_bytes)` bytes (fewer as they come); b"" at the object's end."""
        want = self.read_bytes if n is None or n < 0 else min(n, self.read_bytes)
        while want:
            if self.total is not None and self.pos >= self.total:
                self._release()
                return b""
            try:
                if self._slow is not None:
                    raise _Retry(self._slow, "slow")
                if self._body is None:
                    self._open()
                    if self.total is not None and self.pos >= self.total:
                        continue
                began = time.monotonic()
                chunk = self._body.read(want)
                self._slow = self._rate.add(time.monotonic() - began, len(chunk))
                if chunk:
                    if self.pos == 0 and self.expect_gzip and not chunk.startswith(GZIP_MAGIC[: len(chunk)]):
                        raise _Retry(f"got a body starting {snippet(chunk)}{self._ctype} instead of gzip", "bad_answer")
                    if self.pos + len(chunk) > self.policy.max_bytes:
                        self._release()
                        raise DownloadError(
                            f"{public_url(self.url)}: more than {self.policy.max_bytes:,} bytes"
                            f"{'' if self.total is None else f' (announced {self.total:,})'} and still going: over"
                            " max_object_bytes; not read further"
                        )
                    self.pos += len(chunk)
                    if self.pos >= self._fresh_at:
                        self._failures = 0
                    self.counters["download_bytes"] += len(chunk)
                    return chunk
                if self.total is None:  # no length was announced: the body's end is the object's
                    self._release()
                    return b""
                raise _Retry(
                    f"body ended at byte {self.pos:,} of {self.total:,} (short of its Content-Length)", "short_body"
                )
            except _Retry as err:
                self._release()
                self._back_off(err)
        return b""

    def readall(self) -> bytes:
        return b"".join(iter(lambda: self.read(self.read_bytes), b""))

    def _open(self) -> None:
        etag = self.validators[0] if self.validators else None
        strong = etag if etag and not etag.startswith("W/") and self.pos else None
        self.counters["http_requests"] += 1
        if self.pos:
            self.counters["http_resumed"] += 1
        status, headers, body = self.transport.get(self.url, self.pos, strong)
        self._ctype = f" ({headers['content-type']})" if headers.get("content-type") else ""
        try:
            if status == 412:
                raise self._changed(f"the server answered 412 to If-Match: {etag}")
            if status == 416:
                m = _UNSATISFIED_RANGE.match(headers.get("content-range", ""))
                if m and int(m.group(1)) == self.pos:  # the last connection ended with the last byte
                    self.total = self.pos
                    return
                raise _Retry(f"HTTP 416 for a range from byte {self.pos:,} ({headers.get('content-range')})", "416")
            if status == 206:
                m = _CONTENT_RANGE.match(headers.get("content-range", ""))
                if not m or int(m.group(1)) != self.pos:
                    raise _Retry(
                        f"asked for bytes from {self.pos:,}, got Content-Range {headers.get('content-range')!r}",
                        "bad_answer",
                    )
                total = None if m.group(3) == "*" else int(m.group(3))
                skip = 0
            elif 200 <= status < 300:
                length = headers.get("content-length")
                total = int(length) if length and length.isdigit() else None
                skip = self.pos  # the whole object again: what was handed on is dropped here
                if skip:
                    self.counters["http_range_ignored"] += 1
            else:
                raise _Retry(f"HTTP {status}", str(status))
            self._check_same(headers, total)
            self._body = body
            body = None
            if skip:
                self._skip(skip)
        finally:
            if body is not None:
                body.close()

    def _check_same(self, headers: dict[str, str], total: int | None) -> None:
        if total is not None and total > self.policy.max_bytes:
            raise DownloadError(
                f"{public_url(self.url)}: {total:,} bytes announced, more than max_object_bytes"
                f" ({self.policy.max_bytes:,}); not read"
            )
        seen = _validators(headers)
        if self.validators is None or self.pos == self._start:  # nothing handed on yet: any version
            self.validators, self.total = seen, total
            return
        for name, old, new in zip(("ETag", "Last-Modified"), self.validators, seen):
            if old and new and old != new:
                raise self._changed(f"{name} was {old}, is now {new}")
        if self.total is not None and total is not None and total != self.total:
            raise self._changed(f"its length was {self.total:,} bytes, is now {total:,}")
        self.total = self.total if total is None else total

    def _changed(self, how: str) -> DownloadError:
        self._release()
        return DownloadError(
            f"{public_url(self.url)} changed while being read ({how}) at byte {self.pos:,}; "
            "not splicing two versions: run again to read the new one from its start"
        )

    def _skip(self, n: int) -> None:
        """Read and drop the first `n` bytes of a whole-object answer, `read_bytes` at a time."""
        done = 0
        while done < n:
            chunk = self._body.read(min(self.read_bytes, n - done))
            if not chunk:
                raise _Retry(f"whole-object answer ended at byte {done:,}, before byte {n:,}", "short_body")
            done += len(chunk)
        self.counters["http_bytes_dropped"] += done

    def _back_off(self, err: _Retry) -> None:
        self._failures += 1
        # after a cut for slowness, a trickle of bytes is no progress: the count starts afresh
        # only once a window's worth has arrived
        window = int(self.policy.min_rate * self.policy.rate_window) if err.why == "slow" else 0
        self._fresh_at = self.pos + max(1, window)
        if self._failures > self.policy.retries:
            raise DownloadError(
                f"giving up on {public_url(self.url)} after {self._failures} attempts"
                f"{f' at byte {self.pos:,}' if self.pos else ''}: {err}"
            ) from None
        self.counters["http_retries"] += 1
        self.counters[f"http_retries_{err.why}"] += 1
        wait = self.policy.wait(self._failures, err.wait)
        logger.warning(
            printable(
                f"retrying {public_url(self.url)}: {err} (attempt {self._failures}/{self.policy.retries}, "
                f"at byte {self.pos:,}), waiting {wait:.2f}s"
            )
        )
        time.sleep(wait)

    def _release(self) -> None:
        self._slow = None
        self._rate = RateGuard(self.policy.min_rate, self.policy.rate_window)  # judged per connection
        if self._body is not None:
            self._body.close()
            self._body = None

    def close(self) -> None:
        self._release()
        super().close()


#: what a task's client holds beside the bytes it reads. S3: botocore, its session, endpoint and
#: service data (measured: +17 to +23 MB of a task's peak RSS over the same task reading the
#: file from disk, with reads of 1 and 64 MiB; benchmarks/stream_vs_local.py: +16 to +23 MB).
#: http(s): urllib, already imported by every task; nothing measurable over loopback HTTP, and
#: room for a TLS context and its certificates
CLIENT_BYTES = {"s3": 32 << 20, "http": 8 << 20, "https": 8 << 20}


def stream_memory_bytes(url: str, read_bytes: int) -> int:
    """What streaming `url` adds to the task that reads it: one read of at most `read_bytes`
    (a read hands back what has arrived, usually far less; the WET reader asks for 1 MiB at a
    time, a stream dropping a whole-object answer's head reads `read_bytes` at a time) and the
    client (`CLIENT_BYTES`). Not the file: nothing of it is kept once the reader has it."""
    return read_bytes + CLIENT_BYTES[urllib.parse.urlsplit(url).scheme]


def transport_for(url: str, timeout: float, deadline: float | None = None) -> HttpTransport | S3Transport:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme == "s3":
        return S3Transport(timeout)
    if scheme in ("http", "https"):
        return HttpTransport(timeout, deadline)
    raise ValueError(f"cannot stream {public_url(url)}: use http(s):// or s3://")


def open_remote(
    url: str, policy: RetryPolicy | None = None, read_bytes: int = 1 << 20, counters: Counter | None = None
) -> RemoteStream:
    """A RemoteStream over `url` (http, https or s3), read from its first byte."""
    policy = policy or RetryPolicy()
    return RemoteStream(url, transport_for(url, policy.timeout, read_deadline(policy)), policy, read_bytes, counters)
