"""How long a transfer may take and how often it is tried again, for every transport of the input
layer (`stream.RemoteStream`, `commoncrawl.Fetcher`'s downloads): the one retry policy, the
minimum rate a connection must keep (`RateGuard`), and the watchdog that cuts a connection whose
single read never returns (a dripped header line or chunk size)."""

from __future__ import annotations

import http.client
import os
import random
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Common Crawl's servers deliver megabytes a second to a task; a connection below 10 kB/s for a
#: minute of waiting is a server in trouble (a 150 MB WET file would take over 4 hours)
MIN_RATE_BYTES_S = 10_000
RATE_WINDOW_S = 60.0
#: the most bytes of one object: a Common Crawl WARC file is ~1 GB, a WET file ~150 MB
MAX_OBJECT_BYTES = 8 << 30


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 8
    backoff: float = 1.0
    max_backoff: float = 60.0
    #: seconds to connect, and with no byte arriving on an open connection (a stalled response)
    timeout: float = 60.0
    #: bytes per second of waiting below which a connection is cut and resumed (0: no minimum)
    min_rate: float = MIN_RATE_BYTES_S
    #: seconds of waiting over which the rate is judged
    rate_window: float = RATE_WINDOW_S
    #: the most bytes read of one object
    max_bytes: int = MAX_OBJECT_BYTES

    def wait(self, attempt: int, server_says: float | None) -> float:
        if server_says is not None:
            return min(self.max_backoff, server_says)
        return min(self.max_backoff, self.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


class RateGuard:
    """The rate of one connection in bytes per second of waiting on it, judged every `window`
    seconds of waiting (module doc). `add` returns why the last window was too slow, or None."""

    def __init__(self, min_rate: float, window: float):
        self.min_rate, self.window = min_rate, window
        self.waited, self.got = 0.0, 0

    def add(self, waited: float, got: int) -> str | None:
        if self.min_rate <= 0:
            return None
        self.waited += waited
        self.got += got
        if self.waited < self.window:
            return None
        waited, got = self.waited, self.got
        self.waited, self.got = 0.0, 0
        if got >= self.min_rate * waited:
            return None
        return (
            f"too slow: {got:,} bytes in {waited:.1f} s of waiting, below the minimum of {self.min_rate:,.0f} bytes/s"
            " (min_rate_bytes_s)"
        )


class _Watchdog:
    """One thread per process that shuts the socket of a call past its deadline: the only way to
    stop a blocking read that keeps receiving a byte now and then (module doc)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, Callable[[], None]]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None
        self._pid = 0

    def arm(self, seconds: float, cut: Callable[[], None]) -> int:
        if self._pid != os.getpid():  # a forked child: its own lock and calls, no thread yet
            self._cond, self._armed, self._thread = threading.Condition(), {}, None
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name="gristmill-transfer-watchdog", daemon=True)
                self._thread.start()
            self._next += 1
            self._armed[self._next] = (time.monotonic() + seconds, cut)
            self._cond.notify()
            return self._next

    def disarm(self, token: int) -> bool:
        """True if the call was cut."""
        with self._cond:
            return self._armed.pop(token, None) is None

    def _loop(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [t for t, (at, _) in self._armed.items() if at <= now]
                cuts = [self._armed.pop(t)[1] for t in due]
                if not cuts:
                    soonest = min((at for at, _ in self._armed.values()), default=now + 3600)
                    self._cond.wait(max(0.01, soonest - now))
                    continue
            for cut in cuts:
                try:
                    cut()
                except OSError:
                    pass  # already closed


_WATCHDOG = _Watchdog()


class Cut:
    fired = False


@contextmanager
def cut_after(seconds: float | None, cut: Callable[[], None]) -> Iterator[Cut]:
    """Run the block; if it lasts past `seconds`, `cut()` is called from the watchdog thread
    (shutting a socket makes the blocked read return) and the yielded `Cut` says so."""
    state = Cut()
    if seconds is None:
        yield state
        return
    token = _WATCHDOG.arm(seconds, cut)
    try:
        yield state
    finally:
        state.fired = _WATCHDOG.disarm(token)


class Sockets:
    """The sockets of this transport's connections, to be shut by the watchdog."""

    def __init__(self):
        self.current: socket.socket | None = None

    def shut(self) -> None:
        sock = self.current
        if sock is not None:
            # socket.socket's own shutdown, also for an SSLSocket: the TLS object stays for the
            # reader, which then sees the end of the connection
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


def recording_opener(sockets: Sockets) -> urllib.request.OpenerDirector:
    """urllib's opener (proxies from the environment, redirects), whose connections tell
    `sockets` their socket as soon as they connect."""

    def recording(base):
        class Connection(base):
            def connect(self):
                super().connect()
                sockets.current = self.sock

        return Connection

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(recording(http.client.HTTPConnection), req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(recording(http.client.HTTPSConnection), req, context=self._context)

    return urllib.request.build_opener(Http, Https)


def read_deadline(policy: RetryPolicy) -> float | None:
    """How long one read of a body may take over http(s) before the watchdog cuts it: a read
    that blocks a whole window while bytes trickle in is below any minimum rate."""
    return max(policy.rate_window, policy.timeout) if policy.min_rate > 0 else None
