"""A whole-object download from a store (a model given as a URL: `storage.cached_copy`) has a
deadline, timeout_s + its size at storage.min_rate_bytes_s: an S3 server (tests/s3_server.py)
behind tests/fault_proxy.py that sends the object a byte every 0.2 s fails the download in one
line, with no partial copy left, where s3fs's per-read timeouts would wait for ever."""

from __future__ import annotations

import os
import re

import pytest

from gristmill.core import storage
from tests.fault_proxy import FaultProxy

from ..conftest import _missing
from ..s3_server import BUCKET, S3Server

pytestmark = [pytest.mark.network, pytest.mark.xdist_group("s3")]


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
    import s3fs

    with FaultProxy(s3.endpoint) as p:
        for k, v in s3.env(endpoint=p.url).items():
            monkeypatch.setenv(k, v)
        s3fs.S3FileSystem.clear_instance_cache()
        yield p
        s3fs.S3FileSystem.clear_instance_cache()
        storage.configure(None)


def test_a_dripping_download_fails_at_its_deadline_in_one_line(proxy, s3, tmp_path):
    data = os.urandom(20_000)
    s3.client().put_object(Bucket=BUCKET, Key="models/slow.bin", Body=data)
    url = f"s3://{BUCKET}/models/slow.bin"
    storage.configure(storage.StorageConfig(scratch_dir=str(tmp_path), timeout_s=1, min_rate_bytes_s=10_000))
    proxy.add("drip", path=r"/models/slow\.bin$", times=100)  # every GET of it (s3fs retries some)
    with pytest.raises(storage.StorageError) as e:
        storage.cached_copy(url)
    assert re.fullmatch(
        rf"{re.escape(url)}: not transferred within 3 s \(20,000 bytes: storage\.timeout_s \+ the size at"
        r" storage\.min_rate_bytes_s, 10,000 bytes/s\): the server is too slow or drips",
        str(e.value),
    ), str(e.value)
    assert [r.fault for r in proxy.seen(r"slow\.bin$")][:1] == ["drip"]
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no partial copy
    # the same object at full speed: downloaded whole
    proxy.clear()
    assert storage.cached_copy(url).read_bytes() == data
