"""How gristmill words what it tells a person: crawl text made inert, sizes, and OS errors.

One place for each, so a log line, a `pipeline stats` table and an error read the same way
wherever they come from.
"""

from __future__ import annotations

import os
import re

__all__ = ["ConfigError", "format_bytes", "os_error_line", "printable", "redact", "url_userinfo", "without_userinfo"]


class ConfigError(ValueError):
    """A configuration problem; the message names every offending key path. (Here, beside the
    other messages, so that the CLI can raise and catch it without importing pydantic.)"""


# control characters (NUL, ESC, ...), C1 controls, zero-width and bidi overrides: what a
# terminal would act on or a reader would not see
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Crawl text for a log line or a table (record ids, URLs, hostnames, file names): control
    and bidi characters escaped (a NUL shows as `\\x00`, ESC as `\\x1b`), so the crawl never
    writes to a terminal or hides part of a line."""
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def format_bytes(n: float) -> str:
    """`3.3 MB`, `258.0 KB`, `12 B`: decimal units, one decimal above bytes."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def os_error_line(e: OSError, where: str | os.PathLike | None = None) -> str:
    """`No space left on device: /run/01_curate/output/00000.parquet` — what happened, then the
    file (both files of a rename or copy, `a -> b`). `where` stands in for the file when the
    error names none (pyarrow raises ENOSPC without a path)."""
    what = e.strerror or str(e)
    paths = [p for p in (e.filename, e.filename2) if p is not None]
    if not paths and where is not None:
        paths = [where]
    return f"{what}: {' -> '.join(map(os.fspath, paths))}" if paths else what


# `scheme://user:password@host`: the userinfo of a URL (before the first /, ? or #)
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^/?#@\s'\"<>]*)@")
# query parameters that carry a signature, a token or a key (presigned S3 and GCS URLs, Azure
# SAS, API keys): their values are secrets whoever wrote the URL
_SECRET_PARAM = re.compile(
    r"([?&;](?:sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|"
    r"x-goog-credential|token|access_token|auth|key|api_key|apikey|password|passwd|secret|code)=)[^&#\s'\"<>]*",
    re.I,
)


def url_userinfo(text: str) -> bool:
    """Whether `text` holds a URL with `user:password@` (any userinfo)."""
    return _USERINFO.search(text) is not None


def without_userinfo(text: str) -> str:
    """`text` with the userinfo of its URLs removed (`s3://bucket/...`)."""
    return _USERINFO.sub(r"\1", text)


def redact(text: str) -> str:
    """`text` with the secrets URLs carry blanked: userinfo (`s3://***@bucket/...`) and the
    values of signature, token and key query parameters (`?sig=***`). Every error line and log
    line that may name a URL goes through it."""
    return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***@", text))
