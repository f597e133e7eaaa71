"""The lock object of a run directory on object storage, malformed every way a hand, a tool or a
damaged store can leave it (tests/s3_server.py's server, request signing checked): each gives one
line naming the lock object and the `--force-lock` that takes it over, never a traceback and never
a silent takeover; the name it gives takes over exactly that object. And a lease no renewal thread
can sleep for is refused when the config is validated."""

from __future__ import annotations

import json
import re
import time

import pytest

from gristmill.config import ConfigError, from_dict
from gristmill.core import storage
from gristmill.pipeline.rundir import lease

from ..conftest import _missing
from ..s3_server import BUCKET, S3Server

pytestmark = [pytest.mark.network, pytest.mark.xdist_group("s3")]
GOOD = {"holder": "elsewhere:4242:abc123", "host": "elsewhere", "pid": 4242, "command": ["pipeline", "run"]}


@pytest.fixture(scope="module")
def s3():
    try:
        import moto.server  # noqa: F401
        import s3fs
    except ImportError as e:
        _missing(f"moto[server] and s3fs ({e})")
    server = S3Server.start()
    s3fs.S3FileSystem.clear_instance_cache()
    yield server
    server.stop()
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def store(s3, monkeypatch):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    storage.configure(storage.StorageConfig(s3={"endpoint_url": s3.endpoint}))
    yield s3
    storage.configure(None)


def _future() -> float:
    return time.time() + 3600


def _raw(field: str) -> str:
    """A lock with `field` written as is (what json.dumps would not write)."""
    return json.dumps({**GOOD, "since": 1.0})[:-1] + f", {field}}}"


MALFORMED = {
    "expires null": (lambda: json.dumps({**GOOD, "since": 1.0, "expires": None}), r"expires is None, not a time"),
    "expires 1e309": (lambda: _raw('"expires": 1e309'), r"expires is inf, not a time"),
    "expires 'NaN'": (lambda: json.dumps({**GOOD, "since": 1.0, "expires": "NaN"}), r"expires is 'NaN', not a time"),
    "expires NaN": (lambda: _raw('"expires": NaN'), r"not JSON \(NaN is no JSON number\)"),
    "expires 1e300": (lambda: json.dumps({**GOOD, "since": 1.0, "expires": 1e300}), r"expires is 1e\+300, not a time"),
    "since missing": (lambda: json.dumps({**GOOD, "expires": _future()}), r"since is None, not a time"),
    "no holder": (lambda: json.dumps({"since": 1.0, "expires": _future()}), r"holder is None, not a name"),
    "command a string": (
        lambda: json.dumps({**GOOD, "since": 1.0, "expires": _future(), "command": "rm -rf"}),
        r"command is 'rm -rf', not a list of words",
    ),
    "not JSON": (lambda: "\x00\x01 garbage", r"not JSON \(.*\)"),
    "empty": (lambda: "", r"not JSON \(.*\)"),
    "a list": (lambda: "[1, 2]", r"a JSON list, not an object"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_lock_is_one_line_and_taken_over_only_by_its_name(store, case):
    body, why = MALFORMED[case]
    prefix = f"malformed-{case.replace(' ', '-').replace(chr(39), '')}"
    url = f"s3://{BUCKET}/{prefix}"
    store.client().put_object(Bucket=BUCKET, Key=f"{prefix}/.gristmill.lock", Body=body().encode())
    with pytest.raises(lease.LeaseHeld) as e:
        lease.acquire(url, ttl=60, command=["second"])
    line = str(e.value)
    assert "\n" not in line
    m = re.fullmatch(
        rf"{re.escape(url)}/\.gristmill\.lock: the run directory's lock object is not one this gristmill can read"
        rf" \(({why})\); if no run uses {re.escape(url)}, take it over with --force-lock (malformed:[0-9a-f]+)",
        line,
    )
    assert m, line
    # a wrong name is refused the same way; the name given takes over that object, and only it
    with pytest.raises(lease.LeaseHeld):
        lease.acquire(url, ttl=60, force_lock="elsewhere:4242:abc123", command=["second"])
    taken = lease.acquire(url, ttl=60, force_lock=m.group(2), command=["second"])
    held = lease.read(taken.url)
    assert held is not None and held.malformed is None and held.holder == taken.holder


def test_a_well_formed_expired_lock_is_still_taken_over(store):
    prefix = "wellformed"
    info = {**GOOD, "since": 1.0, "expires": 2.0}
    store.client().put_object(Bucket=BUCKET, Key=f"{prefix}/.gristmill.lock", Body=json.dumps(info).encode())
    taken = lease.acquire(f"s3://{BUCKET}/{prefix}", ttl=60, command=["second"])
    assert taken.holder != GOOD["holder"]


@pytest.mark.parametrize("lease_s", [1e12, float("inf"), 86_401])
def test_a_lease_longer_than_a_day_is_refused_at_validation(tmp_path, lease_s):
    cfg = {"run_dir": str(tmp_path / "run"), "input": {"paths": ["x.warc.wet.gz"]}, "steps": [], "storage": {}}
    cfg["storage"]["lease_s"] = lease_s
    with pytest.raises(ConfigError) as e:
        from_dict(cfg)
    (line,) = str(e.value).splitlines()[1:]
    assert line.startswith("  storage.lease_s: ") and ("86400" in line or "finite" in line), line
    cfg["storage"]["lease_s"] = 86_400
    assert from_dict(cfg).storage.lease_s == 86_400
