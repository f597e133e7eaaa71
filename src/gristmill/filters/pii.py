"""E-mail addresses and public IPv4 addresses replaced, as FineWeb anonymised them (Penedo et al.
2024, https://arxiv.org/abs/2406.17557; datatrove 0.10.1's PIIFormatter): its patterns, its
replacement strings, the rest of the text byte for byte as it was.

A step that rewrites text and never drops: documents, and bytes in and out, are counted as a
filter's; `emails_replaced` and `ips_replaced` count the addresses replaced, `documents_touched`
the documents that had one, `ips_not_public` the addresses left because they are not public.

What is replaced, and where we depart from FineWeb:

* an e-mail address: FineWeb's pattern (below), found exactly where datatrove finds it (tested
  against datatrove's on real WET records with addresses planted, and on hostile strings). An
  address with an IP literal ("a@[1.2.3.4]") is one e-mail. FineWeb's pattern takes what stands
  before "@" in a URL as a local part ("http://example.com/user@host.org" becomes
  "http://" + an address); so do we.
* an IPv4 address: four dotted decimal octets 0-255, as FineWeb, but standing on their own
  (departure 1): not glued to a letter, digit or underscore on either side, not preceded by
  "digit." or followed by ".digit", so that "v1.2.3.4", "1.2.3.4.5", "x1.2.3.4", "1234.5.6.7" and
  "1.2.3.4a" are left whole (FineWeb replaces "99.1.1.1" inside "999.1.1.1" and "2.3.4.5" inside
  "1.2.3.4.5"); and not a version number (departure 2): an address right after "v", "ver",
  "version", "rev", "revision", "release" or "build" (any case, optionally with "." ":" "#" and
  spaces between) stays, so "version 8.8.8.8" keeps its 8.8.8.8. Octets with leading zeros
  ("010.001.001.001") are no address, to us and to FineWeb alike (Python's `ipaddress` refuses
  them since 3.9.5).
* public addresses only (departure 3, a fixed table instead of Python's `is_global`, which
  changes between Python releases): an address inside one of `NOT_PUBLIC` stays: "this network"
  0/8, private 10/8, 172.16/12 and 192.168/16, shared (carrier-grade NAT) 100.64/10, loopback
  127/8, link-local 169.254/16, IETF protocol assignments 192.0.0/24, the documentation ranges
  192.0.2/24, 198.51.100/24 and 203.0.113/24, benchmarking 198.18/15, multicast 224/4, and
  reserved 240/4 with the broadcast 255.255.255.255 (the IANA special-purpose blocks that are not
  globally reachable, and multicast, which names a group, never a person). Python 3.11's
  `is_global`, which FineWeb uses, calls multicast and most of 192.0.0/24 global.
* the replacement (departure 4): FineWeb cycles through its replacement strings on a counter of
  the task, so a document's output depends on which documents its task saw before it. Ours is
  the `index`-th string with index = xxh3_64(document id, seed=n) mod the number of strings, for
  the document's n-th address of a kind: the same document gets the same output in any run, on
  any number of tasks.

Both kinds are found on the text as written, e-mail addresses first (an IP inside one goes with
it); the replacements are then made in one pass, so the text between them is never touched.

Matching is linear in the text, also on hostile input (datatrove's e-mail pattern, tried from
every position, takes time quadratic in a run such as "a-a-a-...": 1.5 s for 10 KB). An e-mail
address is looked for only around an "@": the domain is matched anchored after it, the local part
read backwards from it in growing windows, and neither crosses another "@". An IPv4 address is
looked for only where "." is followed by dotted digits (a literal first character, which `re`
skips to at memchr speed), and is at most 15 characters. `benchmarks/filter_throughput.py`
times 1 MB adversarial documents.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

import xxhash
from datatrove.data import Document, DocumentsPipeline
from pydantic import Field

from gristmill.core.configlib import FilterConfig
from gristmill.core.filter import Filter, FilterResult

# --- e-mail addresses ---------------------------------------------------------------------------
#
# FineWeb's pattern, as a reader would write it down (the same language as datatrove's regex):
#   \b LOCAL @ DOMAIN
#   LOCAL  = ATOM (\. ATOM)*                       ATOM: RFC 5322 atext characters, at least one
#   DOMAIN = (LABEL \.)+ LABEL | \[ (OCTET \.){3} (OCTET | [A-Za-z0-9-]*[A-Za-z0-9]:) \]
#   LABEL  = [A-Za-z0-9] ([A-Za-z0-9-]* [A-Za-z0-9])?
# with octets 0-255, optionally zero-padded ("[01]?[0-9][0-9]?"). Leftmost-first scanning then
# means: for each "@", the longest local part before it that starts at a word boundary (\b, with
# Unicode word characters), ends right at the "@" and does not reach back into the previous
# address; and the domain as long as its labels go.

_ATEXT = "A-Za-z0-9!#$%&'*+/=?^_`{|}~-"
#: the characters of a local part, dots included, matched on the reversed text before an "@"
_LOCAL_RUN_REVERSED = re.compile(f"[.{_ATEXT}]*")  # "-" last: no range
_PADDED_OCTET = r"(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = re.compile(
    rf"(?:{_LABEL}\.)+{_LABEL}"
    rf"|\[(?:{_PADDED_OCTET}\.){{3}}(?:{_PADDED_OCTET}|[A-Za-z0-9-]*[A-Za-z0-9]:)\]"
)
#: characters read before an "@" at first; doubled while the local part's run fills the window
_LOCAL_WINDOW = 128


def _is_word(ch: str) -> bool:
    """What `re` counts as a word character (\\w) for a str pattern."""
    return ch.isalnum() or ch == "_"


def _local_start(text: str, lo: int, at: int) -> int:
    """Where the local part of the address whose "@" is at `at` starts, reading no further back
    than `lo`; -1 when none does."""
    if at == lo or text[at - 1] == ".":  # nothing before the "@", or a local part ending in "."
        return -1
    # the run of local-part characters ending at the "@", read backwards in growing windows
    window = _LOCAL_WINDOW
    while True:
        start = max(lo, at - window)
        piece = text[start:at][::-1]
        n = _LOCAL_RUN_REVERSED.match(piece).end()
        if n < len(piece) or start == lo:
            break
        window *= 2
    run_start = at - n
    if run_start == at:
        return -1
    # a local part holds no "..": it starts after the last one in the run
    dots = text.rfind("..", run_start, at)
    s = run_start if dots < 0 else dots + 2
    # the first position from there that starts an atom at a word boundary
    prev_word = s > 0 and _is_word(text[s - 1])
    while s < at:
        ch = text[s]
        word = _is_word(ch)
        if ch != "." and word != prev_word:
            return s
        prev_word = word
        s += 1
    return -1


def find_emails(text: str) -> list[tuple[int, int]]:
    """The (start, end) spans of the e-mail addresses FineWeb's pattern finds, in order."""
    spans: list[tuple[int, int]] = []
    last_end = 0  # the end of the previous address: the next one starts at or after it
    at = text.find("@")
    while at >= 0:
        # the domain first: it fails at once after most "@" that are no address ("a@ b")
        m = _DOMAIN.match(text, at + 1)
        if m:
            s = _local_start(text, last_end, at)
            if s >= 0:
                spans.append((s, m.end()))
                last_end = m.end()
        # no local part or domain holds an "@": the next address is around the next one
        at = text.find("@", max(at + 1, last_end))
    return spans


# --- IPv4 addresses -----------------------------------------------------------------------------

#: four dotted runs of one to three digits: every address, and more (checked in `find_ips`)
_DOTTED_DIGITS = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})")
#: what follows the first octet of such a run. Searched first: a pattern that starts with a
#: literal "." is skipped through at memchr speed (~2.5 us for 5 KB of English), where one that
#: starts with a digit tries every digit of the page (~50 us); 2% of the sample's pages hold one.
_AFTER_FIRST_OCTET = re.compile(r"\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]")
#: what makes the address that follows a version number (departure 2); searched up to the address
_VERSION_BEFORE = re.compile(r"(?i)(?<![\w])(?:v|ver|version|rev|revision|release|build)\.?[ \t]*[:#]?[ \t]*\Z")
_VERSION_LOOKBACK = 16  # the longest text _VERSION_BEFORE can match, with room for spacing
_AFTER_KEYWORD = frozenset(".:# \t")

#: the networks whose addresses are left in place (departure 3): (first address, prefix length)
NOT_PUBLIC = (
    ("0.0.0.0", 8),  # "this network"
    ("10.0.0.0", 8),  # private
    ("100.64.0.0", 10),  # shared address space (carrier-grade NAT)
    ("127.0.0.0", 8),  # loopback
    ("169.254.0.0", 16),  # link-local
    ("172.16.0.0", 12),  # private
    ("192.0.0.0", 24),  # IETF protocol assignments
    ("192.0.2.0", 24),  # documentation (TEST-NET-1)
    ("192.168.0.0", 16),  # private
    ("198.18.0.0", 15),  # benchmarking
    ("198.51.100.0", 24),  # documentation (TEST-NET-2)
    ("203.0.113.0", 24),  # documentation (TEST-NET-3)
    ("224.0.0.0", 4),  # multicast
    ("240.0.0.0", 4),  # reserved, and the limited broadcast 255.255.255.255
)


def _ip_int(dotted: str) -> int:
    a, b, c, d = map(int, dotted.split("."))
    return a << 24 | b << 16 | c << 8 | d


_NOT_PUBLIC_MASKS = tuple((_ip_int(net), (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF) for net, bits in NOT_PUBLIC)


# the networks by the first octets they hold: an address is checked against those of its own
_NOT_PUBLIC_BY_FIRST: dict[int, list[tuple[int, int]]] = {}
for _net, _mask in _NOT_PUBLIC_MASKS:
    for _first in range(256):
        if (_first << 24) & _mask == _net & 0xFF000000 & _mask:
            _NOT_PUBLIC_BY_FIRST.setdefault(_first, []).append((_net, _mask))


def is_public(address: int) -> bool:
    """False for an address (as an int) inside one of `NOT_PUBLIC`."""
    nets = _NOT_PUBLIC_BY_FIRST.get(address >> 24)
    return nets is None or not any(address & mask == net for net, mask in nets)


def _octet(digits: str) -> int:
    """The octet's value, or -1 for one above 255 or with a leading zero ("010")."""
    if len(digits) > 1 and digits[0] == "0":
        return -1
    value = int(digits)
    return value if value <= 255 else -1


def dotted_digits(text: str) -> Iterator[re.Match]:
    """`_DOTTED_DIGITS.finditer(text)`, at the speed of a search for `_AFTER_FIRST_OCTET`.

    Every run of dotted digits holds `_AFTER_FIRST_OCTET` right after its first octet, so the
    leftmost run from `pos` starts at most 3 digits before the leftmost such hit from `pos`
    (a run further left would hold an earlier hit); `_DOTTED_DIGITS` matches there, at the
    leftmost of those digits, whenever a digit precedes the hit.
    """
    pos = 0
    while hit := _AFTER_FIRST_OCTET.search(text, pos):
        dot = start = hit.start()
        first = max(pos, dot - 3)
        while start > first and "0" <= text[start - 1] <= "9":
            start -= 1
        if start == dot:  # no first octet: a later dot may start one
            pos = dot + 1
            continue
        m = _DOTTED_DIGITS.match(text, start)
        yield m
        pos = m.end()


def find_ips(text: str, public_only: bool = True) -> tuple[list[tuple[int, int]], int]:
    """The (start, end) spans of the IPv4 addresses to replace, and how many addresses were left
    because they are not public.

    An address stands on its own (departure 1): no word character (\\w: letters, digits, "_" of
    any script) or "digit." before it, no word character or ".digit" after. A run of dotted
    digits that fails this holds no address either: inside it every "." follows a digit.
    """
    spans, not_public = [], 0
    end = len(text)
    for m in dotted_digits(text):
        start, stop = m.span()
        if start and (
            _is_word(text[start - 1]) or (text[start - 1] == "." and start > 1 and "0" <= text[start - 2] <= "9")
        ):
            continue
        if stop < end and (
            _is_word(text[stop]) or (text[stop] == "." and stop + 1 < end and "0" <= text[stop + 1] <= "9")
        ):
            continue
        a, b, c, d = map(_octet, m.groups())
        if a < 0 or b < 0 or c < 0 or d < 0:
            continue
        # a version keyword ends in a letter, then maybe "." ":" "#" or blanks (never a letter:
        # the address would be glued to it)
        if (
            start
            and text[start - 1] in _AFTER_KEYWORD
            and _VERSION_BEFORE.search(text, max(0, start - _VERSION_LOOKBACK), start)
        ):
            continue
        if public_only and not is_public(a << 24 | b << 16 | c << 8 | d):
            not_public += 1
            continue
        spans.append((start, stop))
    return spans, not_public


# --- the step -----------------------------------------------------------------------------------


def choose(replacements: list[str], doc_id: str, n: int) -> str:
    """The replacement of a document's n-th address of a kind (departure 4)."""
    if len(replacements) == 1:
        return replacements[0]
    return replacements[xxhash.xxh3_64_intdigest(doc_id, seed=n) % len(replacements)]


class Replaced(NamedTuple):
    """One text's replacements: the new text, the replaced spans of the old one with what each
    became (in text order), and the counts."""

    text: str
    spans: list[tuple[int, int, str]]
    emails: int
    ips: int
    ips_not_public: int


def replace_pii(text: str, doc_id: str, c: PII.Config) -> Replaced:
    """`text` with its e-mail and IP addresses replaced by `c` (see the module docstring)."""
    emails = find_emails(text) if c.remove_emails and "@" in text else []
    ips, not_public = find_ips(text, c.only_remove_public_ips) if c.remove_ips else ([], 0)
    if ips and emails:  # an IP inside an e-mail address goes with the address
        inside = iter(emails)
        e = next(inside, None)
        kept = []
        for s, t in ips:
            while e is not None and e[1] <= s:
                e = next(inside, None)
            if e is None or t <= e[0]:
                kept.append((s, t))
        ips = kept
    if not emails and not ips:
        return Replaced(text, [], 0, 0, not_public)
    spans = [(s, t, choose(c.email_replacement, doc_id, n)) for n, (s, t) in enumerate(emails)]
    spans += [(s, t, choose(c.ip_replacement, doc_id, n)) for n, (s, t) in enumerate(ips)]
    spans.sort()
    parts, pos = [], 0
    for s, t, new in spans:
        parts += (text[pos:s], new)
        pos = t
    parts.append(text[pos:])
    return Replaced("".join(parts), spans, len(emails), len(ips), not_public)


class PII(Filter):
    yaml_name = "pii"
    #: the text with its addresses replaced, a new string (up to 4 bytes a character), and the
    #: matches (measured: 7, 44 and 167 MB over pages of 2, 8 and 30 MB)
    document_factor = 6.0
    document_fixed = 4 << 20

    class Config(FilterConfig):
        """datatrove's PIIFormatter parameter names and defaults, so that configs carry over."""

        remove_emails: bool = Field(True, description="replace e-mail addresses")
        remove_ips: bool = Field(True, description="replace IPv4 addresses")
        only_remove_public_ips: bool = Field(
            True, description="replace only public addresses (not private, loopback, multicast, documentation, ...)"
        )
        # example.com/org are reserved for examples (RFC 2606)
        email_replacement: list[str] = Field(
            ["email@example.com", "firstname.lastname@example.org"],
            min_length=1,
            description="what an address becomes (one of them, chosen by the document id and the address's number)",
        )
        # FineWeb's: random addresses that did not answer pings when its list was made
        ip_replacement: list[str] = Field(
            ["22.214.171.124", "126.96.36.199", "188.8.131.52", "184.108.40.206", "220.127.116.11", "18.104.22.168"],
            min_length=1,
            description="what an IP address becomes (chosen as email_replacement's)",
        )

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        # counted from the start, so that a run that replaced nothing says 0 in its stats
        self.stat_update("emails_replaced", "ips_replaced", "documents_touched", value=0)
        yield from super().run(data, rank, world_size)

    def filter(self, doc: Document, c: Config) -> FilterResult:
        r = replace_pii(doc.text, doc.id or "", c)
        if r.ips_not_public:
            self.stat_update("ips_not_public", value=r.ips_not_public)
        if r.spans:
            doc.text = r.text
            if r.emails:
                self.stat_update("emails_replaced", value=r.emails)
            if r.ips:
                self.stat_update("ips_replaced", value=r.ips)
            self.stat_update("documents_touched")
        return True
