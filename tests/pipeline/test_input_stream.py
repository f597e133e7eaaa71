"""Common Crawl streamed without a local copy (`input.commoncrawl.cache: none`), over loopback
HTTP and from an S3 server (moto's, on 127.0.0.1), with tests/fault_proxy.py in front of each:
connections reset, cut short and stalled mid-body, throttling, a server that ignores Range, an
object that changes between two reads. Every read is compared with reading the local file.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from gristmill.config import from_dict
from gristmill.input.commoncrawl import Fetcher, list_wet_paths
from gristmill.input.stream import DownloadError
from gristmill.input.wet import WetReader
from gristmill.pipeline.planning.projection import load_calibration, plan_for_size, project, render
from gristmill.pipeline.report.journey import journey, journey_notes
from gristmill.pipeline.runner import run
from tests.cli_process import pipeline
from tests.conftest import REPO
from tests.fault_proxy import FaultProxy

from .conftest import C14, C17, REL14A, REL17, _Handler

pytestmark = [pytest.mark.network, pytest.mark.xdist_group("cc_stream")]

SLOWDOWN_SAID = "HTTP 503 SlowDown 'Please reduce your request rate.'"
HTML = b"<!DOCTYPE html><html><head><title>Access denied</title></head><body>blocked</body></html>"
BUCKET = "commoncrawl"
KEY_WET = REL14A


class _ValidatorHandler(_Handler):
    """The conftest mirror, answering with an ETag (a hash of the content) and Last-Modified, as
    Common Crawl's servers do."""

    def end_headers(self):
        file = self.server.root / self.path.split("?")[0].lstrip("/")
        if ".." not in self.path and file.is_file():
            self.send_header("ETag", '"' + hashlib.sha1(file.read_bytes()).hexdigest() + '"')
            self.send_header("Last-Modified", email.utils.formatdate(file.stat().st_mtime, usegmt=True))
        super().end_headers()


@pytest.fixture
def proxy(server):
    server.RequestHandlerClass = _ValidatorHandler
    with FaultProxy(server.base) as p:
        p.root = server.root
        yield p


def streaming(**kw) -> Fetcher:
    """A Fetcher that streams (cache: none); its cache folder must never be created."""
    args = {"retries": 4, "backoff": 0.001, "max_backoff": 0.01, "timeout": 5, "cache": "none"}
    return Fetcher("/nonexistent/gristmill-cache", **{**args, **kw})


def documents(sources: list[str], resolve=None) -> tuple[list[tuple], dict[str, int]]:
    """(id, text, metadata without `source`) of every document, and the reader's stats."""
    reader = WetReader(sources, resolve=resolve)
    docs = [(d.id, d.text, {k: v for k, v in d.metadata.items() if k != "source"}) for d in reader.run()]
    return docs, {k: v.total for k, v in reader.stats.stats.items()}


@pytest.fixture(scope="module")
def local_docs(wet_files):
    return {REL14A: documents([str(wet_files[0])])[0], REL17: documents([str(wet_files[1])])[0]}


# --- over HTTP ---------------------------------------------------------------------------------


def test_stream_reads_the_file_exactly_and_writes_nothing(proxy, wet_files, local_docs):
    url = f"{proxy.url}/{REL14A}"
    f = streaming(read_bytes=64 << 10)
    with f.open(url) as stream:
        first = stream.read(10 << 20)
        data = first + stream.read()
        while chunk := stream.read(1 << 20):
            data += chunk
    assert 0 < len(first) <= 64 << 10  # what has arrived, never more than read_bytes at a time
    assert data == wet_files[0].read_bytes()
    assert stream.counters["download_bytes"] == len(data) and stream.counters["http_requests"] == 1
    docs, stats = documents([url], resolve=f.open)
    assert docs == local_docs[REL14A]
    assert stats["download_bytes"] == len(data) and "http_retries" not in stats
    assert not Path("/nonexistent").exists()


def test_connection_lost_at_20_points_gives_the_same_documents(proxy, wet_files, local_docs):
    """Reset (RST) or closed (a body short of its Content-Length) at 20 offsets across the file:
    each time the reader resumes with a Range request and reads every record exactly once."""
    size = wet_files[0].stat().st_size
    url = f"{proxy.url}/{REL14A}"
    for i in range(20):
        at = int(size * (i + 0.5) / 20)
        kind = ("reset", "cut")[i % 2]
        proxy.clear()
        proxy.add(kind, path=REL14A, after=at, ranged=False)
        docs, stats = documents([url], resolve=streaming().open)
        assert docs == local_docs[REL14A], (kind, at)
        gets = proxy.seen(REL14A)
        assert [g.fault for g in gets] == [kind, None], (kind, at)
        start = int(re.fullmatch(r"bytes=(\d+)-", gets[1].range).group(1))
        # a clean close delivers every byte sent; a reset may lose what was in flight
        assert start == at if kind == "cut" else 0 < start <= at, (kind, at, start)
        assert stats["download_bytes"] == size and stats["http_resumed"] == 1
        assert stats["http_retries"] == 1 and stats[f"http_retries_{'short_body' if kind == 'cut' else 'reset'}"] == 1


def test_stalled_response_times_out_and_resumes(proxy, local_docs, log_lines):
    proxy.add("stall", path=REL14A, after=200_000, stall_s=10, ranged=False)
    url = f"{proxy.url}/{REL14A}"
    docs, stats = documents([url], resolve=streaming(timeout=0.3).open)
    assert docs == local_docs[REL14A]
    assert stats["http_retries_timeout"] == 1
    assert proxy.seen(REL14A)[1].range == "bytes=200000-"
    assert any(url in line and "stalled" in line for line in log_lines)


def test_throttling_is_retried_and_counted_by_status(proxy, local_docs):
    proxy.add("slowdown", path=REL17, times=2)
    for status in (429, 500, 502, 504):
        proxy.add("status", path=REL17, status=status, body=b"busy", headers={"Retry-After": "0"})
    docs, stats = documents([f"{proxy.url}/{REL17}"], resolve=streaming(retries=8).open)
    assert docs == local_docs[REL17]
    assert [g.status for g in proxy.seen(REL17)] == [503, 503, 429, 500, 502, 504, 200]
    assert stats["http_retries"] == 6 and stats["http_requests"] == 7
    assert {k: v for k, v in stats.items() if k.startswith("http_retries_")} == {
        "http_retries_503": 2,
        "http_retries_429": 1,
        "http_retries_500": 1,
        "http_retries_502": 1,
        "http_retries_504": 1,
    }


def test_retries_run_out_in_one_line(proxy):
    proxy.add("slowdown", path=REL17, times=10)
    url = f"{proxy.url}/{REL17}"
    with pytest.raises(DownloadError) as exc:
        documents([url], resolve=streaming(retries=2).open)
    assert (
        str(exc.value) == f"giving up on {url} after 3 attempts: HTTP 503 SlowDown 'Please reduce your request rate.'"
    )
    assert len(proxy.seen(REL17)) == 3  # the first try and 2 retries


def test_other_answers_fail_at_once(proxy):
    url = f"{proxy.url}/crawl-data/{C17}/segments/x/wet/missing.warc.wet.gz"
    with pytest.raises(DownloadError, match=re.escape(url) + r": HTTP 404 NoSuchKey$"):
        streaming().open(url).read()
    assert len(proxy.seen("missing")) == 1


def test_html_page_served_with_200_is_retried(proxy, local_docs):
    proxy.add("status", path=REL17, status=200, body=HTML, headers={"Content-Type": "text/html"})
    docs, stats = documents([f"{proxy.url}/{REL17}"], resolve=streaming().open)
    assert docs == local_docs[REL17] and stats["http_retries_bad_answer"] == 1
    proxy.add("status", path=REL17, status=200, body=HTML, headers={"Content-Type": "text/html"}, times=9)
    with pytest.raises(DownloadError, match=r"got a body starting '<!DOCTYPE html>.*' \(text/html\) instead of gzip"):
        documents([f"{proxy.url}/{REL17}"], resolve=streaming(retries=1).open)


def test_a_200_answer_to_a_range_request_duplicates_nothing(proxy, wet_files, local_docs):
    proxy.add("cut", path=REL14A, after=500_000, ranged=False)
    proxy.add("ignore_range", path=REL14A, ranged=True)
    docs, stats = documents([f"{proxy.url}/{REL14A}"], resolve=streaming(read_bytes=100_000).open)
    assert docs == local_docs[REL14A]
    assert [g.status for g in proxy.seen(REL14A)] == [200, 200]  # the second ignored `bytes=500000-`
    assert stats["http_range_ignored"] == 1 and stats["http_bytes_dropped"] == 500_000
    assert stats["download_bytes"] == wet_files[0].stat().st_size


def test_file_changed_between_ranges_fails_rather_than_splice(proxy, wet_files):
    def replace(path):  # the file is rewritten on the server between the cut and the resume
        target = proxy.root / path.lstrip("/")
        data = bytearray(wet_files[0].read_bytes())
        target.unlink()  # a symlink to the shared sample: never written through
        target.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 1]))

    proxy.add("cut", path=REL14A, after=400_000, ranged=False, then=replace)
    url = f"{proxy.url}/{REL14A}"
    with pytest.raises(DownloadError) as exc:
        documents([url], resolve=streaming().open)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f'{url} changed while being read (ETag was "')
    assert msg.endswith("at byte 400,000; not splicing two versions: run again to read the new one from its start")
    assert proxy.seen(REL14A)[1].headers.get("If-Match", "").startswith('"')  # asked the server to check too


@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_a_name_that_does_not_resolve_is_not_retried(log_lines, monkeypatch, scheme):
    # `.invalid` never resolves (RFC 6761), and the lookup fails without a network
    url = f"http://data.commoncrawl.invalid/{REL17}" if scheme == "http" else f"s3://{BUCKET}/{REL17}"
    if scheme == "s3":
        _hermetic_aws(monkeypatch)
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://s3.commoncrawl.invalid")
    with pytest.raises(DownloadError, match=re.escape(url) + r": name resolution failed \(offline\?\)"):
        streaming().open(url).read()
    assert not [line for line in log_lines if "retrying" in line]


def test_listing_is_streamed_too(proxy):
    f = streaming()
    assert list_wet_paths(proxy.url, C14, files=1, fetcher=f) == [f"{proxy.url}/{REL14A}"]
    assert len(proxy.seen(f"crawl-data/{C14}/wet.paths.gz")) == 1


# --- from an S3 server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_s3(wet_files):
    """moto's S3 server on 127.0.0.1 (in this process, its own thread) with a `commoncrawl`
    bucket holding two crawls' listings and WET files, readable without credentials."""
    moto_server = pytest.importorskip("moto.server", reason="moto (the test extra) is not installed")
    import botocore.session

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    with pytest.MonkeyPatch.context() as mp:
        _hermetic_aws(mp)
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            url = f"http://{host}:{port}"
            client = botocore.session.get_session().create_client(
                "s3", region_name="us-east-1", endpoint_url=url, aws_access_key_id="k", aws_secret_access_key="s"
            )
            client.create_bucket(Bucket=BUCKET, ACL="public-read")
            objects = {
                f"crawl-data/{C14}/wet.paths.gz": _gzip(f"{REL14A}\n"),
                f"crawl-data/{C17}/wet.paths.gz": _gzip(f"{REL17}\n"),
                REL14A: wet_files[0].read_bytes(),
                REL17: wet_files[1].read_bytes(),
            }
            for key, body in objects.items():
                client.put_object(Bucket=BUCKET, Key=key, Body=body, ACL="public-read")
            yield url, client
        finally:
            server.stop()


def _gzip(text: str) -> bytes:
    import gzip

    return gzip.compress(text.encode())


def _hermetic_aws(mp: pytest.MonkeyPatch) -> None:
    """No credentials, profile or config of this machine; never the instance metadata service."""
    for var in list(os.environ):
        if var.startswith("AWS_"):
            mp.delenv(var)
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
    mp.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        mp.delenv(var, raising=False)


@pytest.fixture
def s3(moto_s3, monkeypatch):
    """The fault proxy in front of moto; botocore pointed at it by AWS_ENDPOINT_URL, anonymous."""
    url, client = moto_s3
    _hermetic_aws(monkeypatch)
    with FaultProxy(url) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
        p.client = client
        yield p


S3_WET = f"s3://{BUCKET}/{REL14A}"


def test_s3_stream_resumes_and_counts_without_botocore_retrying(s3, local_docs):
    s3.add("slowdown", path=REL14A, times=2)
    s3.add("reset", path=REL14A, after=300_000, ranged=False)
    s3.add("cut", path=REL14A, after=100_000, ranged=True)
    docs, stats = documents([S3_WET], resolve=streaming().open)
    assert docs == local_docs[REL14A]
    gets = s3.seen(REL14A)
    # botocore's own retries are off: every attempt is ours, and counted
    assert [g.fault for g in gets] == ["slowdown", "slowdown", "reset", "cut", None]
    assert gets[-1].range == f"bytes={int(gets[3].range[6:-1]) + 100_000}-"
    assert stats["http_retries_503"] == 2 and stats["http_retries"] == 4 and stats["http_resumed"] == 2
    assert "Authorization" not in gets[0].headers  # no credentials here: anonymous, unsigned


def test_s3_signed_when_credentials_exist_and_they_never_show(s3, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDGRISTMILLTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-never-shown")
    s3.add("slowdown", path=REL17, times=10)
    with pytest.raises(DownloadError) as exc:
        streaming(retries=1).open(f"s3://{BUCKET}/{REL17}").read()
    assert s3.seen(REL17)[0].headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDGRISTMILLTEST/")
    assert str(exc.value) == (
        f"giving up on s3://{BUCKET}/{REL17} after 2 attempts: HTTP 503 SlowDown 'Please reduce your request rate.'"
    )


def test_s3_stalled_response_times_out_and_resumes(s3, local_docs):
    s3.add("stall", path=REL14A, after=250_000, stall_s=10, ranged=False)
    docs, stats = documents([S3_WET], resolve=streaming(timeout=0.5).open)
    assert docs == local_docs[REL14A]
    assert stats["http_retries_timeout"] == 1 and s3.seen(REL14A)[1].range == "bytes=250000-"


def test_s3_object_replaced_between_ranges_fails_in_one_line(s3, wet_files):
    original = wet_files[1].read_bytes()

    def replace(path):
        s3.client.put_object(
            Bucket=BUCKET, Key=REL17, Body=original[:-1] + bytes([original[-1] ^ 1]), ACL="public-read"
        )

    s3.add("cut", path=REL17, after=50_000, ranged=False, then=replace)
    try:
        with pytest.raises(DownloadError) as exc:
            documents([f"s3://{BUCKET}/{REL17}"], resolve=streaming().open)
    finally:
        s3.client.put_object(Bucket=BUCKET, Key=REL17, Body=original, ACL="public-read")
    assert str(exc.value).startswith(
        f's3://{BUCKET}/{REL17} changed while being read (the server answered 412 to If-Match: "'
    )
    assert "at byte 50,000; not splicing two versions" in str(exc.value)


def test_s3_missing_listing_is_one_line(s3):
    with pytest.raises(DownloadError) as exc:
        list_wet_paths(f"s3://{BUCKET}", "CC-MAIN-1999-01", files=1, fetcher=streaming())
    assert str(exc.value) == (
        f"s3://{BUCKET}/crawl-data/CC-MAIN-1999-01/wet.paths.gz: HTTP 404 NoSuchKey 'The specified key does not exist.'"
    )


def test_s3_cache_keep_downloads_a_verified_copy(s3, tmp_path, wet_files):
    s3.add("reset", path=REL14A, after=700_000, ranged=False)
    f = Fetcher(tmp_path / "cache", retries=4, backoff=0.001, max_backoff=0.01, timeout=5, cache="keep")
    assert f.open(S3_WET) == tmp_path / "cache" / REL14A
    assert (tmp_path / "cache" / REL14A).read_bytes() == wet_files[0].read_bytes()
    assert (tmp_path / "cache" / (REL14A + ".ok")).is_file()
    assert f.open(S3_WET) == tmp_path / "cache" / REL14A and len(s3.seen(REL14A)) == 2  # cached: no third GET


def _cc_config(tmp_path: Path, **cc) -> dict:
    return {
        "run_dir": str(tmp_path / "run"),
        "executor": {"type": "local", "tasks": 2, "workers": 2},
        "input": {
            "commoncrawl": {
                "crawl": C14,
                "files": 1,
                "source": "s3",
                "cache_dir": str(tmp_path / "cache"),
                "backoff_s": 0.01,
                **cc,
            }
        },
        "steps": [{"gopher_quality": {}}],
        "output": {"dropped_sample": 0},
    }


def test_s3_run_streams_to_the_same_documents_as_a_local_copy(s3, tmp_path, wet_files, local_docs):
    """A whole run (the reader alone: every record becomes a document) from s3:// through the
    faults, against the reader on the local file."""
    s3.add("slowdown", path=REL14A, times=1)
    s3.add("reset", path=REL14A, after=600_000, ranged=False)
    merged = run(from_dict({**_cc_config(tmp_path), "steps": []}))
    got = pq.read_table(tmp_path / "run" / "01_curate" / "output").to_pylist()
    assert [(d["id"], d["text"], d["url"], d["offset"]) for d in got] == [
        (i, text, meta["url"], meta["offset"]) for i, text, meta in local_docs[REL14A]
    ]
    assert {d["source"] for d in got} == {S3_WET}
    assert not (tmp_path / "cache").exists()  # nothing on disk but the run's own output
    stats = json.loads((tmp_path / "run" / "01_curate" / "stats.json").read_text())
    reader = next(s for s in stats if s["name"].endswith("read_wet"))["counters"]
    assert reader["http_retries_503"] == 1 and reader["http_retries_reset"] == 1 and reader["http_resumed"] == 1
    assert reader["download_bytes"] == wet_files[0].stat().st_size and reader["http_requests"] == 3
    # and `pipeline stats` says so on the reader's row
    assert "1.4 MB downloaded, 2 retries (503: 1, reset: 1)" in journey_notes(journey(merged)[0])


def test_s3_failure_is_one_line_from_the_cli(s3, tmp_path):
    s3.add("slowdown", path=REL14A, times=50)
    cfg = tmp_path / "cc.yaml"
    cfg.write_text(yaml.safe_dump(_cc_config(tmp_path, retries=1)))
    res = pipeline("run", str(cfg), timeout=120)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    want = f"giving up on {S3_WET} after 2 attempts: HTTP 503 SlowDown 'Please reduce your request rate.'"
    assert [line for line in res.stderr.splitlines() if want in line], res.stderr[-2000:]


# --- config and plan ---------------------------------------------------------------------------


def test_source_sets_the_base_url_and_must_agree_with_it():
    cc = from_dict(_cc_config(Path("/tmp/x"))).input.commoncrawl
    assert (cc.source, cc.base_url, cc.cache) == ("s3", "s3://commoncrawl", "none")
    cc = from_dict({**_cc_config(Path("/tmp/x")), "input": {"commoncrawl": {"crawl": C14, "files": 1}}}).input
    assert (cc.commoncrawl.source, cc.commoncrawl.base_url) == ("https", "https://data.commoncrawl.org")
    with pytest.raises(ValueError, match=r"input\.commoncrawl.*s3:// base_url needs source: s3"):
        from_dict(_cc_config(Path("/tmp/x"), base_url="https://data.commoncrawl.org"))


@pytest.mark.parametrize(
    "cc, ingress, cache, note",
    [
        ({}, "150.0 GB", "0 B", "streamed from s3://commoncrawl, nothing kept on disk (cache: none)"),
        ({"cache": "keep"}, "150.0 GB", "150.0 GB", "(cache: keep)"),
        ({"source": "https", "base_url": "/mnt/cc"}, "0 B", "0 B", "input read in place from /mnt/cc"),
    ],
    ids=["stream", "keep", "mirror"],
)
def test_plan_shows_ingress_and_cache_disk(tmp_path, cc, ingress, cache, note):
    cfg = from_dict(_cc_config(tmp_path, **cc))
    stages, size = plan_for_size(cfg, 150, None)
    header, rows, footer = render(project(cfg, stages, 150, load_calibration(), None), 150, None, False)
    curate = dict(zip(header, rows[0]))
    assert (curate["stage"], curate["ingress"], curate["cache"]) == ("01_curate", ingress, cache)
    assert note in next(line for line in footer if line.startswith("ingress:"))


def test_pipeline_plan_json_has_ingress_per_stage(tmp_path):
    cfg = tmp_path / "cc.yaml"
    cfg.write_text(yaml.safe_dump({**_cc_config(tmp_path), "steps": [{"exact_dedup": {}}]}))
    res = pipeline("plan", str(cfg), "--gb", "150", "--json", timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    stages = json.loads(res.stdout)["stages"]
    assert len(stages) > 1 and (stages[0]["ingress"], stages[0]["cache"]) == ("150.0 GB", "0 B")
    assert all(s["ingress"] == "0 B" for s in stages[1:])  # later stages read the run's own files
