"""Where files live: local paths, or URLs read and written through fsspec.

A path in a run config (`input.paths`, `run_dir`, model files, `calibration`, `tokens export -o`)
may be a URL: `s3://` (s3fs: AWS S3, MinIO, Cloudflare R2, Ceph), `gs://` (gcsfs, if installed),
`hf://` (huggingface_hub's HfFileSystem), `https://` (read only) or `file://` (a local path).
Everything else is a local path and never goes through fsspec: the hot loops of a local run
open files with Python and pyarrow directly, as before.

Settings: the run config's `storage:` section (`StorageConfig`). It travels with the plan
(`Stage.storage`, then each task's executor); what reaches a run directory on object storage is
given it (`filesystem(url, config)`: the store run directory, its lock, a task's working copy).
What lists the inputs and fetches models and tokenizers uses the settings of its process,
installed with `configure` by the planner (`plan`, `pipeline plan`) and by every task from its
executor. S3's endpoint, region and credentials otherwise come the standard way, through
botocore: `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, `AWS_PROFILE` and `~/.aws/config`,
`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, instance and container roles. Credentials are never taken from the run
config (it is saved in the run directory) and never handed to a filesystem object (those are
pickled into task files): each process finds them itself. Error lines pass through `scrub`, which
blanks the secret values of the environment, whatever a server echoes back.

Failures are one line naming the URL and what came back (`StorageError`, an OSError, so code
that reports a file it cannot read reports these too).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from gristmill.core.configlib import Strict
from gristmill.core.files import temporary_path
from gristmill.core.messages import redact, url_userinfo

__all__ = [
    "READ_ONLY",
    "RUN_DIR_PROTOCOLS",
    "StorageConfig",
    "StorageError",
    "cached_copy",
    "configure",
    "conflict",
    "errors",
    "filesystem",
    "is_url",
    "join",
    "local_or_url",
    "protocol",
    "scratch_root",
    "scrub",
    "settings",
]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: protocols that can only be read
READ_ONLY = frozenset({"http", "https"})
#: protocols a run directory may live on: a lease needs a conditional create (If-None-Match),
#: which gristmill issues through S3's API (S3, MinIO, R2, Ceph); gs:// and hf:// have their own
#: preconditions, not wired here, and no server to test them against
RUN_DIR_PROTOCOLS = frozenset({"s3"})
#: the package each protocol needs, for the message when it is missing
_PACKAGES = {
    "s3": ("s3fs", "s3fs"),
    "gs": ("gcsfs", "gcsfs"),
    "gcs": ("gcsfs", "gcsfs"),
    "hf": ("huggingface_hub", "huggingface_hub"),
    "http": ("aiohttp", "aiohttp"),
    "https": ("aiohttp", "aiohttp"),
}
_SECRET_KEY = re.compile(r"secret|password|token|credential|(^|_)key($|_)", re.I)
#: environment variables whose values are secrets: blanked from every error line
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "HF_TOKEN", "GOOGLE_OAUTH_TOKEN")


class StorageError(OSError):
    """A store could not be read or written: one line naming the URL and what came back."""


class S3Settings(Strict):
    """How to reach S3 or an S3-compatible store; unset fields come from botocore's own chain."""

    endpoint_url: str | None = Field(
        None, description="e.g. http://127.0.0.1:9000 (MinIO); default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, or AWS"
    )
    region: str | None = Field(None, description="region name (default: AWS_REGION / the profile's)")
    profile: str | None = Field(None, description="a profile of ~/.aws/config (default: AWS_PROFILE)")
    anon: bool = Field(False, description="unsigned requests (public buckets such as commoncrawl)")
    addressing_style: Literal["auto", "path", "virtual"] | None = Field(
        None, description="path-style URLs for stores without virtual-host buckets (some MinIO and Ceph setups)"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_credentials(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if isinstance(key, str) and _SECRET_KEY.search(key) and key not in cls.model_fields:
                    raise ValueError(
                        f"{key}: credentials are not read from the run config, which is saved with the run; "
                        "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile (storage.s3.profile) or an "
                        "instance role"
                    )
        return data

    @model_validator(mode="after")
    def _no_userinfo(self):
        # a config file's URLs are refused by the config library first (naming the key); this
        # guards a StorageConfig made in code
        if self.endpoint_url and url_userinfo(self.endpoint_url):
            raise ValueError(f"endpoint_url: {redact(self.endpoint_url)}: give the endpoint without user:password@")
        return self


class StorageConfig(Strict):
    """The run config's `storage:` section: how URLs are reached, and the local scratch space."""

    s3: S3Settings = Field(default_factory=S3Settings)
    scratch_dir: str | None = Field(
        None,
        description="local folder where a task stages what it memory-maps or builds in place when the run "
        "directory is on object storage, and where model files given as URLs are cached "
        "(default: <TMPDIR>/gristmill-scratch)",
    )
    scratch_gb: float | None = Field(
        None, gt=0, description="scratch space a task may use; `pipeline run` refuses stages estimated above it"
    )
    min_rate_bytes_s: float = Field(
        10_000,
        ge=0,
        description="a whole-object download (a model given as a URL) must finish within timeout_s + its size / "
        "this rate, or it fails in one line (a server that drips never hangs the run); 0: no deadline",
    )
    timeout_s: float = Field(60, gt=0, description="the fixed part of a whole-object download's deadline")
    lease_s: float = Field(
        300,
        ge=10,
        # a day: a crash leaves the lock for at most that long (--force-lock before), and the
        # renewal's wait stays a time the thread can sleep (1e12 s overflowed it)
        le=86_400,
        description="run directory on object storage: how long its lock lasts unless renewed (renewed every "
        "third of it while the command runs); a crashed holder's lock is free after it",
    )


_settings = StorageConfig()


def configure(config: StorageConfig | None) -> None:
    """Install the storage settings of this process (the planner's, then each task's)."""
    global _settings
    _settings = config if config is not None else StorageConfig()


def settings() -> StorageConfig:
    return _settings


def scratch_root(config: StorageConfig | None = None) -> Path:
    """The local scratch folder (`storage.scratch_dir` of `config`, default this process's
    settings), resolved in the process that uses it: a Slurm node's TMPDIR is its own."""
    given = (config or _settings).scratch_dir
    return Path(os.path.expanduser(given)) if given else Path(tempfile.gettempdir()) / "gristmill-scratch"


# --- paths and URLs ------------------------------------------------------------------------------


def protocol(path: str | os.PathLike) -> str | None:
    """`s3` for `s3://b/k`, None for a local path (and for `file://`, which is one)."""
    m = _SCHEME.match(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
    if m is None or m.group(1).lower() == "file":
        return None
    return m.group(1).lower()


def is_url(path: str | os.PathLike) -> bool:
    """A URL of a store (not a local path, not `file://`)."""
    return protocol(path) is not None


def local_or_url(path: str | os.PathLike) -> Path | str:
    """A local Path (`file:///x` is `/x`; `~` expanded), or the URL as given."""
    text = os.fspath(path)
    if text.lower().startswith("file://"):
        return Path(text[len("file://") :])
    return text if is_url(text) else Path(text).expanduser()


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p)])


# --- filesystems -----------------------------------------------------------------------------------


def _options(proto: str, config: StorageConfig) -> dict:
    # Listings are never cached: a task's completion marker, written by another process, must be
    # seen by the next look.
    options: dict[str, Any] = {"use_listings_cache": False}
    if proto == "s3":
        s3 = config.s3
        if s3.endpoint_url:
            options["endpoint_url"] = s3.endpoint_url
        if s3.region:
            options["client_kwargs"] = {"region_name": s3.region}
        if s3.profile:
            options["profile"] = s3.profile
        if s3.anon:
            options["anon"] = True
        if s3.addressing_style:
            options["config_kwargs"] = {"s3": {"addressing_style": s3.addressing_style}}
    return options


def filesystem(url: str, config: StorageConfig | None = None):
    """(fsspec filesystem, path without the scheme) for a URL, with `config` (default: this
    process's settings)."""
    proto = protocol(url)
    if proto is None:
        raise ValueError(f"{url}: not a URL")
    if url_userinfo(url):  # a URL given on the command line; the config refuses them when validated
        raise StorageError(
            f"{redact(url)}: a URL with user:password@; credentials are not taken from URLs (set "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or an instance role)"
        )
    module, package = _PACKAGES.get(proto, (None, None))
    if module and importlib.util.find_spec(module) is None:
        raise StorageError(f"{url}: {proto}:// needs the {package} package (pip install {package})")
    import fsspec

    try:
        return fsspec.core.url_to_fs(url, **_options(proto, config or _settings))
    except (ImportError, ValueError) as e:
        raise StorageError(f"{url}: no filesystem for {proto}:// ({scrub(str(e))})") from None


def scrub(text: str) -> str:
    """`text` with the secret values of this process's environment blanked, and what URLs carry
    (userinfo, signature and token parameters: `messages.redact`)."""
    text = redact(text)
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def describe(e: BaseException) -> str:
    """What came back, in words: the server's or client's message, classified."""
    name = type(e).__name__
    text = " ".join(str(e).split()) or name
    if name == "NoCredentialsError":
        what = (
            "no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile with "
            "storage.s3.profile or AWS_PROFILE, or use an instance role; storage.s3.anon for public buckets)"
        )
    elif name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ClientConnectorError"):
        what = f"cannot connect ({text})"
    elif isinstance(e, PermissionError):
        what = f"access denied ({text})"
    elif isinstance(e, FileNotFoundError):
        what = f"not found ({text})"
    elif isinstance(e, FileExistsError):
        what = f"precondition failed ({text})"
    else:
        what = f"{name}: {text}"
    return scrub(what)


@contextmanager
def errors(url: str, doing: str = "") -> Iterator[None]:
    """Any failure of a store in the block raised as one StorageError line: `URL: doing: what`."""
    try:
        yield
    except StorageError:
        raise
    except OSError as e:
        raise _as_error(e, url, doing) from None
    except Exception as e:  # noqa: BLE001 - botocore's and aiohttp's errors have no common base we can import lazily
        if type(e).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "fsspec"):
            raise _as_error(e, url, doing) from None
        raise


def _as_error(e: BaseException, url: str, doing: str) -> StorageError:
    return StorageError(scrub(f"{url}: {doing + ': ' if doing else ''}{describe(e)}"))


def conflict(e: BaseException) -> bool:
    """A write refused because its condition did not hold: 412 Precondition Failed (s3fs raises
    FileExistsError for If-None-Match, an OSError for If-Match) or 409 ConditionalRequestConflict
    (S3, for conditional writes racing on one key)."""
    if isinstance(e, FileExistsError):
        return True
    response = getattr(e.__cause__, "response", None) or getattr(e, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


# --- small whole-file operations ---------------------------------------------------------------------


def read_bytes(url: str, config: StorageConfig | None = None) -> bytes:
    fs, path = filesystem(url, config)
    with errors(url, "reading"):
        return fs.cat_file(path)


def write_bytes(url: str, data: bytes) -> None:
    """One object, whole or not at all (a PUT)."""
    fs, path = filesystem(url)
    with errors(url, "writing"):
        fs.pipe_file(path, data)


def size(url: str) -> int:
    fs, path = filesystem(url)
    with errors(url, "reading its size"):
        return int(fs.size(path))


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    with errors(url, "looking it up"):
        return fs.exists(path)


def glob(pattern: str) -> list[tuple[str, dict]]:
    """(URL, info) of the objects matching a glob URL, sorted by URL; a URL without wildcards
    is looked up as is."""
    fs, path = filesystem(pattern)
    proto = protocol(pattern)
    with errors(pattern, "listing"):
        if any(c in path for c in "*?["):
            found = fs.glob(path, detail=True)
        else:
            try:
                found = {path: fs.info(path)}
            except FileNotFoundError:
                found = {}
    out = []
    for key, info in found.items():
        url = key if is_url(key) else f"{proto}://{key.lstrip('/')}"
        out.append((url, info))
    return sorted(out)


def open_input(url: str, block_size: int = 8 << 20):
    """A URL opened for reading as a stream (read-ahead blocks of `block_size`)."""
    fs, path = filesystem(url)
    with errors(url, "opening"):
        return fs.open(path, "rb", block_size=block_size, cache_type="readahead")


def transfer_deadline(size: int) -> float | None:
    """Seconds a whole-object transfer of `size` bytes may take (`storage.min_rate_bytes_s`)."""
    rate = _settings.min_rate_bytes_s
    return _settings.timeout_s + size / rate if rate > 0 else None


def _within_deadline(fs, url: str, size: int, call, *args):
    """`call(*args)` on an fsspec filesystem, cancelled past `transfer_deadline(size)`: fsspec's
    own per-read timeouts never trip on a server that sends a byte now and then. Filesystems
    without an event loop (hf://) run it without one: their client's timeouts apply."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.exceptions import FSTimeoutError

    deadline = transfer_deadline(size)
    if deadline is None or not isinstance(fs, AsyncFileSystem):
        return call(*args)
    try:
        return call(*args, timeout=deadline)
    except FSTimeoutError:
        raise StorageError(
            f"{url}: not transferred within {deadline:,.0f} s ({size:,} bytes: storage.timeout_s + the size at"
            f" storage.min_rate_bytes_s, {_settings.min_rate_bytes_s:,.0f} bytes/s): the server is too slow or drips"
        ) from None


def cached_copy(url: str, folder: Path | None = None) -> Path:
    """A local copy of the object at `url`, downloaded once per machine: the cache is keyed by the
    URL and the object's ETag (or size and date), so a changed object is fetched anew and an
    unchanged one never twice. The copy's mtime is fixed, so the same object gives the same
    (size, mtime) on every machine: a model validated by the planner is recognised in a task."""
    fs, path = filesystem(url)
    with errors(url, "looking it up"):
        info = fs.info(path)
    if info.get("type") == "directory":
        raise StorageError(f"{url}: is a folder, not a file")
    version = str(info.get("ETag") or info.get("etag") or "") + f":{info.get('size')}:{info.get('LastModified', '')}"
    key = hashlib.sha256(f"{url}\0{version}".encode()).hexdigest()[:24]
    dest = (folder or scratch_root() / "cache") / key / (path.rstrip("/").rsplit("/", 1)[-1] or "file")
    if dest.is_file() and dest.stat().st_size == info.get("size", dest.stat().st_size):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(dest)  # tasks of several machines may share a scratch folder
    try:
        with errors(url, "downloading"):
            _within_deadline(fs, url, int(info.get("size") or 0), fs.get_file, path, str(tmp))
        os.utime(tmp, ns=(0, 0))
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
