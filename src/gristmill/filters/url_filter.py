"""URL filtering before anything reads the text, as RefinedWeb and FineWeb start (`url_filter`).

Rules and their sources:

- **Domain and URL blocklist.** RefinedWeb (Penedo et al. 2023, https://arxiv.org/abs/2306.01116,
  §3.1 "URL filtering" and appendix G.1) drops pages of an aggregated blocklist of 4.6M domains,
  aimed at adult and fraudulent sites; FineWeb (Penedo et al. 2024,
  https://arxiv.org/abs/2406.17557, its "base filtering") applies the same filter through
  datatrove's `URLFilter`. The list is the one datatrove ships in its wheel,
  `datatrove/assets/url_filterblacklistsv0_3_0.tar.gz`: two flat files, `domains` (4,558,940
  distinct lowercase ASCII hosts, 6,390 of them IPv4 addresses; the last line has no newline,
  so `wc -l` says 4,558,939) and `urls` (19,587 URLs written without a scheme, the format of
  the UT1 blacklists of Université Toulouse 1 Capitole); no categories.
- **Banned words, soft-banned words, banned subwords** (RefinedWeb's URL score, appendix G.1:
  hard, soft and strict violations), with datatrove's lists (`banned_words.txt`,
  `soft_banned_words.txt`, `banned_subwords.txt` in the same assets folder) and datatrove's
  meaning (`datatrove/pipeline/filters/url_filter.py`, 0.10.1): the URL is split on runs of
  characters other than ASCII letters and digits, case kept; a page goes when one of its words
  is a banned word, or when `soft_banned_threshold` (2) or more distinct words are soft-banned;
  list entries are lower-cased with those characters removed, so an upper-case `PORN` in a
  URL is no word of the list. For subwords the whole URL is reduced to its ASCII letters and
  digits, lower-cased, and a page goes when a subword occurs anywhere in it (`2girls1cup`
  matches `/2-Girls-1-Cup.html`).
- **User allow and deny lists** (gristmill's own): domains and URLs, inline or in files, each
  list under an optional category that names its drop reason (`user_denied_domain:gambling`).

Order and reasons, as datatrove's where datatrove has the rule: `user_denied_domain[:cat]`,
`user_denied_url[:cat]`, `blocklisted_domain` (datatrove's `domain`: the registered domain is
listed), `blocklisted_subdomain` (`subdomain`: the whole host is), `blocklisted_url` (`url`),
`banned_word` (`hard_blacklisted`), `soft_banned_words` (`soft_blacklisted`), `banned_subword`
(`blacklisted_subword`); a page without a URL goes as `missing_url` (datatrove asserts).
**Allow wins**: a page whose host or URL is on an allow list is kept whatever the deny lists,
the blocklist and the word rules say, and counted as `allowed_domain[:cat]` or
`allowed_url[:cat]`, plus `allowed_over_<reason>` when a rule would have dropped it.

Matching, `blocklist_match: datatrove` (the default: FineWeb's decisions, tested equal to
`URLFilter` on the shared WET sample and on generated adversarial URLs). Hosts are split into
registered domain and subdomains by `tldextract`'s bundled Public Suffix List snapshot, never
fetched (`TLDExtract(suffix_list_urls=())`; datatrove's own default would fetch the live list,
so its decisions drift with the day it runs); a plain lowercase host by tldextract's own walk
over tldextract's own rules (`HostSplit`, tested equal). Two lookups, exactly as datatrove makes
them: the registered domain, then the whole host, both as tldextract returns them (userinfo, port
and trailing dots gone, case and Unicode kept); the URL's full text against the URL list. What
follows from that, kept for equality and pinned by tests:

- `WWW.EXAMPLE.COM` and `bücher.example` pass a list holding `example.com` and `bücher.example`'s
  punycode (the list is lowercase ASCII, the lookup is not normalised); Common Crawl writes hosts
  in lowercase.
- `www.a.example.com` passes a list holding `a.example.com` (not a registered domain): only
  the registered domain and the whole host are looked up, no level between them.
- An IPv4 or IPv6 host has no registered domain: the 6,390 addresses in the list never match.
- The list's URLs have no scheme and the page's URL has one: the URL rule matches only a
  page URL written without a scheme.

Where tldextract reads another host than a browser goes to (the WHATWG URL standard's,
`url_host.browser_host`: `http://%62ad.com/` percent-decoded, `http://bad.com\\@x/` ending its
authority at the backslash, `http:/bad.com/` with one slash or none, a leading space, a tab
inside, `http://0x7f.1/` as an IPv4 address), the browser's host gets the same two lookups
too: a page a link would open at a listed host is dropped, whatever way the URL is written.
Where the two read the same host, nothing is added, so the quirks above stay.

`blocklist_match: host_suffixes` matches as a user would expect instead: the host a browser
goes to, lower-cased, IDNA-encoded label by label (Unicode and punycode forms match), and it and
each parent domain down to the registered domain looked up (an IP address as itself); URLs
compared as user URLs are (below). It drops a superset of datatrove's pages, all as `blocklisted_domain` or
`blocklisted_url`.

User lists. A domain entry covers its host and every host under it (`example.com` covers
`a.b.example.com`), compared as `host_suffixes` compares (the browser's host: lower-cased, IDNA,
trailing dots, userinfo and port ignored; a leading `*.` or `.` is dropped), so
`http://bad.com\\@good.com/` is no page of an allowed `good.com`. A URL entry is compared
without its scheme, userinfo and port, host normalised so, the URL split where a browser splits
it (`url_key`), path, query and fragment exact but the path's backslashes read as `/`, an
empty path read as `/`: `example.com/a?b` covers `https://user@EXAMPLE.com:8080/a?b`. Files hold one
entry a line; blank lines and lines starting with `#` are skipped. Where a host matches several
lists, the longest matching entry names the category, then the earlier list.

Memory and speed. A Python set of the 4.56M domains costs ~500 MB per task (datatrove's
`URLFilter` takes ~760 MB and 7 CPU seconds to load its lists, in every task). Here each list is
a sorted array of the 64-bit xxh3 hashes of its entries (UTF-8), in a file built once when the run
is planned (`cache_dir`, default `~/.cache/gristmill/url_filter/`, named by the sha256 of what it
is built from; ~9 CPU s for the blocklist) and memory-mapped by every task: 36.5 MB for the
domains, shared in the page cache by the tasks of a machine, searched within 2^20 buckets of the
hashes' top bits (4 MB of offsets a task); a list of at most `SET_MAX` entries (the 19,587 URLs)
is read into a set. The file carries its sources' digest and the sha256 of its hashes in its
header; planning rebuilds a file that is damaged, truncated or built from other lists, and a task
refuses, in one line, a file that differs from the one planned. A key that is on no list matches
by a hash collision with probability n / 2^64 per lookup: 2.5e-13 for the domain list, so a run
of 25 billion URLs (three lookups each) drops by mistake ~0.02 pages expected. Host verdicts are
cached per `scheme://authority` (`HOST_CACHE` entries, cleared when full); a page of a known host then
costs one authority match, one dict lookup, one set lookup of the URL, and the word rules on its
bytes (`bytes.translate` and an Aho-Corasick automaton). A task holds ~70 MB for the step (the
planner's estimate, `memory_bytes`; measured in tests); a URL of a new host costs ~3x less CPU
than datatrove's, 4x on the sample's URLs. Figures in docs/benchmarks.md ("URL filter").
"""

from __future__ import annotations

import importlib.resources
import io
import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import ahocorasick
from datatrove.data import Document, DocumentsPipeline
from pydantic import AfterValidator, Field, model_validator
from tldextract import TLDExtract
from tldextract.remote import lenient_netloc

from gristmill.core.configlib import OMIT_DEFAULT, ConfigError, FilterConfig, Strict
from gristmill.core.filter import Filter, FilterResult
from gristmill.core.messages import printable
from gristmill.core.step import BuildContext, Workload, config_key
from gristmill.filters.url_host import SPECIAL, browser_host
from gristmill.filters.url_host import parse as browser_parse
from gristmill.filters.url_lookup import (
    SET_ENTRY_BYTES,
    MappedHashes,
    ensure_lookup_file,
    file_sha256,
    key_hash,
    sources_key,
)

#: datatrove's assets folder (inside the installed wheel): the blocklist and the word lists
DATATROVE_ASSETS = importlib.resources.files("datatrove") / "assets"
BLOCKLIST_TARBALL = "url_filterblacklistsv0_3_0.tar.gz"
WORD_LISTS = ("banned_words.txt", "soft_banned_words.txt", "banned_subwords.txt")
#: datatrove's URLFilter drop reasons, as this step names them: the comparisons with datatrove
#: (tests, benchmarks) read its decisions through this table
DATATROVE_REASONS = {
    "domain": "blocklisted_domain",
    "subdomain": "blocklisted_subdomain",
    "url": "blocklisted_url",
    "hard_blacklisted": "banned_word",
    "soft_blacklisted": "soft_banned_words",
    "blacklisted_subword": "banned_subword",
}

#: authorities (`user@host:port`) whose host verdict a task keeps; the dict is cleared when full
HOST_CACHE = 1 << 16
#: bytes a cached authority costs (key string, verdict tuple, dict slot): measured 170 for
#: 30-character authorities
HOST_CACHE_ENTRY_BYTES = 250
#: tldextract's suffix tries, the word lists and their automaton: measured under 1 MB beyond the
#: modules' import (counted in BASE_TASK_BYTES)
RULES_BYTES = 8 << 20

# --- text of a URL, as datatrove reads it -------------------------------------------------------

_ALNUM = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
#: every byte that is no ASCII letter or digit becomes a space: `split()` then yields the runs of
#: letters and digits, which is what datatrove's `re.split("[^a-zA-Z0-9]+", url)` yields (less the
#: empty strings at the ends, which no list holds); a non-ASCII character is all bytes >= 0x80
_WORD_BYTES = bytes(b if b in _ALNUM else 0x20 for b in range(256))
#: lower-casing of ASCII letters, and the bytes to delete: datatrove's `normalize(url)`
_LOWER_BYTES = bytes(range(256)).lower()
_NOT_ALNUM = bytes(b for b in range(256) if b not in _ALNUM)
#: a scheme as tldextract's `lenient_netloc` recognises one (letters, digits, `+-.`, then `://`),
#: and the authority after it; for such a URL the host verdict depends on the authority alone
_AUTHORITY = re.compile(r"[A-Za-z0-9+.\-]+://([^/?#]*)")
_SCHEME = re.compile(r"[A-Za-z0-9+.\-]+://")
#: a scheme as the URL standard reads one (after leading spaces and controls)
_ANY_SCHEME = re.compile(r"[\x00-\x20]*([A-Za-z][A-Za-z0-9+.\-]*):")
_PATH_START = re.compile(r"[/?#]")
#: the dots tldextract reads as dots (ideographic and fullwidth full stops)
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def _datatrove_normalize(word: str) -> str:
    """datatrove's `normalize`: ASCII letters and digits, lower-cased."""
    return re.sub(r"[^a-zA-Z0-9]+", "", word).lower()


def datatrove_word_list(name: str) -> frozenset[str]:
    """One of datatrove's word lists as its `get_list` reads it: lines not starting with `#`,
    normalised; the empty word, which no list yields (tested), dropped."""
    lines = io.StringIO((DATATROVE_ASSETS / name).read_text(encoding="utf-8"))  # split as a file is
    words = {_datatrove_normalize(line) for line in lines if line[0] != "#"}
    return frozenset(words - {""})


# --- registered domains, as tldextract splits hosts -----------------------------------------------

#: an authority whose host is plain (lowercase ASCII letters, digits, `-` and `_`, non-empty labels,
#: no trailing dot) after the last `@` and before a `:`, as tldextract's `_host_from_authority` cuts
_PLAIN_AUTHORITY = re.compile(r"(?:.*@)?([a-z0-9_\-]+(?:\.[a-z0-9_\-]+)*)(?::[^@]*)?")


class HostSplit:
    """The registered domain and the whole host of a URL, exactly as tldextract (5.4) returns
    them (`top_domain_under_public_suffix`, `fqdn`) from its bundled Public Suffix List snapshot,
    private domains excluded as datatrove's default has it.

    A plain host (`_PLAIN_AUTHORITY`, no `xn--` label: nearly every Common Crawl host) is split
    here by tldextract's own walk (`_PublicSuffixListTLDExtractor.suffix_index`: labels from the
    right through a trie of its rules, `*` wildcards and `!` exceptions) over its own rules
    (`TLDExtract.tlds`), in ~1 us instead of ~4; any other host (upper case, punycode, Unicode,
    IP literals, odd dots) goes to tldextract itself. Tested equal to tldextract on the WET
    sample, the generated adversarial URLs and a sample of the blocklist's hosts."""

    def __init__(self):
        # the bundled snapshot, never fetched, no cache file written
        self.extract = TLDExtract(suffix_list_urls=(), cache_dir=None)
        self.root: dict = {}
        for rule in self.extract.tlds:  # the public rules (private ones excluded by default)
            node = self.root
            for label in reversed(rule.split(".")):
                node = node.setdefault(label, {})
            node[None] = True  # a rule ends here (None is no label)

    def __call__(self, url: str, authority: str | None) -> tuple[str, str, int]:
        """(registered domain, whole host, labels of the registered domain): ("", "", 0) for a
        host under no public suffix (an IP address, `localhost`)."""
        m = _PLAIN_AUTHORITY.fullmatch(authority) if authority is not None else None
        if m is None or "xn--" in m.group(1):
            parts = self.extract(url)
            registered = parts.top_domain_under_public_suffix
            return registered, parts.fqdn, registered.count(".") + 1 if registered else 0
        host = m.group(1)
        labels = host.split(".")
        n = len(labels)
        node, suffix, i = self.root, n, n
        for label in reversed(labels):
            child = node.get(label)
            if child is not None:
                i -= 1
                node = child
                if None in node:
                    suffix = i
                continue
            if "*" in node:  # a wildcard rule: one more label is suffix, unless an exception names it
                suffix = i if "!" + label in node else i - 1
            break
        if suffix == n or suffix == 0:  # no public suffix, or the host is one: no domain
            return "", "", 0
        return ".".join(labels[suffix - 1 :]), host, n - suffix + 1


# --- hosts and URLs as user lists compare them -----------------------------------------------------


def _ascii_label(label: str) -> str:
    if label.isascii():
        return label
    try:
        return label.encode("idna").decode("ascii")  # nameprep, then punycode (IDNA 2003)
    except UnicodeError:  # an empty or over-long label, a forbidden character: plain punycode
        return "xn--" + label.encode("punycode").decode("ascii")


def normalize_host(host: str) -> str:
    """A host as lists compare it: full stops of other scripts read as dots, lower-cased, trailing
    dots gone, each non-ASCII label IDNA-encoded (so `bücher.de` equals `xn--bcher-kva.de`)."""
    host = host.translate(_DOTS).strip().rstrip(".").lower()
    if host.isascii():
        return host
    return ".".join(_ascii_label(label) for label in host.split("."))


def _authority_host(authority: str) -> str:
    """The host of `user@host:port` (an IPv6 host keeps its brackets)."""
    host = authority.rpartition("@")[2]
    if host.startswith("["):
        inside, bracket, _ = host.partition("]")
        return inside + bracket
    return host.partition(":")[0]


#: how `url_key` reads a URL: part of the name of a URL list's lookup file, so that a list built
#: under an earlier reading is rebuilt
URL_KEY_VERSION = "whatwg-host"


def url_key(url: str) -> str:
    """A URL as user lists compare it: no scheme, userinfo or port, the host normalised, an
    empty path read as `/`; path, query and fragment as written. A URL of a special scheme
    (`http:`, `https:`, ... with any slashes) or written `scheme://` is split where a browser
    splits it (`url_host.parse`: `http://bad.com\\@good.com/x` is bad.com's `/@good.com/x`);
    an entry without a scheme (`example.com/a`), or one no browser opens, as written."""
    scheme = _ANY_SCHEME.match(url)
    if scheme is not None and (scheme.group(1).lower() in SPECIAL or url[scheme.end() :].startswith("//")):
        parsed = browser_parse(url)
        if parsed is not None and parsed.host:
            path = parsed.rest if parsed.rest.startswith("/") else "/" + parsed.rest
            return normalize_host(parsed.host) + path
    m = _SCHEME.match(url)
    rest = url[m.end() :] if m else url.removeprefix("//")
    cut = _PATH_START.search(rest)
    authority, path = (rest[: cut.start()], rest[cut.start() :]) if cut else (rest, "")
    if not path.startswith("/"):
        path = "/" + path
    return normalize_host(_authority_host(authority)) + path


def parent_domains(host: str, keep_labels: int = 1) -> Iterator[str]:
    """`host`, then each parent domain while it keeps at least `keep_labels` labels."""
    labels = host.split(".")
    for i in range(max(len(labels) - keep_labels, 0) + 1):
        yield ".".join(labels[i:])


def domain_entry(entry: str) -> str:
    """A user's domain entry, normalised; `*.example.com` and `.example.com` mean `example.com`."""
    entry = entry.strip()
    return normalize_host(entry.removeprefix("*.").removeprefix("."))


def _domain_entry_problem(entry: str) -> str | None:
    value = entry.strip()
    if not value:
        return "an empty domain"
    if any(c in value for c in "/@ \t") or value.count(":") and not value.startswith("["):
        return f"{value!r} is no domain (a URL belongs under `urls`)"
    return None


def _check_domain(entry: str) -> str:
    problem = _domain_entry_problem(entry)
    if problem:
        raise ValueError(problem)
    return entry


def _check_url(entry: str) -> str:
    if not entry.strip():
        raise ValueError("an empty URL")
    return entry


# --- the datatrove blocklist as lookup files ------------------------------------------------------


def blocklist_entries(tarball: Path, member: str) -> Iterator[str]:
    """The entries of the tarball's `domains` or `urls` file as datatrove's `get_list` reads them
    (`do_normalize=False`): every line not starting with `#`, stripped."""
    with tarfile.open(tarball, "r:gz") as tar:
        f = tar.extractfile(member)
        if f is None:
            raise ConfigError(f"url_filter: {tarball}: no file {member!r} inside")
        for line in io.TextIOWrapper(f, encoding="utf-8", newline=None):
            if line[0] != "#":
                yield line.strip()


# --- the step -------------------------------------------------------------------------------------


class UrlList(Strict):
    """One allow or deny list: domains and URLs, inline or in files, under one optional category."""

    category: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.\-]+$",
        description="names the list's drop reason (`user_denied_domain:<category>`); letters, digits, `_.-`",
    )
    domains: list[Annotated[str, AfterValidator(_check_domain)]] = Field(
        [], description="domains; each covers its subdomains"
    )
    urls: list[Annotated[str, AfterValidator(_check_url)]] = Field(
        [], description="URLs, compared without scheme, userinfo and port"
    )
    domains_file: str | None = Field(None, description="file of domains, one a line (`#` comments)")
    urls_file: str | None = Field(None, description="file of URLs, one a line (`#` comments)")

    @model_validator(mode="after")
    def _something(self):
        if not (self.domains or self.urls or self.domains_file or self.urls_file):
            raise ValueError("an empty list: give domains, urls, domains_file or urls_file")
        return self


@dataclass
class _UserSource:
    """One user list's domains or URLs, in memory (inline entries) or memory-mapped (a file)."""

    action: Literal["allow", "deny"]
    kind: Literal["domain", "url"]
    label: str  # the reason or stat it counts under: `user_denied_domain:gambling`, `allowed_url`
    hashes: frozenset[int] | MappedHashes


class UrlFilter(Filter):
    """URL blocklist and URL words, as FineWeb and RefinedWeb apply them first (datatrove's
    `URLFilter`: same lists, rules, order and decisions), plus user allow and deny lists by
    category; lists memory-mapped as sorted 64-bit hashes (~60 MB a task instead of ~850 MB)."""

    yaml_name = "url_filter"
    #: a page's text is never read, only its URL: a long page costs nothing more (measured: under
    #: 1 MB over pages of 2, 8 and 30 MB; what is held for URLs is `memory_bytes`)
    document_fixed = 1 << 20
    drop_reasons = (
        "missing_url",
        "user_denied_domain[:<category>]",
        "user_denied_url[:<category>]",
        "blocklisted_domain",
        "blocklisted_subdomain",
        "blocklisted_url",
        "banned_word",
        "soft_banned_words",
        "banned_subword",
    )

    class Config(FilterConfig):
        """The rules of datatrove's URLFilter (its defaults), then the user's lists."""

        language_fixed = (
            "blocklist",
            "blocklist_match",
            "banned_words",
            "soft_banned_threshold",
            "allow",
            "deny",
            "cache_dir",
        )

        blocklist: bool = Field(True, description="drop pages of datatrove's 4.56M domains and 19,587 URLs")
        blocklist_match: Literal["datatrove", "host_suffixes"] = Field(
            "datatrove",
            description="`datatrove`: its lookups exactly (registered domain, whole host, URL text: FineWeb's "
            "decisions); `host_suffixes`: host lower-cased and IDNA-encoded, it and every parent domain, "
            "IP hosts, URLs without scheme",
        )
        banned_words: bool = Field(
            True, description="drop URLs holding a banned word or subword, or enough soft-banned words (RefinedWeb)"
        )
        soft_banned_threshold: int = Field(2, ge=1, description="soft-banned words that drop a URL")
        allow: list[UrlList] = Field(
            [],
            description="lists whose pages are kept whatever the other rules say, each "
            "{category, domains, urls, domains_file, urls_file}",
        )
        deny: list[UrlList] = Field(
            [], description="lists whose pages go as `user_denied_<domain|url>[:<category>]`, each as in `allow`"
        )
        cache_dir: str = Field(
            "~/.cache/gristmill/url_filter",
            description="where the lookup files are built at planning; every task must read it",
            json_schema_extra=OMIT_DEFAULT,
        )

    @classmethod
    def build(cls, config: Config, ctx: BuildContext, step_id: str | None = None) -> UrlFilter:
        # list files given as http(s) URLs are fetched to the local cache now, once
        return cls(config, step_id=step_id, local_path=ctx.local_path)

    def __init__(self, config: Config | None = None, /, *, local_path: Callable[[str], Path] | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        resolve = local_path or (lambda p: Path(p).expanduser())
        cache_dir = Path(c.cache_dir).expanduser()
        self.host_suffixes = c.blocklist_match == "host_suffixes"
        self.block_domains: MappedHashes | None = None
        self.block_urls: MappedHashes | None = None
        if c.blocklist:
            self.block_domains, self.block_urls = self._blocklist(cache_dir)
        self.banned: frozenset[bytes] = frozenset()
        self.soft_banned: frozenset[bytes] = frozenset()
        self.subwords: tuple[str, ...] = ()
        if c.banned_words:
            banned, soft, subwords = (datatrove_word_list(name) for name in WORD_LISTS)
            self.banned = frozenset(w.encode() for w in banned)
            self.soft_banned = frozenset(w.encode() for w in soft)
            self.subwords = tuple(sorted(subwords))
        self.soft_threshold = c.soft_banned_threshold
        # errors name the key the user wrote: `steps[2].url_filter.deny[0].domains_file`
        key = config_key(self.name)
        self.user: list[_UserSource] = []
        for action, lists in (("allow", c.allow), ("deny", c.deny)):
            for i, user_list in enumerate(lists):
                self.user += self._user_sources(action, f"{key}.{action}[{i}]", user_list, resolve, cache_dir)
        self.user_domains = [s for s in self.user if s.kind == "domain"]
        self.user_urls = [s for s in self.user if s.kind == "url"]
        # built in the task (`_open`): not pickled
        self._split: HostSplit | None = None
        self._automaton = None
        self._hosts: dict[str, tuple] = {}

    def _blocklist(self, cache_dir: Path) -> tuple[MappedHashes, MappedHashes]:
        tarball = Path(str(DATATROVE_ASSETS / BLOCKLIST_TARBALL))
        if not tarball.is_file():
            raise ConfigError(f"{self.name}.blocklist: {tarball} is missing from the installed datatrove")
        source = file_sha256(tarball)
        # the domains are lowercase ASCII hosts (tested), which normalize_host leaves unchanged:
        # one file serves both matches; the URLs are compared as written, or as url_key makes them
        domains = ensure_lookup_file(
            cache_dir,
            "blocklist-domains",
            sources_key(source, "domains"),
            lambda: blocklist_entries(tarball, "domains"),
        )
        if self.host_suffixes:
            urls = ensure_lookup_file(
                cache_dir,
                "blocklist-urls-normalised",
                sources_key(source, "urls", "url_key"),
                lambda: map(url_key, blocklist_entries(tarball, "urls")),
            )
        else:
            urls = ensure_lookup_file(
                cache_dir, "blocklist-urls", sources_key(source, "urls"), lambda: blocklist_entries(tarball, "urls")
            )
        return MappedHashes(domains), MappedHashes(urls)

    def _user_sources(self, action: str, where: str, user_list: UrlList, resolve, cache_dir: Path) -> list[_UserSource]:
        suffix = f":{user_list.category}" if user_list.category else ""
        out = []
        for kind, inline, file_key in (
            ("domain", user_list.domains, "domains_file"),
            ("url", user_list.urls, "urls_file"),
        ):
            label = f"{'allowed' if action == 'allow' else 'user_denied'}_{kind}{suffix}"
            normalise = domain_entry if kind == "domain" else url_key
            if inline:
                out.append(_UserSource(action, kind, label, frozenset(key_hash(normalise(e)) for e in inline)))
            given = getattr(user_list, file_key)
            if given is None:
                continue
            path = resolve(given)
            if not path.is_file():
                raise ConfigError(printable(f"{where}.{file_key}: {path}: no such file"))
            # read (and its entries checked) only when its lookup file is built: a cached one was
            # built from these very bytes
            lookup = ensure_lookup_file(
                cache_dir,
                f"user-{kind}s",
                sources_key(file_sha256(path), kind, *([URL_KEY_VERSION] if kind == "url" else [])),
                lambda path=path, at=f"{where}.{file_key}", kind=kind, normalise=normalise: map(
                    normalise, _read_list_file(path, at, kind)
                ),
            )
            out.append(_UserSource(action, kind, label, MappedHashes(lookup)))
        return out

    # --- in the task ---------------------------------------------------------------------------

    def _open(self) -> None:
        """Map the lookup files (refusing any changed since planning), build the splitter and the
        automaton: before the first document, so the step's timer measures filtering only."""
        if self._split is not None:
            return
        for hashes in (self.block_domains, self.block_urls, *(s.hashes for s in self.user)):
            if isinstance(hashes, MappedHashes):
                hashes.open()
        if self.subwords:
            automaton = ahocorasick.Automaton(ahocorasick.STORE_INTS)
            for i, word in enumerate(self.subwords):
                automaton.add_word(word, i)
            automaton.make_automaton()
            self._automaton = automaton
        self._split = HostSplit()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.update(_split=None, _automaton=None, _hosts={})
        return state

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        self._open()
        yield from super().run(data, rank, world_size)

    def memory_bytes(self, work: Workload) -> int:
        """The lookup files' hashes (resident as binary search touches them; shared between the
        tasks of a machine through the page cache), inline lists as Python sets, the host cache
        full, and the rules (suffix tries, word lists, automaton): ~60 MB with the blocklist. And
        what every filter holds (`Filter.memory_bytes`)."""
        mapped = sum(
            h.memory_bytes()
            for h in (self.block_domains, self.block_urls, *(s.hashes for s in self.user))
            if isinstance(h, MappedHashes)
        )
        inline = sum(len(s.hashes) * SET_ENTRY_BYTES for s in self.user if isinstance(s.hashes, frozenset))
        return mapped + inline + HOST_CACHE * HOST_CACHE_ENTRY_BYTES + RULES_BYTES + super().memory_bytes(work)

    def _host_verdict(self, url: str, authority: str | None) -> tuple[str | None, str | None, str | None]:
        """(allow label, user deny reason, blocklist reason) of the URL's host: a function of its
        authority alone (`authority`: None for a URL whose scheme tldextract would not strip)."""
        block = None
        # the host a browser goes to (percent-decoded, `\\` as `/`, userinfo and port gone,
        # IPv4 forms read); where it opens none, the host tldextract reads
        lenient = normalize_host(lenient_netloc(url))
        browser = browser_host(url)
        host = browser if browser is not None else lenient
        if self.block_domains is not None:
            contains = self.block_domains.contains
            if not self.host_suffixes:  # datatrove's two lookups, as tldextract returns the names
                block = self._datatrove_lookups(*self._split(url, authority)[:2])
                if block is None and browser is not None and browser != lenient:
                    # tldextract read another host than the browser's (`http://%62ad.com/`,
                    # `http://bad.com\\@x/`, `http:/bad.com/`): the same lookups of the browser's
                    block = self._datatrove_lookups(*self._split(f"http://{browser}/", browser)[:2])
            else:
                labels = self._split(f"http://{host}/", host)[2] if host else 0
                # down to the registered domain, never the bare public suffix; a host outside the
                # suffix list (an IP address, `localhost`) as itself
                keep = labels or host.count(".") + 1
                if host and any(contains(key_hash(d)) for d in parent_domains(host, keep)):
                    block = "blocklisted_domain"
        allow = deny = None
        if self.user_domains:
            if host:
                # longest entry first, then the list's order
                for d in parent_domains(host):
                    h = key_hash(d)
                    for s in self.user_domains:
                        if h in s.hashes:
                            if s.action == "allow":
                                allow = allow or s.label
                            else:
                                deny = deny or s.label
        return allow, deny, block

    def _datatrove_lookups(self, registered: str, fqdn: str) -> str | None:
        contains = self.block_domains.contains
        if registered and contains(key_hash(registered)):
            return "blocklisted_domain"
        if fqdn and fqdn != registered and contains(key_hash(fqdn)):
            return "blocklisted_subdomain"
        return None

    def _url_verdict(self, url: str) -> tuple[str | None, str | None]:
        """(allow label, user deny reason) of the URL itself."""
        h = key_hash(url_key(url))
        allow = deny = None
        for s in self.user_urls:
            if h in s.hashes:
                if s.action == "allow":
                    allow = allow or s.label
                else:
                    deny = deny or s.label
        return allow, deny

    def _words(self, url: str) -> str | None:
        """RefinedWeb's URL words, with datatrove's meaning, on the URL's bytes."""
        if self._automaton is None and not self.banned:
            return None
        raw = url.encode("utf-8", "surrogatepass")
        words = raw.translate(_WORD_BYTES).split()  # a list: the sets below are the lists' (faster)
        if not self.banned.isdisjoint(words):
            return "banned_word"
        if len(self.soft_banned.intersection(words)) >= self.soft_threshold:  # distinct words, as datatrove
            return "soft_banned_words"
        if self._automaton is not None:
            letters = raw.translate(_LOWER_BYTES, _NOT_ALNUM).decode("ascii")
            if next(self._automaton.iter(letters), None) is not None:
                return "banned_subword"
        return None

    def filter(self, doc: Document, config: Config) -> FilterResult:
        url = doc.metadata.get("url")
        if not url or not isinstance(url, str):
            return False, "missing_url"
        if self._split is None:
            self._open()
        m = _AUTHORITY.match(url)
        # cached by `scheme://authority`, which decides both readings of the host, unless the
        # authority is empty or only backslashes (a browser then skips them and the slashes after)
        if m is None or not m.group(1).lstrip("\\"):
            allow, reason, block = self._host_verdict(url, None if m is None else m.group(1))
        else:
            key = m.group(0)
            hosts = self._hosts
            verdict = hosts.get(key)
            if verdict is None:
                if len(hosts) >= HOST_CACHE:
                    hosts.clear()
                verdict = hosts[key] = self._host_verdict(url, m.group(1))
            allow, reason, block = verdict
        if self.user_urls:
            allow_url, deny_url = self._url_verdict(url)
            allow, reason = allow or allow_url, reason or deny_url
        if reason is None:
            reason = block
        if reason is None and self.block_urls is not None:
            key = url_key(url) if self.host_suffixes else url
            if self.block_urls.contains(key_hash(key)):
                reason = "blocklisted_url"
        if reason is None:
            reason = self._words(url)
        if allow is not None:
            self.stat_update(allow)
            if reason is not None:
                self.stat_update(f"allowed_over_{reason}")
            return True
        return True if reason is None else (False, reason)


def _read_list_file(path: Path, where: str, kind: str) -> Iterator[str]:
    """A user list file's entries; a domain that is no domain is an error naming file and line."""
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                entry = line.strip()
                if not entry or entry.startswith("#"):
                    continue
                if kind == "domain":
                    problem = _domain_entry_problem(entry)
                    if problem:
                        raise ConfigError(printable(f"{where}: {path}, line {n}: {problem}"))
                yield entry
    except UnicodeDecodeError as e:
        raise ConfigError(printable(f"{where}: {path}: not UTF-8 text (byte {e.start})")) from None
