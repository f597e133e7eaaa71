"""list_wet_paths and Fetcher against a Common-Crawl-like mirror, local and over loopback HTTP.

The HTTP server supports Range requests and injects faults per path (S3 SlowDown, 429,
a connection dropped mid-body, ignoring Range), and records every request it saw.
"""

from __future__ import annotations

import gzip
import os
import re
import socket
import threading
import tracemalloc
import zlib
from pathlib import Path

import pytest
import yaml

from gristmill.input.commoncrawl import DownloadError, Fetcher, gzip_problem, list_wet_paths
from tests.cli_process import pipeline

from .conftest import C14, C17, REL14A, REL14B, REL17, SEG14, _Handler, hits, sha256

pytestmark = pytest.mark.network

# --- listing -----------------------------------------------------------------------------------


def test_list_first_n_and_all_remote(server, fetcher):
    assert list_wet_paths(server.base, C14, files=1, fetcher=fetcher) == [f"{server.base}/{REL14A}"]
    assert list_wet_paths(server.base + "/", C14, fetcher=fetcher) == [
        f"{server.base}/{REL14A}",
        f"{server.base}/{REL14B}",
    ]
    assert list_wet_paths(server.base, C17, files=5, fetcher=fetcher) == [f"{server.base}/{REL17}"]
    # the listing itself is cached: fetched once per crawl
    assert len(hits(server, f"crawl-data/{C14}/wet.paths.gz")) == 1
    assert (fetcher.cache_dir / f"crawl-data/{C14}/wet.paths.gz").is_file()


def test_list_named_paths_keep_order(server, fetcher):
    got = list_wet_paths(server.base, C14, paths=[REL14B, f"{server.base}/{REL14A}", REL14B], fetcher=fetcher)
    assert got == [f"{server.base}/{REL14B}", f"{server.base}/{REL14A}"]


def test_unknown_path_is_named(server, fetcher):
    bogus = f"crawl-data/{C14}/segments/{SEG14}/wet/nope.warc.wet.gz"
    with pytest.raises(ValueError, match=re.escape(bogus)):
        list_wet_paths(server.base, C14, paths=[REL14A, bogus], fetcher=fetcher)


def test_list_argument_errors(server, fetcher, mirror):
    with pytest.raises(ValueError, match="not both"):
        list_wet_paths(server.base, C14, files=1, paths=[REL14A], fetcher=fetcher)
    with pytest.raises(ValueError, match="Fetcher"):
        list_wet_paths(server.base, C14, files=1)
    with pytest.raises(DownloadError, match="404"):
        list_wet_paths(server.base, "CC-MAIN-1999-01", files=1, fetcher=fetcher)
    with pytest.raises(FileNotFoundError, match="CC-MAIN-1999-01"):
        list_wet_paths(mirror, "CC-MAIN-1999-01")


def test_local_directory_base_returns_local_paths(mirror, tmp_path, wet_files):
    cache = tmp_path / "cache"
    for base in (mirror, str(mirror) + "/", mirror.as_uri()):
        got = list_wet_paths(base, C14, files=1, fetcher=Fetcher(cache))
        assert got == [str(mirror / REL14A)]
    got = list_wet_paths(mirror, C17, paths=[REL17])
    assert got == [str(mirror / REL17)]
    # no copy: the Fetcher hands back the mirror's own file and the cache stays empty
    assert Fetcher(cache).local_path(got[0]) == mirror / REL17
    assert Fetcher(cache).local_path(Path(got[0]).as_uri()) == mirror / REL17
    assert (mirror / REL17).resolve() == wet_files[1].resolve()
    assert not cache.exists()
    with pytest.raises(FileNotFoundError):
        Fetcher(cache).local_path(mirror / "crawl-data/absent.warc.wet.gz")


# --- downloads ---------------------------------------------------------------------------------


def test_download_is_exact_and_cached(server, fetcher, wet_files, tmp_path):
    url = f"{server.base}/{REL17}"
    path = fetcher.local_path(url)
    assert path == fetcher.cache_dir / REL17
    assert sha256(path) == sha256(wet_files[1])
    assert not path.with_name(path.name + ".part").exists()
    assert hits(server, REL17) == [("/" + REL17, None)]
    # a second call, and a fresh Fetcher on the same cache, make no request at all
    assert fetcher.local_path(url) == path
    assert Fetcher(fetcher.cache_dir).local_path(url) == path
    assert len(hits(server, REL17)) == 1
    assert fetcher.fetch_bytes(url) == wet_files[1].read_bytes()
    assert len(hits(server, REL17)) == 1


def test_slowdown_503_is_retried(server, fetcher, wet_files, log_lines):
    server.faults["/" + REL17] = ["slowdown", "slowdown"]
    url = f"{server.base}/{REL17}"
    assert sha256(fetcher.local_path(url)) == sha256(wet_files[1])
    assert len(hits(server, REL17)) == 3
    retries = [line for line in log_lines if url in line]
    assert len(retries) == 2 and "503 SlowDown" in retries[0] and "attempt 1/" in retries[0]


def test_429_with_retry_after_is_retried(server, fetcher, wet_files):
    server.faults["/" + REL17] = ["429"]
    assert sha256(fetcher.local_path(f"{server.base}/{REL17}")) == sha256(wet_files[1])
    assert len(hits(server, REL17)) == 2


def test_slowdown_code_is_retried_other_4xx_fail_fast(server, fetcher, wet_files):
    server.faults["/" + REL17] = ["slowdown-400"]
    assert sha256(fetcher.local_path(f"{server.base}/{REL17}")) == sha256(wet_files[1])
    assert len(hits(server, REL17)) == 2
    server.faults["/" + REL14A] = ["403"]
    url = f"{server.base}/{REL14A}"
    with pytest.raises(DownloadError, match=re.escape(url) + ".*403 AccessDenied"):
        fetcher.local_path(url)
    assert len(hits(server, REL14A)) == 1


def test_retries_run_out(server, tmp_path):
    server.faults["/" + REL17] = ["slowdown"] * 10
    f = Fetcher(tmp_path / "c", retries=2, backoff=0.001, max_backoff=0.01, timeout=5)
    url = f"{server.base}/{REL17}"
    with pytest.raises(DownloadError, match=re.escape(url)):
        f.local_path(url)
    assert len(hits(server, REL17)) == 3  # first try + 2 retries
    assert not (f.cache_dir / REL17).exists()


def test_404_fails_fast(server, fetcher):
    rel = f"crawl-data/{C17}/segments/x/wet/missing.warc.wet.gz"
    url = f"{server.base}/{rel}"
    with pytest.raises(DownloadError) as exc:
        fetcher.local_path(url)
    assert url in str(exc.value) and "404" in str(exc.value)
    assert len(hits(server, rel)) == 1
    assert not (fetcher.cache_dir / rel).exists()


def test_partial_part_is_resumed_with_range(server, fetcher, wet_files):
    data = wet_files[0].read_bytes()
    half = len(data) // 2
    part = fetcher.cache_dir / (REL14A + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:half])
    path = fetcher.local_path(f"{server.base}/{REL14A}")
    assert hits(server, REL14A) == [("/" + REL14A, f"bytes={half}-")]
    assert sha256(path) == sha256(wet_files[0])
    assert not part.exists()


def test_server_ignoring_range_restarts_from_zero(server, fetcher, wet_files):
    data = wet_files[0].read_bytes()
    part = fetcher.cache_dir / (REL14A + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * 1000)  # garbage that must not survive a 200 answer
    server.faults["/" + REL14A] = ["ignore-range"]
    path = fetcher.local_path(f"{server.base}/{REL14A}")
    assert hits(server, REL14A) == [("/" + REL14A, "bytes=1000-")]
    assert path.read_bytes() == data


def test_complete_part_answered_416_is_kept(server, fetcher, wet_files):
    data = wet_files[1].read_bytes()
    part = fetcher.cache_dir / (REL17 + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(data)
    path = fetcher.local_path(f"{server.base}/{REL17}")
    assert hits(server, REL17) == [("/" + REL17, f"bytes={len(data)}-")]
    assert path.read_bytes() == data


def test_oversized_part_is_discarded(server, fetcher, wet_files):
    data = wet_files[1].read_bytes()
    part = fetcher.cache_dir / (REL17 + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(data + b"trailing junk")
    path = fetcher.local_path(f"{server.base}/{REL17}")
    assert [r[1] for r in hits(server, REL17)] == [f"bytes={len(data) + 13}-", None]
    assert path.read_bytes() == data


def test_body_cut_mid_transfer_is_resumed(server, fetcher, wet_files, log_lines):
    cut = 300_000
    server.faults["/" + REL14A] = [("cut", cut), ("cut", 100_000)]
    url = f"{server.base}/{REL14A}"
    path = fetcher.local_path(url)
    assert sha256(path) == sha256(wet_files[0])
    assert [r[1] for r in hits(server, REL14A)] == [None, f"bytes={cut}-", f"bytes={cut + 100_000}-"]
    assert any(url in line and "short body" in line for line in log_lines)


def test_concurrent_requests_download_once(server, fetcher, wet_files):
    url = f"{server.base}/{REL14A}"
    results, errors = [], []

    def worker():
        try:
            # separate Fetcher objects, as separate tasks would have
            results.append(Fetcher(fetcher.cache_dir, timeout=5).local_path(url))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert len(results) == 4 and len(set(results)) == 1
    assert len(hits(server, REL14A)) == 1
    assert sha256(results[0]) == sha256(wet_files[0])


# --- verification: what comes back must be the gzip file the URL names -------------------------

HTML = (
    b"<!DOCTYPE html>\n<html><head><title>Access denied</title></head>\n<body><h1>This site is "
    b"blocked by your network administrator.</h1>" + b"<p>Contact the help desk.</p>" * 40 + b"</body></html>\n"
)


class _HostileHandler(_Handler):
    """The conftest server plus answers that look like success: HTML pages served with 200, and
    bodies cut short on a connection that says nothing of their length."""

    MINE = ("html", "gzip-html")

    def do_GET(self):  # noqa: N802 - http.server's name
        srv = self.server
        path = self.path.split("?")[0]
        with srv.lock:
            faults = srv.faults.get(path)
            mine = bool(faults) and (faults[0] in self.MINE or faults[0][0] in ("close", "chunked"))
            if mine:
                fault = faults.pop(0)
                srv.requests.append((path, self.headers.get("Range")))
        if not mine:
            return super().do_GET()
        if fault == "html":  # a proxy's or captive portal's page, with status 200
            return self._send(200, HTML, {"Content-Type": "text/html; charset=utf-8"})
        if fault == "gzip-html":  # the same page, compressed in transit
            return self._send(200, gzip.compress(HTML), {"Content-Type": "text/html", "Content-Encoding": "gzip"})
        data = (srv.root / path.lstrip("/")).read_bytes()[: fault[1]]
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if fault[0] == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 8192):  # the last chunk and the terminator never come
                piece = data[i : i + 8192]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        else:  # HTTP/1.0, no Content-Length: the body ends where the connection does
            self.end_headers()
            self.wfile.write(data)
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def hostile(server):
    server.RequestHandlerClass = _HostileHandler  # read per connection by socketserver
    return server


def member_offsets(path: Path) -> list[int]:
    """Where each gzip member of a real WET file starts, found by inflating it."""
    data, offsets, pos = path.read_bytes(), [], 0
    while pos < len(data):
        offsets.append(pos)
        d = zlib.decompressobj(31)
        d.decompress(data[pos:])
        pos = len(data) - len(d.unused_data)
    return offsets


def mid_member(path: Path, near: int) -> int:
    """A byte offset close to `near` that lies strictly inside a gzip member."""
    offsets = member_offsets(path)
    start = max(o for o in offsets if o <= near)
    return start + 100  # members of these files are a few KB


def cached_files(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() and p.suffix != ".lock")


def test_html_page_for_wet_is_retried_then_named(hostile, tmp_path, log_lines):
    hostile.faults["/" + REL17] = ["html"] * 10
    f = Fetcher(tmp_path / "c", retries=2, backoff=0.001, max_backoff=0.01, timeout=5)
    url = f"{hostile.base}/{REL17}"
    with pytest.raises(DownloadError) as exc:
        f.local_path(url)
    msg = str(exc.value)
    assert "\n" not in msg
    assert url in msg
    assert f"got {len(HTML):,} bytes starting '<!DOCTYPE html> <html><head><title>Acces'" in msg
    assert "(text/html; charset=utf-8) instead of gzip" in msg
    assert len(hits(hostile, REL17)) == 3  # first try + 2 retries
    assert cached_files(f.cache_dir) == []  # neither the page nor a .part is kept
    assert sum(url in line and "instead of gzip" in line for line in log_lines) == 2


def test_html_page_then_real_file(hostile, fetcher, wet_files):
    hostile.faults["/" + REL17] = ["html"]
    path = fetcher.local_path(f"{hostile.base}/{REL17}")
    assert path.read_bytes() == wet_files[1].read_bytes()
    # the page was thrown away, not resumed from: the second request asks for the whole file
    assert hits(hostile, REL17) == [("/" + REL17, None), ("/" + REL17, None)]


def test_gzip_encoded_html_is_not_a_wet_file(hostile, tmp_path):
    hostile.faults["/" + REL17] = ["gzip-html"] * 3
    f = Fetcher(tmp_path / "c", retries=1, backoff=0.001, max_backoff=0.01, timeout=5)
    with pytest.raises(DownloadError, match=r"decompresses to '<!DOCTYPE html> <html>.*not 'WARC/'"):
        f.local_path(f"{hostile.base}/{REL17}")
    assert cached_files(f.cache_dir) == []


@pytest.mark.parametrize("how", ["close", "chunked"])
def test_truncated_body_without_length_is_resumed_not_cached(hostile, fetcher, wet_files, how, log_lines):
    cut = mid_member(wet_files[1], 60_000)
    hostile.faults["/" + REL17] = [(how, cut)]
    url = f"{hostile.base}/{REL17}"
    path = fetcher.local_path(url)
    assert path.read_bytes() == wet_files[1].read_bytes()
    # Not cached: fetched again. A closed connection leaves a .part to resume with Range; a
    # broken chunked body raises inside http.client's read, which drops the bytes of that read.
    resumed_from = {f"bytes={cut}-"} if how == "close" else {None, f"bytes={cut}-"}
    assert [r[1] for r in hits(hostile, REL17)][0] is None
    assert len(hits(hostile, REL17)) == 2 and hits(hostile, REL17)[1][1] in resumed_from
    said = "short body: ends inside the gzip member" if how == "close" else "connection lost mid-body"
    assert any(url in line and said in line for line in log_lines)


def test_body_always_truncated_without_length_is_never_cached(hostile, tmp_path, wet_files):
    cut = mid_member(wet_files[1], 60_000)
    hostile.faults["/" + REL17] = [("close", cut)] * 10  # every time, ignoring Range
    f = Fetcher(tmp_path / "c", retries=2, backoff=0.001, max_backoff=0.01, timeout=5)
    url = f"{hostile.base}/{REL17}"
    with pytest.raises(DownloadError, match=re.escape(url) + r".*short body: ends inside the gzip member"):
        f.local_path(url)
    assert not (f.cache_dir / REL17).exists()
    assert len(hits(hostile, REL17)) == 3
    assert (f.cache_dir / (REL17 + ".part")).stat().st_size == cut  # kept for the next run to resume


@pytest.mark.parametrize("damage", ["html", "truncated", "flipped", "trailing"])
def test_bad_file_in_cache_is_removed_and_fetched_again(server, fetcher, wet_files, log_lines, damage):
    """A cache written by an older version (which kept any 200 body) or damaged since."""
    good = wet_files[1].read_bytes()
    bad = {
        "html": HTML,
        "truncated": good[: mid_member(wet_files[1], len(good) // 2)],
        "flipped": good[:5000] + bytes([good[5000] ^ 0x10]) + good[5001:],
        "trailing": good + HTML,
    }[damage]
    dest = fetcher.cache_dir / REL17
    dest.parent.mkdir(parents=True)
    dest.write_bytes(bad)
    url = f"{server.base}/{REL17}"
    assert fetcher.local_path(url) == dest
    assert dest.read_bytes() == good
    assert len(hits(server, REL17)) == 1
    assert any(str(dest) in line and url in line and "removing it" in line for line in log_lines)


def test_verified_file_is_not_verified_again_until_it_changes(server, fetcher, wet_files):
    url = f"{server.base}/{REL17}"
    dest = fetcher.local_path(url)
    marker = dest.with_name(dest.name + ".ok")
    assert marker.is_file()
    # Damage the file but keep its size and mtime: the marker still vouches for it, which shows
    # that a cache hit costs a stat, not a pass over the file.
    st = dest.stat()
    data = bytearray(dest.read_bytes())
    data[5000] ^= 0x10
    dest.write_bytes(data)
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert Fetcher(fetcher.cache_dir).local_path(url).read_bytes() == data
    assert len(hits(server, REL17)) == 1
    # A changed mtime (or size) voids the marker: verified again, found bad, fetched again.
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert fetcher.local_path(url).read_bytes() == wet_files[1].read_bytes()
    assert len(hits(server, REL17)) == 2


def test_good_cache_from_older_version_is_verified_once(server, fetcher, wet_files):
    dest = fetcher.cache_dir / REL17
    dest.parent.mkdir(parents=True)
    dest.write_bytes(wet_files[1].read_bytes())  # no .ok marker
    assert fetcher.local_path(f"{server.base}/{REL17}") == dest
    assert hits(server, REL17) == []
    assert dest.with_name(dest.name + ".ok").is_file()


def test_corrupt_member_with_right_length_is_refused(server, tmp_path, wet_files):
    good = wet_files[1].read_bytes()
    (server.root / REL17).unlink()
    (server.root / REL17).write_bytes(good[:5000] + bytes([good[5000] ^ 0x10]) + good[5001:])
    f = Fetcher(tmp_path / "c", retries=1, backoff=0.001, max_backoff=0.01, timeout=5)
    with pytest.raises(DownloadError, match=r"not a whole gzip file: gzip member at byte [\d,]+ does not inflate"):
        f.local_path(f"{server.base}/{REL17}")
    assert cached_files(f.cache_dir) == []


def test_complete_looking_part_is_verified_before_use(server, fetcher, wet_files):
    """A .part of the full length answered 416 is only kept if it is the file."""
    data = wet_files[1].read_bytes()
    part = fetcher.cache_dir / (REL17 + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(HTML.ljust(len(data), b" "))
    path = fetcher.local_path(f"{server.base}/{REL17}")
    assert [r[1] for r in hits(server, REL17)] == [f"bytes={len(data)}-", None]
    assert path.read_bytes() == data


def test_files_not_named_gz_are_not_checked_as_gzip(server, fetcher):
    (server.root / "models").mkdir()
    (server.root / "models" / "lid.176.ftz").write_bytes(b"__label__en model bytes")
    path = fetcher.local_path(f"{server.base}/models/lid.176.ftz")
    assert path.read_bytes() == b"__label__en model bytes"
    assert not path.with_name(path.name + ".ok").exists()


# --- the paths listing -----------------------------------------------------------------------


def test_html_listing_is_one_clear_error(hostile, tmp_path):
    listing = f"crawl-data/{C14}/wet.paths.gz"
    hostile.faults["/" + listing] = ["html"] * 2
    f = Fetcher(tmp_path / "c", retries=1, backoff=0.001, max_backoff=0.01, timeout=5)
    with pytest.raises(DownloadError) as exc:
        list_wet_paths(hostile.base, C14, files=1, fetcher=f)
    msg = str(exc.value)
    assert "\n" not in msg and f"{hostile.base}/{listing}" in msg and "instead of gzip" in msg
    assert cached_files(f.cache_dir) == []
    # the next run, with the server healthy again, lists the crawl
    assert list_wet_paths(hostile.base, C14, files=1, fetcher=f) == [f"{hostile.base}/{REL14A}"]


def test_poisoned_cached_listing_is_fetched_again(server, fetcher, log_lines):
    cached = fetcher.cache_dir / f"crawl-data/{C14}/wet.paths.gz"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(HTML)
    assert list_wet_paths(server.base, C14, files=1, fetcher=fetcher) == [f"{server.base}/{REL14A}"]
    assert len(hits(server, f"crawl-data/{C14}/wet.paths.gz")) == 1
    assert any(str(cached) in line for line in log_lines)


def test_listing_of_wrong_lines_is_named_and_not_kept(server, fetcher):
    listing = server.root / f"crawl-data/{C14}/wet.paths.gz"
    listing.write_bytes(gzip.compress(f"{REL14A}\n<html>\n{REL14B}\n".encode()))
    url = f"{server.base}/crawl-data/{C14}/wet.paths.gz"
    with pytest.raises(
        ValueError,
        match=re.escape(url) + r": not a WET paths listing: line 2 is '<html>'"
        r".*\(1 of 3 lines",
    ):
        list_wet_paths(server.base, C14, files=1, fetcher=fetcher)
    assert not (fetcher.cache_dir / f"crawl-data/{C14}/wet.paths.gz").exists()


@pytest.mark.parametrize(
    "content",
    [HTML, b"", gzip.compress(HTML)[:-20], gzip.compress(b"\xff\xfe\n")],
    ids=["html", "empty", "truncated", "not-utf8"],
)
def test_local_listing_that_is_not_one_names_the_file(mirror, content):
    listing = mirror / f"crawl-data/{C14}/wet.paths.gz"
    listing.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(listing)) + ": not a WET paths listing"):
        list_wet_paths(mirror, C14, files=1)


# --- gzip_problem on its own -----------------------------------------------------------------


def test_gzip_problem_classifies_every_cut_of_a_real_file(wet_files, tmp_path):
    data = wet_files[1].read_bytes()
    offsets = member_offsets(wet_files[1])
    p = tmp_path / "x.gz"
    assert gzip_problem(wet_files[1], b"WARC/") is None
    for cut in sorted({1, 2, 9, 10, offsets[1] - 1, offsets[1] + 1, offsets[5] + 3, len(data) - 1}):
        p.write_bytes(data[:cut])
        kind = "not_gzip" if cut < 2 else "truncated"
        assert gzip_problem(p)[0] == kind, cut
    for boundary in offsets[1:6]:
        p.write_bytes(data[:boundary])  # whole members and nothing else: a valid gzip file
        assert gzip_problem(p, b"WARC/") is None
    p.write_bytes(data + b"\n")
    assert gzip_problem(p) == (
        "trailing",
        f"bytes after the last gzip member, from byte {len(data):,}, starting b'\\n'",
    )


def test_gzip_problem_memory_is_bounded(tmp_path, wet_files):
    """Streams: neither a large file nor a bomb is held in memory."""
    one = wet_files[1].read_bytes()
    big = tmp_path / "big.warc.wet.gz"
    with open(big, "wb") as out:  # concatenated gzip files are one valid gzip file
        for _ in range(24_000_000 // len(one) + 1):
            out.write(one)
    bomb = tmp_path / "bomb.gz"
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb.write_bytes(z.compress(bytes(1 << 20)) + b"".join(z.compress(bytes(1 << 20)) for _ in range(127)) + z.flush())
    assert bomb.stat().st_size < 1 << 20  # 128 MiB of zeros
    for path in (big, bomb):
        tracemalloc.start()
        try:
            assert gzip_problem(path) is None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20, (path.name, peak)


# --- offline -----------------------------------------------------------------------------------

#: `.invalid` is reserved (RFC 6761): its names never resolve, and the lookup fails without a network
UNRESOLVABLE = "http://data.commoncrawl.invalid"


def test_a_name_that_does_not_resolve_fails_at_once(tmp_path, log_lines):
    f = Fetcher(tmp_path / "c", retries=8, backoff=0.001, max_backoff=0.01, timeout=5)
    url = f"{UNRESOLVABLE}/crawl-data/{C14}/wet.paths.gz"
    with pytest.raises(DownloadError) as exc:
        list_wet_paths(UNRESOLVABLE, C14, files=1, fetcher=f)
    assert str(exc.value).startswith(f"{url}: name resolution failed (offline?)")
    assert "\n" not in str(exc.value)
    assert not [line for line in log_lines if "retrying" in line]  # not one retry
    assert not (f.cache_dir / f"crawl-data/{C14}/wet.paths.gz").exists()


def test_a_refused_connection_is_still_retried(tmp_path, log_lines):
    """A port with no server behind it: the network is there, the server is not (yet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens on it
    f = Fetcher(tmp_path / "c", retries=2, backoff=0.001, max_backoff=0.01, timeout=5)
    url = f"http://127.0.0.1:{port}/crawl-data/{C14}/wet.paths.gz"
    with pytest.raises(DownloadError, match=re.escape(f"giving up on {url} after 3 attempts")):
        f.local_path(url)
    assert len([line for line in log_lines if "retrying" in line]) == 2


@pytest.mark.parametrize("command", ["plan", "run"])
def test_plan_and_run_offline_say_so_in_one_line(tmp_path, command):
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "input": {
            "commoncrawl": {"crawl": C14, "files": 2, "base_url": UNRESOLVABLE, "cache_dir": str(tmp_path / "cache")}
        },
        "steps": ["gopher_quality"],
    }
    path = tmp_path / "cc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = pipeline(command, str(path), timeout=120)
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.splitlines()  # the resolver's own words follow, e.g. "Name or service not known"
    assert line.startswith(f"error: {UNRESOLVABLE}/crawl-data/{C14}/wet.paths.gz: name resolution failed (offline?)")
    assert not (tmp_path / "run").exists()
