"""Every transfer has a minimum rate and a largest size (cc_stream, "Deadlines"), against a real
server on 127.0.0.1 that drips: a byte every 0.2 s of the body, of a header line, of a chunk-size
line (each beats any per-read timeout), an endless chunked gzip answered as fast as it goes, and a
length announced above the limit. Each connection of the server ends on its own after a bound, and
the server stops with the test. What the user gets: the connection cut and resumed, retries
under the policy, then one line naming the URL and why; nothing hangs, nothing is read twice.
"""

from __future__ import annotations

import gzip
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from gristmill.input.commoncrawl import Fetcher
from gristmill.input.stream import DownloadError
from gristmill.input.wet import WetReader
from tests.cli_process import pipeline

from .conftest import C14, REL14A

pytestmark = [pytest.mark.network]
DRIP_S = 0.2  # one byte this often: 5 bytes/s, far below the tests' 100 bytes/s minimum
CONNECTION_S = 20.0  # no connection of the server lasts longer, whatever the client does


class _Dripping(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        srv = self.server
        path = self.path.split("?")[0]
        if path.endswith("wet.paths.gz"):
            return self._send(gzip.compress(f"{REL14A}\n".encode()))
        with srv.lock:
            srv.requests.append(self.headers.get("Range"))
        start = int(re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "bytes=0-").group(1))
        data, mode = srv.data, srv.mode
        self.ends = time.monotonic() + CONNECTION_S
        if mode == "headers":  # the status line, then a header line that never ends
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            return self._drip(b"a" * 10_000)
        if mode == "huge":
            self.send_response(200)
            self.send_header("Content-Length", str(20 << 30))
            self.end_headers()
            return self.wfile.write(data[:1000])
        if mode in ("chunk_line", "endless"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if mode == "chunk_line":  # 10 bytes, then a chunk-size line dripped digit by digit
                self.wfile.write(b"a\r\n" + data[start : start + 10] + b"\r\n")
                return self._drip(b"1" * 10_000)
            sent = 0  # the WET file again and again (gzip members back to back are one gzip file)
            while sent < 200 << 20 and time.monotonic() < self.ends and not srv.stopping.is_set():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                sent += len(data)
            return self.wfile.write(b"0\r\n\r\n")
        # "body": the object's length announced, then its bytes one at a time
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self._drip(data[start:])

    def _drip(self, data: bytes) -> None:
        for i in range(len(data)):
            if time.monotonic() > self.ends or self.server.stopping.wait(DRIP_S):
                break
            try:
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
            except OSError:  # the client cut it
                break
        self.close_connection = True

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def dripping(wet_files, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Dripping)
    srv.daemon_threads = True
    srv.data, srv.mode, srv.requests = wet_files[0].read_bytes(), "body", []
    srv.lock, srv.stopping = threading.Lock(), threading.Event()
    srv.base = f"http://127.0.0.1:{srv.server_address[1]}"
    srv.url = f"{srv.base}/{REL14A}"
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.stopping.set()
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def _fetcher(tmp_path: Path, cache: str = "none", **kw) -> Fetcher:
    args = {"retries": 2, "backoff": 0.001, "max_backoff": 0.01, "timeout": 5.0, "min_rate": 100, "rate_window": 1.0}
    return Fetcher(tmp_path / "cache", cache=cache, **{**args, **kw})


def _read(fetcher: Fetcher, url: str) -> list:
    return list(WetReader([url], resolve=fetcher.open).run())


def test_a_dripping_body_is_cut_retried_and_fails_in_one_line(dripping, tmp_path):
    with pytest.raises(DownloadError) as e:
        _read(_fetcher(tmp_path), dripping.url)
    line = str(e.value)
    assert re.fullmatch(
        rf"giving up on {re.escape(dripping.url)} after 3 attempts at byte \d+: too slow: \d+ bytes in 1\.\d s of"
        r" waiting, below the minimum of 100 bytes/s \(min_rate_bytes_s\)",
        line,
    ), line
    # the first try and 2 retries, each resumed from the byte after the last one received
    assert len(dripping.requests) == 3 and dripping.requests[0] is None
    at = [int(r[6:-1]) for r in dripping.requests[1:]]
    assert 0 < at[0] < at[1] < int(line.split(" at byte ")[1].split(":")[0])  # each attempt got a few bytes


def test_a_dripping_body_fails_the_download_too(dripping, tmp_path):
    """cache: keep downloads through urllib into a .part: the same minimum, the same end."""
    with pytest.raises(DownloadError) as e:
        _fetcher(tmp_path, cache="keep").local_path(dripping.url)
    assert re.fullmatch(
        rf"giving up on {re.escape(dripping.url)} after 3 attempts: too slow: \d+ bytes in 1\.\d s of waiting,"
        r" below the minimum of 100 bytes/s \(min_rate_bytes_s\)",
        str(e.value),
    ), str(e.value)
    assert len(dripping.requests) == 3 and all(re.fullmatch(r"bytes=\d+-", r) for r in dripping.requests[1:])
    assert not (tmp_path / "cache" / REL14A).exists()


@pytest.mark.parametrize("mode", ["headers", "chunk_line"])
@pytest.mark.parametrize("cache", ["none", "keep"])
def test_a_line_that_never_ends_is_cut_by_the_watchdog(dripping, tmp_path, mode, cache):
    """A header line, or a chunk-size line, dripped: the read never returns, so no rate can be
    judged after it; the watchdog cuts the request past 2 x timeout_s, the read past the window."""
    dripping.mode = mode
    f = _fetcher(tmp_path, cache=cache, timeout=1.0)
    with pytest.raises(DownloadError) as e:
        _read(f, dripping.url) if cache == "none" else f.local_path(dripping.url)
    why = r"no answer \(status and headers\) within 2 s" if mode == "headers" else r"one read took over 1 s .*"
    assert re.fullmatch(rf"giving up on {re.escape(dripping.url)} after 3 attempts( at byte \d+)?: {why}", str(e.value))
    assert len(dripping.requests) == 3


@pytest.mark.parametrize("cache", ["none", "keep"])
def test_an_endless_chunked_gzip_stops_at_max_object_bytes(dripping, tmp_path, cache):
    dripping.mode = "endless"
    limit = 3_000_000
    f = _fetcher(tmp_path, cache=cache, max_bytes=limit)
    with pytest.raises(DownloadError) as e:
        _read(f, dripping.url) if cache == "none" else f.local_path(dripping.url)
    assert re.fullmatch(
        rf"({re.escape(dripping.url)}: )?more than 3,000,000 bytes and still going: over max_object_bytes.*",
        str(e.value),
    ), str(e.value)
    if cache == "none":
        assert str(e.value).startswith(dripping.url)
    assert len(dripping.requests) == 1  # not retried: another attempt would do the same


def test_a_length_above_the_limit_is_refused_before_reading(dripping, tmp_path):
    dripping.mode = "huge"
    with pytest.raises(DownloadError) as e:
        _read(_fetcher(tmp_path), dripping.url)
    assert str(e.value) == (
        f"{dripping.url}: 21,474,836,480 bytes announced, more than max_object_bytes (8,589,934,592); not read"
    )
    assert len(dripping.requests) == 1


def test_a_run_on_a_dripping_server_ends_in_one_line(dripping, tmp_path):
    """The settings as a user gives them (input.commoncrawl), `pipeline run` end to end."""
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "executor": {"type": "local", "tasks": 1, "workers": 1},
        "input": {
            "commoncrawl": {
                "crawl": C14,
                "files": 1,
                "base_url": dripping.base,
                "cache_dir": str(tmp_path / "cache"),
                "retries": 2,
                "backoff_s": 0.01,
                "timeout_s": 5,
                "min_rate_bytes_s": 100,
                "rate_window_s": 1,
            }
        },
        "steps": [{"gopher_quality": {}}],
        "output": {"dropped_sample": 0},
    }
    path = tmp_path / "cc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = pipeline("run", str(path), timeout=300)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    want = re.compile(rf"giving up on {re.escape(dripping.url)} after 3 attempts at byte \d+: too slow: ")
    assert [line for line in res.stderr.splitlines() if want.search(line)], res.stderr[-3000:]
    assert len(dripping.requests) == 3
