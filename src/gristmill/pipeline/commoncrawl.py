"""Finding and fetching Common Crawl WET files: the crawl's path listing, and a download cache.

A base URL is either Common Crawl's HTTP front (`https://data.commoncrawl.org`) or a local
directory (or `file://` URL) laid out the same way, so a mirror on shared disk needs no
download step at all. Remote files land in a cache directory that mirrors the URL path.

Downloads go to `<name>.part` and are renamed into place only once their length checks out, so
a file in the cache is always complete; an interrupted download resumes from its `.part` with
a Range request. An exclusive `flock` on `<name>.lock` makes concurrent tasks (processes or
threads) that want the same file download it once: the others wait, then find it cached.
"""

from __future__ import annotations

import email.utils
import fcntl
import gzip
import http.client
import os
import random
import re
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from loguru import logger

USER_AGENT = "gristmill/0.1 (+https://commoncrawl.org/terms-of-use)"
CHUNK = 1 << 20
# Errors that say "the network or the server hiccupped", worth another try. Deliberately not
# bare OSError: a full disk while writing the .part must fail at once, not be retried 8 times.
_TRANSIENT = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError,
              ssl.SSLError)
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class DownloadError(RuntimeError):
    """A download that cannot succeed (4xx other than 429) or ran out of retries."""


class _Retry(Exception):
    """Internal: this attempt failed in a way worth retrying; `wait` is the server's Retry-After."""

    def __init__(self, reason: str, wait: float | None = None):
        super().__init__(reason)
        self.wait = wait


def _is_remote(url: str) -> bool:
    return urllib.parse.urlsplit(str(url)).scheme in ("http", "https")


def _as_local(path_or_url: str | os.PathLike) -> Path:
    s = str(path_or_url)
    if s.startswith("file://"):
        return Path(urllib.request.url2pathname(urllib.parse.urlsplit(s).path))
    if "://" in s:
        raise ValueError(f"unsupported URL scheme (use http(s)://, file:// or a directory): {s}")
    return Path(s)


def _retry_after(value: str | None) -> float | None:
    """Retry-After is either delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class Fetcher:
    """Resolves a WET URL or path to a local file, downloading http(s) URLs into `cache_dir`.

    `retries` is the number of further attempts after the first. Waits grow as
    `backoff * 2**n` (capped at `max_backoff`) with jitter, so many tasks throttled together
    by S3 do not all come back in the same second; a server's Retry-After wins (also capped).
    """

    def __init__(self, cache_dir: str | os.PathLike, retries: int = 8, backoff: float = 1.0,
                 max_backoff: float = 60, timeout: float = 60):
        self.cache_dir = Path(cache_dir)
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout

    def cache_path(self, url: str) -> Path:
        rel = urllib.parse.unquote(urllib.parse.urlsplit(url).path).lstrip("/")
        if not rel or any(part in ("", ".", "..") for part in rel.split("/")):
            raise ValueError(f"cannot map URL to a cache path: {url}")
        return self.cache_dir / rel

    def local_path(self, url_or_path: str | os.PathLike) -> Path:
        if not _is_remote(str(url_or_path)):
            path = _as_local(url_or_path)
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            return path
        url = str(url_or_path)
        dest = self.cache_path(url)
        if dest.is_file():  # complete by construction: only a verified .part is renamed here
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        # The lock file is left behind: unlinking it would let a waiter lock a stale inode
        # while a newcomer locks a fresh one, and both would download.
        with open(dest.with_name(dest.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not dest.is_file():  # another task may have finished it while we waited
                self._download(url, dest)
        return dest

    def fetch_bytes(self, url_or_path: str | os.PathLike) -> bytes:
        """A small file's bytes (e.g. a paths listing), cached and retried like any download."""
        return self.local_path(url_or_path).read_bytes()

    def _download(self, url: str, dest: Path) -> None:
        part = dest.with_name(dest.name + ".part")
        attempt, best = 0, part.stat().st_size if part.exists() else 0
        while True:
            try:
                self._attempt(url, part, dest)
                return
            except _Retry as err:
                size = part.stat().st_size if part.exists() else 0
                if size > best:
                    # New bytes arrived: the connection works, it just drops. Count afresh so
                    # a 100 MB file on a flaky link is not abandoned after 8 short reads.
                    best, attempt = size, 0
                attempt += 1
                if attempt > self.retries:
                    raise DownloadError(
                        f"giving up on {url} after {attempt} attempts: {err}") from None
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                if err.wait is not None:
                    wait = min(self.max_backoff, err.wait)
                else:
                    wait = delay * random.uniform(0.5, 1.0)
                logger.warning(f"retrying {url}: {err} (attempt {attempt}/{self.retries}, "
                               f"have {size} bytes), waiting {wait:.2f}s")
                time.sleep(wait)

    def _attempt(self, url: str, part: Path, dest: Path) -> None:
        offset = part.stat().st_size if part.exists() else 0
        headers = {"User-Agent": USER_AGENT}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            req = urllib.request.Request(url, headers=headers)
            resp = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            self._http_error(url, err, part, dest, offset)
            return
        except _TRANSIENT as err:
            raise _Retry(f"{type(err).__name__}: {err}") from None
        with resp:
            if resp.status == 206:
                m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                if not m or int(m.group(1)) != offset:
                    part.unlink(missing_ok=True)  # a range we did not ask for: start clean
                    raise _Retry(f"unexpected Content-Range {resp.headers.get('Content-Range')!r}")
                total = None if m.group(3) == "*" else int(m.group(3))
                mode = "ab"
            else:
                # 200 to a Range request: the server ignores ranges, the body is the whole file.
                length = resp.headers.get("Content-Length")
                total, mode = (int(length) if length else None), "wb"
            with open(part, mode) as out:
                try:
                    shutil.copyfileobj(resp, out, CHUNK)
                except _TRANSIENT as err:
                    raise _Retry(f"connection lost mid-body: {type(err).__name__}: {err}") from None
        size = part.stat().st_size
        if total is not None and size != total:
            # http.client may return a short body without raising; the length is the proof.
            raise _Retry(f"short body: have {size} of {total} bytes")
        os.replace(part, dest)

    def _http_error(self, url: str, err: urllib.error.HTTPError, part: Path, dest: Path,
                    offset: int) -> None:
        try:
            body = err.read(4096).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - the body is only a hint; the status decides
            body = ""
        code = re.search(r"<Code>([^<]+)</Code>", body)
        what = f"HTTP {err.code}" + (f" {code.group(1)}" if code else "")
        if err.code == 416 and offset:
            # Range starts at/after the end: the .part may already be the whole file (killed
            # between the last byte and the rename). Keep it only if the sizes agree.
            m = re.search(r"/(\d+)", err.headers.get("Content-Range", ""))
            if m and int(m.group(1)) == offset:
                os.replace(part, dest)
                return
            part.unlink(missing_ok=True)
            raise _Retry(f"{what}: .part of {offset} bytes does not fit the file; restarting")
        if err.code == 429 or err.code >= 500 or "SlowDown" in body:
            raise _Retry(what, _retry_after(err.headers.get("Retry-After")))
        raise DownloadError(f"{url}: {what}") from None


def list_wet_paths(base_url: str | os.PathLike, crawl: str, files: int | None = None,
                   paths: list[str] | None = None, fetcher: Fetcher | None = None) -> list[str]:
    """WET files of `crawl` under `base_url`: the first `files` of the listing, the named
    `paths` (in the order given), or all of them. Remote bases give URLs, local bases paths.

    `paths` entries are listing entries (`crawl-data/...`), optionally with the base prepended.
    """
    if files is not None and paths is not None:
        raise ValueError("give either files or paths, not both")
    if files is not None and files < 0:
        raise ValueError(f"files must be >= 0, got {files}")
    remote = _is_remote(str(base_url))
    base = str(base_url).rstrip("/") if remote else str(_as_local(base_url)).rstrip("/")
    listing_rel = f"crawl-data/{crawl}/wet.paths.gz"
    if remote:
        if fetcher is None:
            raise ValueError(f"a Fetcher (with a cache_dir) is needed to list {base}")
        raw = fetcher.fetch_bytes(f"{base}/{listing_rel}")
    else:
        listing = Path(base) / listing_rel
        if not listing.is_file():
            raise FileNotFoundError(f"no WET listing for crawl {crawl}: {listing}")
        raw = listing.read_bytes()
    entries = [line.strip() for line in gzip.decompress(raw).decode("utf-8").splitlines()]
    entries = [e for e in entries if e]

    if paths is not None:
        known, chosen, missing = set(entries), [], []
        for p in paths:
            rel = str(p).strip()
            rel = rel[len(base):] if rel.startswith(base + "/") else rel
            rel = rel.lstrip("/")
            (chosen if rel in known else missing).append(rel)
        if missing:
            raise ValueError(f"not in the {crawl} WET listing ({base}/{listing_rel}): "
                             + ", ".join(missing))
        # A file named twice would be processed twice, i.e. its documents duplicated.
        chosen = list(dict.fromkeys(chosen))
    elif files is not None:
        if files > len(entries):
            logger.warning(f"asked for {files} WET files of {crawl}; "
                           f"the listing has only {len(entries)}")
        chosen = entries[:files]
    else:
        chosen = entries

    if remote:
        return [f"{base}/{rel}" for rel in chosen]
    out = [str(Path(base) / rel) for rel in chosen]
    absent = [p for p in out if not Path(p).is_file()]
    if absent:
        raise FileNotFoundError(f"listed but absent from the local mirror: {', '.join(absent[:5])}"
                                + (f" (+{len(absent) - 5} more)" if len(absent) > 5 else ""))
    return out
