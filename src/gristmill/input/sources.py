"""Which files a run reads, and how a task opens each: the input's resolution, out of the planner.

`resolve(inp, fetcher)` lists the run's input files in their reading order (`InputFiles`: the
paths, with the sizes the listing gave, so nothing is asked twice and nothing is cached in a
module); `Opener` is what the reader is handed to open a file (a picklable object of this
layer: the reader never calls back into the planner). `fetcher_for` makes the one fetcher of a
run from its `input.commoncrawl` settings.
"""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from gristmill.core import storage
from gristmill.core.messages import ConfigError, printable
from gristmill.input.commoncrawl import Fetcher, list_wet_paths
from gristmill.input.stream import stream_memory_bytes

__all__ = ["CC_WET_FILE_BYTES", "REMOTE", "InputFiles", "Opener", "fetcher_for", "resolve"]

#: a Common Crawl WET file, compressed (files are 100-200 MB; listed, not yet downloaded)
CC_WET_FILE_BYTES = 150_000_000
#: sources that are read over the network
REMOTE = ("http://", "https://", "s3://")


class InputFiles(list):
    """The run's input files (paths or URLs) in reading order: a list of them, with `sizes`, the
    sizes of those whose listing gave one (objects on a store), so their bytes are known without
    a request. Later dedup keeps first occurrences by this order."""

    def __init__(self, paths=(), sizes: dict[str, int] | None = None):
        super().__init__(paths)
        self.sizes: dict[str, int] = dict(sizes or {})

    def size(self, source: str) -> int | None:
        """Compressed bytes of one file where known without a request (a listed object, a local file)."""
        if source in self.sizes:
            return self.sizes[source]
        if storage.is_url(source) or source.startswith(REMOTE):
            return None
        local = Path(source).expanduser()
        return local.stat().st_size if local.is_file() else None

    def compressed_bytes(self, commoncrawl: bool) -> float:
        """Compressed bytes of the input: what is known; Common Crawl files not yet in the cache
        (and, for a crawl, any remote file) count `CC_WET_FILE_BYTES` each."""
        total = 0.0
        for s in self:
            known = self.size(s)
            if known is not None:
                total += known
            elif storage.is_url(s) and not s.startswith(REMOTE):  # gs://, hf://
                total += storage.size(s)
            elif commoncrawl or s.startswith(REMOTE):
                total += CC_WET_FILE_BYTES
        return total

    def identity(self) -> list[dict]:
        """The files as a resume compares them: path and size where known without a request."""
        return [{"path": s, "bytes": self.size(s)} for s in self]


def fetcher_for(cc) -> Fetcher:
    """The fetcher of a run's `input.commoncrawl` section (None: defaults, still needed for a
    langid model given as a URL)."""
    if cc is None:
        return Fetcher(Path("~/.cache/gristmill/downloads").expanduser())
    return Fetcher(
        Path(cc.cache_dir).expanduser(),
        retries=cc.retries,
        backoff=cc.backoff_s,
        timeout=cc.timeout_s,
        cache=cc.cache,
        read_bytes=cc.read_buffer_bytes,
        min_rate=cc.min_rate_bytes_s,
        rate_window=cc.rate_window_s,
        max_bytes=cc.max_object_bytes,
    )


def resolve(inp, fetcher: Fetcher) -> InputFiles:
    """The input files of a run's `input:` section, in a defined order."""
    if inp.commoncrawl is not None:
        cc = inp.commoncrawl
        return InputFiles(
            list_wet_paths(cc.base_url, cc.crawl, files=cc.files, paths=cc.paths, fetcher=fetcher, kind=inp.format)
        )
    sources = InputFiles()
    seen: dict[str, str] = {}  # real path -> how it was first named
    for i, pattern in enumerate(inp.paths):
        if storage.is_url(pattern) and storage.protocol(pattern) not in storage.READ_ONLY:
            _store_sources(pattern, f"input.paths[{i}]", seen, sources)
            continue
        if pattern.startswith(("http://", "https://")):
            if pattern in seen:
                logger.warning(f"input.paths[{i}]: {pattern} is listed twice; it is read once")
                continue
            seen[pattern] = pattern
            sources.append(pattern)
            continue
        matches = sorted(glob.glob(str(storage.local_or_url(pattern))))
        if not matches:
            raise ConfigError(f"input.paths[{i}]: no file matches {pattern!r}")
        folders = [m for m in matches if Path(m).is_dir()]
        if folders:
            raise ConfigError(
                f"input.paths[{i}]: {folders[0]} is a directory, not a WET file;"
                f" give the files, e.g. {str(Path(folders[0]) / '*.warc.wet.gz')!r}"
            )
        for m in matches:
            _check_regular_file(m, f"input.paths[{i}]")
            real = os.path.realpath(m)
            if real in seen:
                # read twice, its documents would be duplicated (and dedup would count them as such)
                logger.warning(printable(f"input.paths[{i}]: {m} is also matched as {seen[real]}; it is read once"))
                continue
            seen[real] = m
            sources.append(m)
    return sources


def _store_sources(pattern: str, key: str, seen: dict[str, str], into: InputFiles) -> None:
    """The objects a URL or glob URL names on a store (s3://, gs://, hf://), sorted, with the
    sizes the listing gave (one listing, not a HEAD each)."""
    matches = storage.glob(pattern)  # a StorageError names the URL and what came back
    if not matches:
        raise ConfigError(f"{key}: no object matches {pattern!r}")
    for url, info in matches:
        if info.get("type") == "directory":
            raise ConfigError(f"{key}: {url} is a folder, not a WET file; give the files, e.g. {url}/*.warc.wet.gz")
        if url in seen:
            logger.warning(printable(f"{key}: {url} is also matched as {seen[url]}; it is read once"))
            continue
        seen[url] = url
        into.sizes[url] = int(info.get("size") or 0)
        into.append(url)


_NOT_FILES = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _check_regular_file(path: str, key: str) -> None:
    """A glob can reach a FIFO (reading it would wait forever for a writer), /dev/zero (endless
    zeros) or a socket: refused here, naming the path and what it is."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:  # a broken symbolic link, a file gone since the glob
        raise ConfigError(printable(f"{key}: {path}: {e.strerror}")) from None
    for test, what in _NOT_FILES:
        if test(mode):
            raise ConfigError(printable(f"{key}: {path} is {what}, not a file"))
    if not stat.S_ISREG(mode):
        raise ConfigError(printable(f"{key}: {path} is not a regular file"))


@dataclass(frozen=True)
class Opener:
    """What the reader calls to open each input file in a task (pickled with it).

    An `input.paths` file on S3 (`listed`) is streamed as Common Crawl's files are (ranged GETs,
    resumed, retried and counted), never copied to disk; a file of another store (gs://, hf://)
    is streamed by the WET reader through fsspec; the rest (Common Crawl's files, http(s)://
    URLs, paths) as the fetcher's `cache` says."""

    fetcher: Fetcher
    listed: bool  # the files come from `input.paths`, not from a crawl's listing

    def __call__(self, source: str):
        if self.listed and source.startswith("s3://"):
            return self.fetcher.stream(source)
        if storage.is_url(source) and not source.startswith(REMOTE):
            return source
        return self.fetcher.open(source)

    def streams(self, source: str) -> bool:
        """Whether a task reads `source` through a `stream.RemoteStream`."""
        if self.listed and source.startswith("s3://"):
            return True
        return self.fetcher.cache == "none" and source.startswith(REMOTE)

    def stream_bytes(self, sources: list[str]) -> int:
        """What the reader's streams add to a task (`stream.stream_memory_bytes`, the most of any
        source: a task reads one file at a time); 0 when every file is read from disk."""
        return max((stream_memory_bytes(s, self.fetcher.read_bytes) for s in sources if self.streams(s)), default=0)
