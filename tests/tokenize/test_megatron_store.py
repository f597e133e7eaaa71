"""`pipeline tokens export --format megatron -o s3://...`: all or nothing on a store.

On an S3-protocol server (moto's, request signing checked: tests/s3_server.py) behind
tests/fault_proxy.py: a re-export over an earlier one that is refused one upload, killed (SIGKILL)
right before and right after its commit, or overtaken by another export, leaves `export.json`
naming one export whose every file is whole and reads back with megatron-core as the run it came
from, never a mix; what a failed or killed export left is gone after the next one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from gristmill.core import storage
from gristmill.tokenize import open_tokens
from gristmill.tokenize.megatron import POINTER, StoreFolder, export_paths, write_megatron
from tests.cli_process import pipeline
from tests.fault_proxy import FaultProxy

from ..conftest import REPO, _missing
from ..s3_server import BUCKET, S3Server

pytestmark = [pytest.mark.network, pytest.mark.slow, pytest.mark.xdist_group("s3")]
PYTHON_ENV = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
ACCESS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied</Message>'
    b"<RequestId>FAULTPROXY</RequestId></Error>"
)
EXPORT_FOLDER = re.compile(r"export-\d{8}T\d{6}Z-[0-9a-f]{8}")


@pytest.fixture(scope="module")
def megatron():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import megatron.core.datasets.indexed_dataset as module
        except ImportError as e:
            _missing(f"megatron-core ({e})")
    return module


@pytest.fixture(scope="module")
def s3():
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as e:
        _missing(f"moto[server] and s3fs ({e})")
    server = S3Server.start()
    yield server
    server.stop()


@pytest.fixture
def proxy(s3, monkeypatch):
    with FaultProxy(s3.endpoint) as p:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        p.env = {**env, **PYTHON_ENV, **s3.env(endpoint=p.url)}
        for k, v in s3.env(endpoint=p.url).items():  # this process's own reads (export_paths, StoreFolder)
            monkeypatch.setenv(k, v)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()  # one made for an earlier test's proxy would be reused
        yield p
        s3fs.S3FileSystem.clear_instance_cache()


def _objects(s3: S3Server, prefix: str) -> dict[str, bytes]:
    client, out = s3.client(), {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1 :]] = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    return out


def _uploads(s3: S3Server, prefix: str) -> list[str]:
    return [u["Key"] for u in s3.client().list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])]


def _export(proxy, run_dir: Path, url: str) -> subprocess.CompletedProcess:
    return pipeline("tokens", "export", run_dir, "--format", "megatron", "-o", url, env=proxy.env, timeout=600)


def _folders(objects: dict[str, bytes]) -> set[str]:
    return {k.split("/", 1)[0] for k in objects if "/" in k}


def _reads_as(megatron, objects: dict[str, bytes], run_dir: Path, tmp: Path) -> None:
    """export.json names one export; megatron-core reads its every split as `run_dir`'s documents."""
    pointer = json.loads(objects[POINTER])
    toks = open_tokens(run_dir)
    assert sorted(pointer["splits"]) == sorted(toks.splits)
    for split, entry in pointer["splits"].items():
        local = tmp / entry["prefix"]
        local.parent.mkdir(parents=True, exist_ok=True)
        for ext in ("bin", "idx"):
            local.with_name(f"{split}.{ext}").write_bytes(objects[f"{entry['prefix']}.{ext}"])
        ds = megatron.IndexedDataset(str(local))
        ours = list(toks.documents(split))
        assert len(ds) == len(ours) == entry["documents"] > 0, split
        assert all(np.array_equal(ds[i], doc.astype(np.int64)) for i, doc in enumerate(ours)), split


def test_a_refused_upload_leaves_the_earlier_export_whole(proxy, s3, megatron, gpt2_run, cl100k_run, tmp_path):
    url = f"s3://{BUCKET}/meg-403"
    # what an earlier version left at the prefix: the flat layout and a temporary object
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key="meg-403/train.bin", Body=b"a flat export of an earlier version")
    client.put_object(Bucket=BUCKET, Key="meg-403/.val.idx.4242.tmp", Body=b"its temporary object")
    client.put_object(Bucket=BUCKET, Key="meg-403/notes.txt", Body=b"the user's")
    # and a killed export's unfinished multipart upload: stored (and billed), though no object shows
    killed = "meg-403/export-20200101T000000Z-deadbeef/train.bin"
    up = client.create_multipart_upload(Bucket=BUCKET, Key=killed)["UploadId"]
    client.upload_part(Bucket=BUCKET, Key=killed, UploadId=up, PartNumber=1, Body=b"x" * (5 << 20))
    assert _uploads(s3, "meg-403/") == [killed]
    first = _export(proxy, gpt2_run, url)
    assert first.returncode == 0, first.stderr
    assert not _uploads(s3, "meg-403/")
    before = _objects(s3, "meg-403")
    (folder,) = _folders(before)
    assert EXPORT_FOLDER.fullmatch(folder)
    assert sorted(before) == sorted(
        [POINTER, "notes.txt", *(f"{folder}/{n}" for n in (".started", "train.bin", "train.idx", "val.bin", "val.idx"))]
    )  # the flat files are gone: nothing stale stays readable beside the named export
    assert f"--train-data-path {url}/{folder}/train --valid-data-path {url}/{folder}/val" in first.stderr
    assert export_paths(url) == {"train": f"{url}/{folder}/train", "val": f"{url}/{folder}/val"}
    _reads_as(megatron, before, gpt2_run, tmp_path / "first")

    # another run over it, the upload of its val.idx refused once
    proxy.clear()
    proxy.add("status", method="PUT", path=r"/meg-403/export-[^/]+/val\.idx$", status=403, body=ACCESS_DENIED)
    res = _export(proxy, cl100k_run, url)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "val.idx" in lines[0], res.stderr
    assert re.fullmatch(rf"error: .*{url}/export-[^/]+/val\.idx.*access denied.*", lines[0], re.I), lines[0]
    assert [r.status for r in proxy.seen(r"val\.idx$", "PUT")] == [403]
    after = _objects(s3, "meg-403")
    assert after == before  # the earlier export named and whole, nothing of the refused one left
    assert not _uploads(s3, "meg-403/")
    assert s3.secret not in res.stderr


@pytest.mark.parametrize("when", ["before", "after"])
def test_sigkill_at_the_commit_gives_one_whole_export(proxy, s3, megatron, gpt2_run, cl100k_run, tmp_path, when):
    """SIGKILL of the exporting process just before, or just after, its one PUT of export.json
    (a hook the test installs into the process): export.json names the earlier export or the new
    one, whole; the next export removes the killed one's folder and keeps the one it replaces."""
    url = f"s3://{BUCKET}/meg-kill-{when}"
    prefix = url.split("/", 3)[3]
    assert _export(proxy, gpt2_run, url).returncode == 0
    earlier = _objects(s3, prefix)
    hook = (
        "import os, signal, sys\n"
        "import gristmill.tokenize.megatron as m\n"
        "put = m._put_pointer\n"
        "def kill(*a, **k):\n"
        f"    if {when == 'after'}:\n"
        "        put(*a, **k)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "m._put_pointer = kill\n"
        "import gristmill.cli\n"
        "sys.exit(gristmill.cli.main(sys.argv[1:]))\n"
    )
    args = ["tokens", "export", str(cl100k_run), "--format", "megatron", "-o", url]
    res = subprocess.run(
        [sys.executable, "-c", hook, *args], env=proxy.env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == -signal.SIGKILL, res.stderr
    killed = _objects(s3, prefix)
    (old,) = _folders(earlier)
    (new,) = _folders(killed) - {old}
    assert {k: v for k, v in killed.items() if not k.startswith(new) and k != POINTER} == {
        k: v for k, v in earlier.items() if k != POINTER
    }  # the earlier export untouched either way
    named = json.loads(killed[POINTER])["export"]
    assert named == (new if when == "after" else old)
    _reads_as(megatron, killed, cl100k_run if when == "after" else gpt2_run, tmp_path / "killed")

    # the next export: committed, the killed one's leftovers removed, the one it replaces kept
    assert _export(proxy, gpt2_run, url).returncode == 0
    final = _objects(s3, prefix)
    (latest,) = _folders(final) - {old, new}
    assert _folders(final) == {latest, named}
    assert json.loads(final[POINTER])["export"] == latest
    _reads_as(megatron, final, gpt2_run, tmp_path / "final")
    # and the one after that deletes the export that is two behind
    assert _export(proxy, gpt2_run, url).returncode == 0
    assert len(_folders(_objects(s3, prefix)) - {latest}) == 1 and latest in _folders(_objects(s3, prefix))
    assert not _uploads(s3, prefix + "/")


def test_an_export_overtaken_by_another_commits_nothing(proxy, s3, gpt2_run, cl100k_run):
    """Two exports to one prefix: one begins, the other begins later and commits first. The
    first then fails in one line; export.json names the second, and nothing of the first is left.
    """
    url = f"s3://{BUCKET}/meg-race"
    slow, fast = StoreFolder(url), StoreFolder(url)
    with slow.open("train.bin") as f:  # it has begun (and written a file) before the other commits
        f.write(b"")
    write_megatron(open_tokens(gpt2_run), fast, open_tokens(gpt2_run).splits)
    with pytest.raises(storage.StorageError) as e:
        write_megatron(open_tokens(cl100k_run), slow, open_tokens(cl100k_run).splits)
    line = str(e.value)
    # Either the other's commit removed this one's folder (it began in an earlier second of the
    # store's clock than that commit), found before committing; or the folder was kept (same
    # second: it might have begun after) and this commit's If-Match failed
    gone = (
        rf"{url}/{slow.export}/train\.bin: is gone, not the \d[\d,]* written \(removed while the export ran: another"
        rf" export to {url}\?\); nothing committed, {url}/export\.json unchanged"
    )
    raced = (
        rf"{url}/export\.json: another export was committed to {url} while this one ran; this one is discarded and"
        r" that one stands \(run again to replace it\)"
    )
    assert re.fullmatch(f"{gone}|{raced}", line), line
    objects = _objects(s3, "meg-race")
    assert _folders(objects) == {fast.export}
    assert json.loads(objects[POINTER])["export"] == fast.export
