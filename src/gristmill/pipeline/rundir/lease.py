"""One run at a time in a run directory on object storage: a lock object held as a lease.

A local run directory is locked with `flock` (`gristmill.dirlock`), which the kernel releases
when its holder dies. An object store has no such lock, so the lock is an object,
`<run_dir>/.gristmill.lock`, created with a conditional PUT (`If-None-Match: *`): the store
creates it for one writer and answers 412 to every other. It records its holder (host, pid,
command, a random token: together the holder's name) and when it expires. The holder renews it
every third of `storage.lease_s` with `If-Match` on the ETag it last wrote, so a lease taken over
by someone else is noticed at the next renewal, and the holder stops (`on_lost`). A holder that
dies stops renewing: its lease expires, and the next run takes it over (`If-Match` on the dead
holder's ETag, so two runs taking over at once cannot both win). `--force-lock HOLDER` takes
over a lease before it expires, only from the holder it names.

Some stores accept `If-None-Match` and ignore it. Before taking the lock, `probe` creates a
scratch object twice with `If-None-Match: *`: a store that accepts the second PUT cannot keep
two runs apart, and the run is refused in one line.

Expiry is judged by the clock of the machine that looks, against the time the holder wrote:
machines whose clocks differ by a large part of `lease_s` may take over a live lease early.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from loguru import logger

from gristmill.core import storage
from gristmill.dirlock import LOCK_NAME, LockHeld

__all__ = ["Lease", "LeaseHeld", "hold", "probe", "read"]


class LeaseHeld(LockHeld):
    """Another run holds the lease of the run directory."""


class StoreUnsupported(ValueError):
    """The store cannot do what a run directory needs (conditional writes)."""


@dataclass
class Lease:
    url: str  # the lock object's URL
    info: dict
    etag: str
    #: why the object is not a lock gristmill wrote (not JSON, a field missing or not a finite
    #: number...), or None
    malformed: str | None = None

    @property
    def holder(self) -> str:
        """The holder's name; for a malformed lock, the name `--force-lock` takes it over by:
        the object's version (ETag), so that only the object the user saw is taken over."""
        if self.malformed is not None:
            return f"malformed:{self.etag.strip(chr(34))[:16]}"
        return str(self.info["holder"])

    @property
    def expires(self) -> float:
        return float(self.info["expires"])


def _malformed(info: object) -> str | None:
    """Why `info` is not a lock gristmill wrote, or None: every field `acquire` and the
    messages read, of the right type, the times finite."""
    if not isinstance(info, dict):
        return f"a JSON {type(info).__name__}, not an object"
    if not isinstance(info.get("holder"), str) or not info["holder"]:
        return f"holder is {info.get('holder')!r}, not a name"
    for key in ("expires", "since"):
        value = info.get(key)
        # a time a clock can show: finite, and within what time.localtime takes
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (math.isfinite(value) and 0 <= value < 1e11)
        ):
            return f"{key} is {value!r}, not a time"
    command = info.get("command", [])
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        return f"command is {command!r}, not a list of words"
    return None


def _describe(info: dict) -> str:
    when = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))  # noqa: E731
    return (
        f"{info.get('holder', '?')} (pid {info.get('pid', '?')} on {info.get('host', '?')}, "
        f"since {when(float(info.get('since', 0)))}, lease until {when(float(info.get('expires', 0)))}: "
        f"{' '.join(info.get('command', []))})"
    )


#: a write refused because its condition did not hold (412, 409)
conflict = storage.conflict


def _split(fs, path: str) -> tuple[str, str]:
    bucket, key, _ = fs.split_path(path)
    return bucket, key


def probe(url: str, config: storage.StorageConfig | None = None) -> None:
    """Refuse a store that does not enforce `If-None-Match: *` (StoreUnsupported, one line)."""
    fs, path = storage.filesystem(url, config)
    bucket, key = _split(fs, f"{path.rstrip('/')}/.gristmill.probe-{secrets.token_hex(6)}")
    where = f"{url.rstrip('/')}/{key.rsplit('/', 1)[-1]}"
    with storage.errors(where, "checking that the store honours conditional writes"):
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=b"probe", IfNoneMatch="*")
        try:
            try:
                fs.call_s3("put_object", Bucket=bucket, Key=key, Body=b"probe again", IfNoneMatch="*")
            except OSError as e:
                if conflict(e):
                    return  # 412 Precondition Failed: enforced
                raise
            raise StoreUnsupported(
                f"{url}: this store accepted a second create of one object with If-None-Match: * , so it cannot "
                "keep two runs out of one run directory; refusing to use it as a run directory (local paths and "
                "stores that enforce conditional writes, such as AWS S3 and recent MinIO, can be)"
            )
        finally:
            try:
                fs.call_s3("delete_object", Bucket=bucket, Key=key)
            except Exception as e:  # noqa: BLE001 - a stray probe object is harmless; the verdict stands
                logger.debug(f"{where}: not removed ({storage.describe(e)})")


def read(url: str, config: storage.StorageConfig | None = None) -> Lease | None:
    """The lease at `url` (the lock object), or None if there is none."""
    fs, path = storage.filesystem(url, config)
    bucket, key = _split(fs, path)
    with storage.errors(url, "reading the lock"):
        try:
            resp = fs.call_s3("get_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None
        body = _read_body(fs, resp)
    try:
        info = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        return Lease(url, {}, resp["ETag"], f"not JSON ({e})")
    why = _malformed(info)
    return Lease(url, info if why is None else {}, resp["ETag"], why)


def _no_constant(name: str):
    raise ValueError(f"{name} is no JSON number")


def _read_body(fs, resp) -> bytes:
    body = resp["Body"]
    if hasattr(body, "read") and not callable(getattr(body, "__aenter__", None)):
        return body.read()

    async def _all():
        async with body as stream:
            return await stream.read()

    from fsspec.asyn import sync

    return sync(fs.loop, _all)


def _put(fs, url: str, info: dict, **condition) -> str:
    bucket, key = _split(fs, url)
    resp = fs.call_s3(
        "put_object",
        Bucket=bucket,
        Key=key,
        Body=json.dumps(info).encode(),
        ContentType="application/json",
        **condition,
    )
    return resp["ETag"]


def _me(ttl: float, command: list[str]) -> dict:
    now = time.time()
    host, pid = socket.gethostname(), os.getpid()
    return {
        "holder": f"{host}:{pid}:{secrets.token_hex(3)}",
        "host": host,
        "pid": pid,
        "command": command,
        "since": now,
        "expires": now + ttl,
    }


def acquire(
    run_url: str,
    ttl: float,
    force_lock: str | None = None,
    command: list[str] | None = None,
    config: storage.StorageConfig | None = None,
) -> Lease:
    """Take the lease of a run directory (LeaseHeld if another holds it, naming the holder)."""
    url = storage.join(run_url, LOCK_NAME)
    fs, _ = storage.filesystem(url, config)
    me = _me(ttl, command if command is not None else sys.argv)
    with storage.errors(url, "taking the lock"):
        try:
            return Lease(url, me, _put(fs, url, me, IfNoneMatch="*"))
        except OSError as e:
            if not conflict(e):
                raise
        for _attempt in range(3):  # the holder may release or renew between our reads
            held = read(url, config)
            if held is None:
                try:
                    return Lease(url, me, _put(fs, url, me, IfNoneMatch="*"))
                except OSError as e:
                    if not conflict(e):
                        raise
                    continue
            if held.malformed is not None and force_lock != held.holder:
                # never taken over silently: a lock no gristmill wrote may be another tool's, or
                # a newer gristmill's, or damage; the user looks and decides
                raise LeaseHeld(
                    f"{url}: the run directory's lock object is not one this gristmill can read ({held.malformed});"
                    f" if no run uses {run_url}, take it over with --force-lock {held.holder}"
                )
            expired = held.malformed is None and held.expires < time.time()
            if not expired and force_lock != held.holder:
                hint = (
                    f"--force-lock {force_lock}: it is held by {held.holder}, not {force_lock}"
                    if force_lock
                    else f"if that run has died, wait for its lease to expire or take it over with "
                    f"--force-lock {held.holder}"
                )
                raise LeaseHeld(f"run directory {run_url} is in use by {_describe(held.info)}; {hint}")
            try:
                lease = Lease(url, me, _put(fs, url, me, IfMatch=held.etag))
            except OSError as e:
                if not conflict(e):
                    raise
                continue  # another run took it over first, or the holder renewed: look again
            why = "its lease expired" if expired else "--force-lock names it"
            was = _describe(held.info) if held.malformed is None else f"{held.holder} ({held.malformed})"
            logger.warning(f"{run_url}: took over the lock of {was}: {why}")
            return lease
    raise LeaseHeld(f"run directory {run_url} is in use: its lock changed under each of 3 attempts to take it")


def _stop_this_process(reason: str) -> None:
    """What a holder does when its lease is gone: stop the run, as SIGTERM does (tasks stopped,
    completed ones kept)."""
    logger.error(reason)
    os.kill(os.getpid(), signal.SIGTERM)


class _Renewer(threading.Thread):
    def __init__(self, lease: Lease, ttl: float, on_lost: Callable[[str], None], config: storage.StorageConfig | None):
        super().__init__(name="gristmill-lease", daemon=True)
        self.lease, self.ttl, self.on_lost, self.config = lease, ttl, on_lost, config
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        fs, _ = storage.filesystem(self.lease.url, self.config)
        while not self.stopping.wait(self.ttl / 3):
            info = {**self.lease.info, "expires": time.time() + self.ttl}
            try:
                with self.lock:
                    if self.stopping.is_set():
                        return
                    self.lease.etag = _put(fs, self.lease.url, info, IfMatch=self.lease.etag)
                    self.lease.info = info
            except Exception as e:  # noqa: BLE001 - the store may be back before the lease runs out
                if isinstance(e, OSError) and conflict(e):
                    held = read(self.lease.url, self.config)
                    by = "nobody (it was removed)" if held is None else held.holder
                    by = _describe(held.info) if held is not None and held.malformed is None else by
                    self.on_lost(f"{self.lease.url}: this run's lock was taken over by {by}; stopping")
                    return
                if time.time() > self.lease.expires - self.ttl / 6:
                    self.on_lost(
                        f"{self.lease.url}: the lock could not be renewed before it expires "
                        f"({storage.describe(e)}); stopping"
                    )
                    return
                logger.warning(f"{self.lease.url}: lock not renewed, retrying: {storage.describe(e)}")

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()


@contextmanager
def hold(
    run_url: str,
    ttl: float,
    force_lock: str | None = None,
    command: list[str] | None = None,
    on_lost: Callable[[str], None] = _stop_this_process,
    config: storage.StorageConfig | None = None,
) -> Iterator[Lease]:
    """Hold the run directory at `run_url` for the block: probe, take, renew, release; the store
    is reached with `config` (default: this process's settings)."""
    probe(run_url, config)
    lease = acquire(run_url, ttl, force_lock, command, config)
    renewer = _Renewer(lease, ttl, on_lost, config)
    renewer.start()
    try:
        yield lease
    finally:
        renewer.stop()
        fs, path = storage.filesystem(lease.url, config)
        bucket, key = _split(fs, path)
        try:  # only our own lease: If-Match on the ETag we last wrote
            fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=lease.etag)
        except Exception as e:  # noqa: BLE001 - taken over, or the store is gone: it expires on its own
            logger.debug(f"{lease.url}: not released ({storage.describe(e)})")
