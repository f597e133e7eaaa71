"""list_wet_paths and Fetcher against a Common-Crawl-like mirror, local and over loopback HTTP.

The HTTP server supports Range requests and injects faults per path (S3 SlowDown, 429,
a connection dropped mid-body, ignoring Range), and records every request it saw.
"""

from __future__ import annotations

import gzip
import re
import threading
from pathlib import Path

import pytest

from gristmill.pipeline.commoncrawl import DownloadError, Fetcher, list_wet_paths

from .conftest import C14, C17, REL14A, REL14B, REL17, SEG14, hits, sha256

pytestmark = pytest.mark.network

# --- listing -----------------------------------------------------------------------------------

def test_list_first_n_and_all_remote(server, fetcher):
    assert list_wet_paths(server.base, C14, files=1, fetcher=fetcher) == [f"{server.base}/{REL14A}"]
    assert list_wet_paths(server.base + "/", C14, fetcher=fetcher) == [f"{server.base}/{REL14A}", f"{server.base}/{REL14B}"]
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
