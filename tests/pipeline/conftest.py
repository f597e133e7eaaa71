"""Fixtures for pipeline tests: a Common-Crawl-like mirror served over loopback HTTP, and the
demo run (`configs/crawl.yaml` on the real samples) made once for every module that reads one.

The HTTP server supports Range requests and injects faults per path (S3 SlowDown, 429,
a connection dropped mid-body, ignoring Range), and records every request it saw.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from loguru import logger

from gristmill.input.commoncrawl import Fetcher
from tests.cli_process import pipeline

from ..conftest import REPO, made_once

C14 = "CC-MAIN-2014-10"
C17 = "CC-MAIN-2017-30"
SEG14 = "1393999642168.31"
REL14A = f"crawl-data/{C14}/segments/{SEG14}/wet/CC-MAIN-20140305060716-00098-ip-10-183-142-35.ec2.internal.warc.wet.gz"
REL14B = f"crawl-data/{C14}/segments/{SEG14}/wet/CC-MAIN-20140305060716-00099-ip-10-183-142-35.ec2.internal.warc.wet.gz"
REL17 = f"crawl-data/{C17}/segments/1500549423222.65/wet/CC-MAIN-20170720121902-20170720141902-00000.warc.wet.gz"
SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def mirror(tmp_path, wet_files) -> Path:
    """crawl-data/<crawl>/wet.paths.gz plus the WET files (symlinks to the shared samples)."""
    root = tmp_path / "mirror"
    for crawl, rels, src in ((C14, [REL14A, REL14B], wet_files[0]), (C17, [REL17], wet_files[1])):
        for rel in rels:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).symlink_to(src)
        (root / "crawl-data" / crawl / "wet.paths.gz").write_bytes(gzip.compress(("\n".join(rels) + "\n").encode()))
    return root


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        srv = self.server
        path = self.path.split("?")[0]
        with srv.lock:
            srv.requests.append((path, self.headers.get("Range")))
            faults = srv.faults.get(path)
            fault = faults.pop(0) if faults else None
        if fault == "slowdown":
            return self._send(503, SLOWDOWN, {"Content-Type": "application/xml"})
        if fault == "slowdown-400":  # S3's throttle code under a status that is not 5xx
            return self._send(400, SLOWDOWN, {"Content-Type": "application/xml"})
        if fault == "403":
            return self._send(403, b"<Error><Code>AccessDenied</Code></Error>", {})
        if fault == "429":
            return self._send(429, b"too many", {"Retry-After": "0"})
        file = srv.root / path.lstrip("/")
        if ".." in path or not file.is_file():
            return self._send(404, b"<Error><Code>NoSuchKey</Code></Error>", {})
        data = file.read_bytes()
        start, rng = 0, self.headers.get("Range")
        if rng and fault != "ignore-range":
            start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
        body = data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if isinstance(fault, tuple) and fault[0] == "cut":
            self.wfile.write(body[: fault[1]])  # then drop the connection
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def _send(self, status, body, headers):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server(mirror, monkeypatch):
    # A proxy from the environment must not intercept loopback requests.
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.root, srv.requests, srv.faults, srv.lock = mirror, [], {}, threading.Lock()
    srv.base = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


@pytest.fixture
def fetcher(tmp_path) -> Fetcher:
    return Fetcher(tmp_path / "cache", retries=4, backoff=0.001, max_backoff=0.01, timeout=5)


@pytest.fixture
def log_lines():
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    yield lines
    logger.remove(sink)


def hits(srv, rel):
    return [r for r in srv.requests if r[0] == "/" + rel]


# --- the demo run ------------------------------------------------------------------------------


def _absolute_models(node):
    """The demo config names its models relative to the repo root; the tests may run elsewhere."""
    if isinstance(node, dict):
        return {k: _absolute_models(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_absolute_models(v) for v in node]
    if isinstance(node, str) and node.startswith("models/"):
        return str(REPO / node)
    return node


def demo_config(shared_data: Path, run_dir: str | Path) -> dict:
    """`configs/crawl.yaml` as `make demo` runs it on the two WET samples, without training."""
    data = _absolute_models(yaml.safe_load((REPO / "configs" / "crawl.yaml").read_text()))
    data.pop("train")
    data["run_dir"] = str(run_dir)
    data["input"] = {"paths": [str(shared_data / "cc" / "wet" / "*.warc.wet.gz")]}
    return data


@pytest.fixture(scope="session")
def demo_run_dir(tmp_path_factory, shared_data, lid_model, kenlm_model, quality_model) -> Path:
    """The run directory of `pipeline run` on `demo_config` (seven filters, paragraph exact dedup,
    near dedup, token shards: every kind of stage), made once per test run and read by the
    journey, run-directory and object-storage tests: the same demo run, not one per module.
    Read-only to its users: a test that changes it works on a copy."""

    def make(folder: Path) -> None:
        config = folder / "crawl.yaml"
        config.write_text(yaml.safe_dump(demo_config(shared_data, folder / "crawl"), sort_keys=False))
        path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
        res = pipeline("run", str(config), env={**os.environ, "PYTHONPATH": path}, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]

    return made_once(tmp_path_factory, "demo-crawl", make) / "crawl"
