"""The host of a URL as a browser reads it: the WHATWG URL standard's basic URL parser
(https://url.spec.whatwg.org/, "basic URL parser", "host parsing", "IPv4 parser"), for what
decides the host and nothing else, so that `url_filter` looks up the host a page's links and a
browser go to, not the one a lenient split happens to find.

What it does, as the standard does it for a URL with no base:

- leading and trailing C0 controls and spaces are stripped, every tab, LF and CR removed;
- the scheme (a letter, then letters, digits, `+-.`, then `:`) is lower-cased; without one the
  string is no URL (None);
- special schemes (http, https, ws, wss, ftp, file): any run of `/` and `\\` after the scheme
  is skipped (`http:/bad.com`, `http:bad.com` and `http:\\\\bad.com` all go to bad.com), the
  authority ends at `/`, `\\`, `?` or `#` (so `http://bad.com\\@good.com/` goes to bad.com),
  its userinfo is everything up to its last `@`, the port a run of digits after the host's
  first `:` outside brackets; the host is percent-decoded (`%62ad.com` is bad.com), read as
  UTF-8, IDNA-encoded label by label and lower-cased (`ascii_domain`), refused if it holds a
  forbidden code point, and read as an IPv4 address when its last label is a number
  (`0x7f.1`, `2130706433` and `0177.0.0.1` are 127.0.0.1); an IPv6 literal is written
  compressed; a trailing dot stays (the lists compare without it);
- other schemes have a host only after `//` (an opaque host: neither decoded nor lower-cased),
  its authority ending at `/`, `?` or `#`.

Not done: IDNA's UTS 46 mapping is Python's IDNA 2003 nameprep (`encodings.idna`), which maps
the same for nearly every character but the four "deviations" (`ß`, `ς`, ZWJ, ZWNJ: mapped
away by nameprep, kept by browsers since 2017), as user lists' entries are mapped
(`url_filter.normalize_host`); the path is not normalised (no `.`/`..` segments resolved, no
percent-encoding of its characters): only backslashes are read as slashes.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

#: the schemes the standard parses hosts of (and reads `\` as `/` for)
SPECIAL = frozenset({"http", "https", "ws", "wss", "ftp", "file"})
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+\-.]*:")
_TAB_OR_NEWLINE = str.maketrans("", "", "\t\n\r")
#: code points no domain holds (the standard's forbidden domain code points: C0 controls,
#: space, `#%/:<>?@[\]^|`, DEL)
_FORBIDDEN = re.compile(r"[\x00-\x20#%/:<>?@\[\\\]^|\x7f]")
_SPECIAL_END = re.compile(r"[/\\?#]")
_OTHER_END = re.compile(r"[/?#]")
_QUERY = re.compile(r"[?#]")
#: full stops of other scripts that IDNA reads as dots
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


@dataclass(frozen=True)
class BrowserUrl:
    scheme: str
    #: the host as the standard serialises it (ASCII, lower-cased for special schemes); "" for
    #: a `file:` URL without one
    host: str
    #: path, query and fragment as written, backslashes of a special scheme's path read as `/`
    rest: str


def parse(url: str) -> BrowserUrl | None:
    """`url` as a browser parses it, or None where a browser would not open it (no scheme, no
    host, a host it refuses) or it has no host (`mailto:`, `data:`)."""
    url = url.strip("".join(map(chr, range(0x21)))).translate(_TAB_OR_NEWLINE)
    m = _SCHEME.match(url)
    if m is None:
        return None
    scheme, rest = m.group(0)[:-1].lower(), url[m.end() :]
    special = scheme in SPECIAL
    if special:
        start = len(rest) - len(rest.lstrip("/\\"))
        if scheme == "file":  # `file://host/path`; fewer slashes, a path with no host
            if start < 2:
                return BrowserUrl(scheme, "", rest.replace("\\", "/"))
            start = 2
        rest = rest[start:]
        cut = _SPECIAL_END.search(rest)
    else:
        if not rest.startswith("//"):
            return None
        rest = rest[2:]
        cut = _OTHER_END.search(rest)
    authority, tail = (rest[: cut.start()], rest[cut.start() :]) if cut else (rest, "")
    host = host_of(authority, special, scheme)
    if host is None:
        return None
    if special:  # the path's backslashes are slashes; the query's and fragment's stay
        q = _QUERY.search(tail)
        end = q.start() if q else len(tail)
        tail = tail[:end].replace("\\", "/") + tail[end:]
    return BrowserUrl(scheme, host, tail)


def browser_host(url: str) -> str | None:
    """The host a browser goes to for `url` (`parse`), without a trailing dot; None if none."""
    parsed = parse(url)
    if parsed is None or not parsed.host:
        return None
    return parsed.host.rstrip(".") or None


def host_of(authority: str, special: bool, scheme: str = "http") -> str | None:
    """The host of an authority (`user:pw@host:port`): None if the standard refuses it."""
    userinfo, at, hostport = authority.rpartition("@")
    if at and not hostport:
        return None
    if hostport.startswith("["):
        inside, bracket, after = hostport[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            return None
        port = after[1:]
        try:
            host = f"[{ipaddress.IPv6Address(inside).compressed}]"
        except ValueError:
            return None
    else:
        host, _, port = hostport.partition(":")
        if special:
            host = _special_host(host)
            if host is None:
                return None
    if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        return None
    if not host and special and scheme != "file":
        return None
    return host


def _special_host(raw: str) -> str | None:
    if not raw:
        return ""
    # the standard percent-decodes the UTF-8 bytes and reads them back (invalid bytes: U+FFFD)
    domain = unquote_to_bytes(raw.encode("utf-8", "surrogatepass")).decode("utf-8", "replace")
    ascii_host = ascii_domain(domain)
    if ascii_host is None or _FORBIDDEN.search(ascii_host):
        return None
    if _ends_in_number(ascii_host):
        return ipv4(ascii_host)
    return ascii_host


def ascii_domain(domain: str) -> str | None:
    """IDNA's ToASCII of a domain, label by label, lower-cased; None where a label fails."""
    domain = domain.translate(_DOTS)
    if domain.isascii():
        return domain.lower()
    out = []
    for label in domain.split("."):
        if label.isascii():
            out.append(label.lower())
            continue
        try:
            out.append(label.encode("idna").decode("ascii").lower())  # nameprep (maps, folds case), punycode
        except UnicodeError:  # a label IDNA refuses (U+FFFD of undecodable bytes, a forbidden character)
            return None
    return ".".join(out)


def _ends_in_number(host: str) -> bool:
    parts = host.split(".")
    if parts[-1] == "":
        if len(parts) == 1:
            return False
        parts.pop()
    last = parts[-1]
    return (last != "" and last.isascii() and last.isdigit()) or _ipv4_number(last) is not None


def _ipv4_number(part: str) -> int | None:
    if not part:
        return None
    base = 10
    if part[:2] in ("0x", "0X"):
        part, base = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        part, base = part[1:], 8
    if part == "":
        return 0
    try:
        return int(part, base) if part.isascii() and part.isalnum() else None
    except ValueError:
        return None


def ipv4(host: str) -> str | None:
    """The standard's IPv4 parser: 1 to 4 parts, each decimal, octal (`0...`) or hex (`0x...`),
    the last filling the remaining bytes; None where it fails (so does the URL)."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if len(parts) > 4:
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        return None
    value = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        value += n * 256 ** (3 - i)
    return ".".join(str((value >> s) & 255) for s in (24, 16, 8, 0))
