"""`url_filter`: decisions equal to datatrove's URLFilter on the shared WET sample and on generated
adversarial URLs; user allow/deny lists and their categories; config errors; lookup files damaged,
truncated or stale; the memory of a task."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from datatrove.data import Document
from loguru import logger

from gristmill.config import ConfigError, from_dict
from gristmill.core.step import BASE_TASK_BYTES, Workload, registered_steps
from gristmill.filters import url_filter as uf
from gristmill.filters.url_filter import (
    BLOCKLIST_TARBALL,
    DATATROVE_ASSETS,
    DATATROVE_REASONS,
    UrlFilter,
    blocklist_entries,
    datatrove_word_list,
    normalize_host,
    url_key,
)
from gristmill.filters.url_lookup import HEADER_BYTES, LookupFileError
from gristmill.input.wet import WetReader
from tests.cli_process import pipeline

REPO = Path(__file__).resolve().parents[2]
# datatrove's URLFilter reads tldextract's `registered_domain`, deprecated since tldextract 5.3
pytestmark = pytest.mark.filterwarnings("ignore:The 'registered_domain' property is deprecated:DeprecationWarning")
TARBALL = Path(str(DATATROVE_ASSETS / BLOCKLIST_TARBALL))
#: the stated bound on a task's memory for the step with datatrove's lists (beyond BASE_TASK_BYTES)
TASK_BOUND = 80 << 20


def doc(url) -> Document:
    return Document(text="x", id="0", metadata={"url": url} if url is not None else {})


def decide(step: UrlFilter, url) -> bool | str:
    """True, or the drop reason."""
    result = step.filter(doc(url), step.config)
    return True if result is True else result[1]


# --- the two filters, built once ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """The module's lookup folder, holding copies of the blocklist's lookup files from the default
    folder (`~/.cache/gristmill/url_filter`: built there once per machine by whatever runs the step
    first, this fixture included, ~9 CPU s; the recipe runs and benchmark smokes use it too).
    Planning checks a copied file as it checks any; the tests that build one build their own."""
    default = Path(UrlFilter().config.cache_dir).expanduser()  # builds the default's files if missing
    folder = tmp_path_factory.mktemp("url_filter_cache")
    for f in default.glob("blocklist-*.hashes"):
        shutil.copyfile(f, folder / f.name)
    return folder


@pytest.fixture(scope="module")
def ours(cache_dir) -> UrlFilter:
    return UrlFilter(cache_dir=str(cache_dir))


@pytest.fixture(scope="module")
def suffixes(cache_dir) -> UrlFilter:
    return UrlFilter(cache_dir=str(cache_dir), blocklist_match="host_suffixes")


@pytest.fixture(scope="module")
def datatrove():
    """datatrove's URLFilter with its integrated lists, splitting hosts by the same bundled Public
    Suffix List snapshot (its default TLDExtract() would fetch the live list)."""
    pytest.importorskip("fasteners", reason="datatrove's URLFilter needs the bench extra: pip install -e '.[bench]'")
    from datatrove.pipeline.filters.url_filter import URLFilter
    from tldextract import TLDExtract

    f = URLFilter()
    f.tldextractor = TLDExtract(suffix_list_urls=())
    f.download_data()
    return f


def datatrove_decide(f, url: str) -> bool | str:
    result = f.filter(doc(url))
    return True if result is True else DATATROVE_REASONS[result[1]]


@pytest.fixture(scope="module")
def sample_urls(wet_files) -> list[str]:
    return [d.metadata["url"] for d in WetReader([str(p) for p in wet_files]).run()]


@pytest.fixture(scope="module")
def listed() -> dict[str, list[str]]:
    """Entries of datatrove's blocklist to build URLs from: every 20,000th domain, the first IPv4
    addresses, hosts that are no registered domain (`a.example.com`: the `subdomain` rule), the
    first domains holding `_`, and every 400th URL."""
    from tldextract import TLDExtract

    split = TLDExtract(suffix_list_urls=(), cache_dir=None)
    out = {"domains": [], "ips": [], "hosts": [], "underscore": []}
    for i, d in enumerate(blocklist_entries(TARBALL, "domains")):
        if i % 20_000 == 0:
            out["domains"].append(d)
        if re.fullmatch(r"[\d.]+", d):
            if len(out["ips"]) < 20:
                out["ips"].append(d)
        elif "_" in d:
            if len(out["underscore"]) < 20:
                out["underscore"].append(d)
        elif len(out["hosts"]) < 100 and i % 50 == 0 and split(d).top_domain_under_public_suffix != d:
            out["hosts"].append(d)
    out["urls"] = list(itertools.islice(blocklist_entries(TARBALL, "urls"), 0, None, 400))
    return out


def _word_lines(name: str) -> list[str]:
    return [x.strip() for x in (DATATROVE_ASSETS / name).read_text().splitlines() if x.strip() and x[0] != "#"]


def adversarial_urls(listed: dict[str, list[str]], sample: list[str]) -> list[str]:
    """A few thousand URLs meant to separate two implementations: blocked hosts with `www.` and
    other subdomains, ports, userinfo, upper case, trailing and ideographic dots, IDNs and
    punycode, hosts that only contain a blocked one; the list's URLs with and without schemes;
    banned, soft-banned and sub-words in paths, queries, hosts, in upper case and split by
    punctuation; IP hosts; malformed URLs. Deterministic."""
    rng = random.Random(1234)
    urls: list[str] = []
    for d in listed["domains"] + listed["hosts"] + listed["ips"] + listed["underscore"]:
        urls += [
            f"http://{d}/",
            f"https://{d}/index.html?x=1",
            f"http://www.{d}/",
            f"http://a.b.{d}/p",
            f"http://{d.upper()}/",
            f"http://WWW.{d}/",
            f"http://{d}./",
            f"http://{d}..//",
            f"http://{d}:8080/x",
            f"http://user:pass@{d}/",
            f"http://{d}@example.org/",
            f"http://{d}?q=1",
            f"http://{d}#frag",
            f"//{d}/x",
            f"{d}/path",
            d,
            f"ftp://{d}/",
            f"HTTP://{d}/",
            f"http://{d}\u3002/",
            f"http://{d}\uff0e/",
            f"http://bücher.{d}/",
            f"http://xn--bcher-kva.{d}/",
            f"http://{d}.evil-example.com/",
            f"http://not{d}/",
            f"http:/{d}/",
            f"http://{d} /",
            f" http://{d}/",
            f"http://[{d}]/",
        ]
    for u in listed["urls"]:
        urls += [u, f"http://{u}", f"https://{u}", f"{u}/", f"http://www.{u}", u.upper()]
    banned = _word_lines("banned_words.txt")
    soft = _word_lines("soft_banned_words.txt")
    subwords = _word_lines("banned_subwords.txt")
    for w in rng.sample(banned, 60):
        urls += [
            f"http://example.com/{w}",
            f"http://example.com/{w.upper()}",
            f"http://example.com/{w.capitalize()}/page",
            f"http://example.com/x{w}y",
            f"http://example.com/?q={w}&p=1",
            f"http://{w}.example.com/",
            f"http://example.com/a_{w}_b",
            f"http://example.com/é{w}é",
            f"http://example.com/{w}1",
        ]
    for a, b in zip(rng.sample(soft, 40), rng.sample(soft, 40)):
        urls += [
            f"http://example.com/{a}",
            f"http://example.com/{a}/{a}",
            f"http://example.com/{a}/{b}",
            f"http://example.com/{a}-{b}.html",
            f"http://{a}.example.com/{b}",
            f"http://example.com/{a.upper()}/{b}",
            f"http://example.com/{a}{b}",
        ]
    for s in rng.sample(subwords, 60):
        urls += [
            f"http://example.com/{s.replace(' ', '-')}",
            f"http://example.com/{s.replace(' ', '').upper()}.html",
            f"http://example.com/x{s.replace(' ', '_')}y",
            f"http://{s.replace(' ', '')}.example.com/",
            f"http://example.com/?q={s.replace(' ', '+')}",
            f"http://example.com/{'é'.join(s.replace(' ', ''))}",
            f"http://example.com/{s.replace(' ', '')[:-1]}",
        ]
    urls += [
        "http://1.0.218.19/",
        "http://127.0.0.1:8080/porn",
        "http://[::1]/",
        "http://[2001:db8::1]:80/x",
        "http://[::1",
        "http://]/",
        "http://",
        "://",
        "http:///path",
        "http://.",
        "http://.../",
        "http://a..b.com/",
        "http://-x-.com/",
        "not a url",
        "mailto:someone@pornhub.com",
        "javascript:alert('porn')",
        "http://%70ornhub.com/",
        "http://pornhub.com%2F@example.com/",
        "http://user@pornhub.com:99999999/",
        "http://例え.テスト/",
        "http://xn--r8jz45g.xn--zckzah/",
        "http://xn--/",
        "http://\udcff.com/",
        "http://exa\u0000mple.com/",
        "http://example.com/\u2028porn",
        "h t t p://pornhub.com/",
        "http://localhost/",
        "http://com/",
        "http://co.uk/",
        "http://blogspot.com/",
        "http://x.blogspot.com/",
        "http:\\\\pornhub.com\\",
        "HTTPS://PORNHUB.COM/",
        "https://pornhub.com",
        "https://www.pornhub.com/view_video.php?viewkey=1",
        "http://example.com/" + "a" * 5000,
        "http://" + "a." * 300 + "com/",
    ]
    # the sample's own URLs, with their hosts dressed up
    for u in sample[::3]:
        m = re.match(r"(https?://)([^/?#]*)(.*)", u)
        if m:
            scheme, host, rest = m.groups()
            urls += [f"{scheme}{host.upper()}{rest}", f"{scheme}www.{host}:81{rest}", f"{scheme}u@{host}.{rest}"]
    return urls


@pytest.fixture(scope="module")
def generated(listed, sample_urls) -> list[str]:
    return adversarial_urls(listed, sample_urls)


# --- equality with datatrove ----------------------------------------------------------------------


def _disagreements(ours: UrlFilter, theirs, urls: list[str]) -> list[tuple[str, object, object]]:
    out = []
    for u in urls:
        a, b = decide(ours, u), datatrove_decide(theirs, u)
        if a != b:
            out.append((u, a, b))
    return out


def test_the_blocklist_is_what_the_docstring_says():
    domains = list(blocklist_entries(TARBALL, "domains"))
    urls = list(blocklist_entries(TARBALL, "urls"))
    assert (len(domains), len(set(domains))) == (4_558_940, 4_558_940)
    assert (len(urls), len(set(urls))) == (19_587, 19_587)
    # flat lowercase ASCII hosts, no categories: what normalize_host leaves unchanged. Asked of all
    # of them joined by new lines, at once (a loop over 4.6M hosts takes ~10 s): its translation and
    # lower-casing work character by character, an ASCII host is returned as it is, and its strips
    # act only at the ends, so each entry (stripped by blocklist_entries) must not end in a dot
    joined = "\n".join(domains)
    assert normalize_host(joined) == joined and joined.isascii()
    assert "/" not in joined and ".\n" not in joined + "\n" and "" not in domains
    assert len(re.findall(r"(?m)^\d+\.\d+\.\d+\.\d+$", joined)) == 6_390
    assert not any("://" in u for u in urls)
    # the word lists hold no empty word (which would match every URL ending in `/`)
    for name in uf.WORD_LISTS:
        words = datatrove_word_list(name)
        assert words and "" not in words
    assert len(datatrove_word_list("banned_words.txt")) == 203


def test_decisions_equal_datatrove_on_the_wet_sample(ours, datatrove, sample_urls):
    assert len(sample_urls) == 609
    assert _disagreements(ours, datatrove, sample_urls) == []
    decisions = [decide(ours, u) for u in sample_urls]
    # the sample holds pages of listed adult sites: the rules are exercised, not vacuously equal
    assert decisions.count("blocklisted_domain") == 24 and decisions.count("banned_word") == 1


def _reads_another_host(url: str) -> bool:
    """tldextract's host of `url` is not the one a browser goes to."""
    from tldextract.remote import lenient_netloc

    from gristmill.filters.url_host import browser_host

    browser = browser_host(url)
    return browser is not None and browser != normalize_host(lenient_netloc(url))


def test_decisions_equal_datatrove_on_generated_adversarial_urls(ours, datatrove, generated):
    """Equal, but where tldextract reads another host than a browser's (`http:/bad.com/`, a
    leading space): there the browser's host is looked up too, and drops it when listed (before
    the word rules, which datatrove then applies)."""
    assert len(generated) > 3000
    bad = _disagreements(ours, datatrove, generated)
    blocked = ("blocklisted_domain", "blocklisted_subdomain")
    misread = [(u, a, b) for u, a, b in bad if a in blocked and b not in blocked and _reads_another_host(u)]
    assert len(misread) == len(bad) > 0, f"{len(bad)} disagreements, first: {[x for x in bad if x not in misread][:10]}"
    reasons = {datatrove_decide(datatrove, u) for u in generated}
    assert reasons == {True, *DATATROVE_REASONS.values()}  # every rule fired somewhere


def test_host_cache_changes_no_decision(cache_dir, generated, ours):
    expected = [decide(ours, u) for u in generated]
    fresh = UrlFilter(cache_dir=str(cache_dir))
    order = list(range(len(generated)))
    random.Random(7).shuffle(order)
    uf_cache, uf.HOST_CACHE = uf.HOST_CACHE, 97  # cleared many times on the way
    try:
        got = {i: decide(fresh, generated[i]) for i in order}
    finally:
        uf.HOST_CACHE = uf_cache
    assert [got[i] for i in range(len(generated))] == expected


def test_datatrove_quirks_kept_and_host_suffixes_fixes_them(ours, suffixes, datatrove, generated):
    quirks = {
        "http://WWW.0-800-EMAIL.COM/": "blocklisted_domain",  # case: the list is lowercase
        "http://1.0.218.19/": "blocklisted_domain",  # an IPv4 host has no registered domain
        "http://0b1-bofa.org/bofa/": "blocklisted_url",  # the list's URLs have no scheme (13,290 of them pass so)
    }
    for url, reason in quirks.items():
        assert decide(ours, url) == datatrove_decide(datatrove, url) is True, url
        assert decide(suffixes, url) == reason, url
    # a host under a listed host that is no registered domain: www. in front of it
    host = "10000_gratis_sexfoto.jouwpagina.nl"
    assert decide(ours, f"http://{host}/") == "blocklisted_subdomain"
    assert decide(ours, f"http://www.{host}/") is True
    assert decide(suffixes, f"http://www.{host}/") == "blocklisted_domain"
    # host_suffixes drops every page datatrove drops, with the same word reasons
    for u in generated:
        theirs = datatrove_decide(datatrove, u)
        if theirs is not True:
            mine = decide(suffixes, u)
            assert mine is not True, u
            if theirs in ("banned_word", "soft_banned_words", "banned_subword"):
                assert mine == theirs or mine.startswith("blocklisted_"), u


#: Public Suffix List rules of every kind: wildcards (`*.ck`, `*.kawasaki.jp`), exceptions
#: (`!www.ck`, `!city.kawasaki.jp`), multi-label suffixes, a bare suffix, private ones (excluded)
PSL_HOSTS = [
    "foo.ck", "www.ck", "a.www.ck", "x.kawasaki.jp", "city.kawasaki.jp", "a.city.kawasaki.jp", "a.b.bd",
    "co.uk", "uk", "com", "a.co.uk", "www.example.co.uk", "x.y.sch.uk", "a_b.blogspot.com", "example.github.io",
    "b.a.compute.amazonaws.com", "1.2.3.4", "256.1.1.1", "localhost", "a.b.c.example.com", "xn--p1ai",
    "a.xn--p1ai", "пример.рф", "a-.-b.com", "_.com", "-.uk",
]  # fmt: skip


def test_host_split_is_tldextracts(generated, sample_urls):
    import importlib.metadata

    from tldextract import TLDExtract

    # HostSplit walks tldextract's rules as tldextract 5.4 does (`_PublicSuffixListTLDExtractor.
    # suffix_index`, `_extract_netloc`): after an upgrade, re-read them before changing this pin
    assert importlib.metadata.version("tldextract").startswith("5.4."), "re-check HostSplit against tldextract"

    split, extract = uf.HostSplit(), TLDExtract(suffix_list_urls=(), cache_dir=None)
    hosts = PSL_HOSTS + list(itertools.islice(blocklist_entries(TARBALL, "domains"), 0, None, 50))
    urls = generated + sample_urls + [u for h in hosts for u in (f"http://{h}/", f"https://u@{h}:80/x")]
    plain = 0
    for url in urls:
        m = uf._AUTHORITY.match(url)
        authority = m.group(1) if m else None
        parts = extract(url)
        assert split(url, authority)[:2] == (parts.top_domain_under_public_suffix, parts.fqdn), url
        plain += authority is not None and uf._PLAIN_AUTHORITY.fullmatch(authority) is not None
    assert plain > 0.8 * len(urls)  # most took the walk here, not tldextract


def test_rules_one_by_one(ours):
    assert decide(ours, "http://example.com/porn") == "banned_word"
    assert decide(ours, "http://example.com/PORN") is True  # words keep their case, the list is lowercase
    assert decide(ours, "http://example.com/pornography") is True  # a word, not a substring
    assert decide(ours, "http://example.com/sexy/babes") == "soft_banned_words"
    assert decide(ours, "http://example.com/sexy/sexy") is True  # distinct words are counted
    assert decide(ours, "http://example.com/2-Girls-1-Cup.html") == "banned_subword"
    assert decide(ours, "http://pornhub.com/") == "blocklisted_domain"
    assert decide(ours, "http://www.pornhub.com:8080/") == "blocklisted_domain"
    assert decide(ours, "http://example.com/") is True
    assert decide(ours, "") == "missing_url"
    assert decide(ours, None) == "missing_url"
    soft3 = UrlFilter(cache_dir=ours.config.cache_dir, soft_banned_threshold=3)
    assert decide(soft3, "http://example.com/sexy/babes") is True
    words_only = UrlFilter(blocklist=False, cache_dir=ours.config.cache_dir)
    assert decide(ours, "http://0-800-email.com/") == "blocklisted_domain"
    assert decide(words_only, "http://0-800-email.com/") is True and words_only.block_domains is None
    nothing = UrlFilter(blocklist=False, banned_words=False, cache_dir=ours.config.cache_dir)
    assert decide(nothing, "http://pornhub.com/porn") is True


# --- user lists ------------------------------------------------------------------------------------


def test_user_deny_lists_by_category(tmp_path):
    gambling = tmp_path / "gambling.txt"
    gambling.write_text("# casinos\n\ncasino.example\n*.bet.example\nBÜCHER.example\n")
    urls = tmp_path / "urls.txt"
    urls.write_text("https://news.example/politics/a?id=1\n")
    step = UrlFilter(
        blocklist=False,
        banned_words=False,
        cache_dir=str(tmp_path / "cache"),
        deny=[
            {"category": "gambling", "domains_file": str(gambling)},
            {"category": "spam", "domains": ["spam.example", "deep.casino.example"], "urls": ["shop.example/x"]},
            {"urls_file": str(urls)},
        ],
    )
    assert decide(step, "http://casino.example/") == "user_denied_domain:gambling"
    assert decide(step, "https://www.CASINO.example.:443/x") == "user_denied_domain:gambling"
    assert decide(step, "http://a.b.bet.example/") == "user_denied_domain:gambling"
    assert decide(step, "http://xn--bcher-kva.example/") == "user_denied_domain:gambling"  # IDN = its punycode
    assert decide(step, "http://notcasino.example/") is True  # labels, not substrings
    assert decide(step, "http://deep.casino.example/") == "user_denied_domain:spam"  # the longest entry
    assert decide(step, "http://x.spam.example/") == "user_denied_domain:spam"
    assert decide(step, "https://user@shop.example:8443/x") == "user_denied_url:spam"
    assert decide(step, "https://shop.example/x?y") is True  # a URL entry is that URL
    assert decide(step, "http://NEWS.example/politics/a?id=1") == "user_denied_url"
    assert decide(step, "http://news.example/politics/a?id=2") is True
    assert set(UrlFilter.drop_reasons) >= {"user_denied_domain[:<category>]", "user_denied_url[:<category>]"}


def test_allow_wins_over_deny_blocklist_and_words(cache_dir, tmp_path):
    allow = tmp_path / "allow.txt"
    allow.write_text("pornhub.com\n")
    step = UrlFilter(
        cache_dir=str(cache_dir),
        allow=[
            {"category": "reviewed", "domains_file": str(allow)},
            {"domains": ["sussex.example"], "urls": ["https://blog.example/sexy/babes"]},
        ],
        deny=[{"category": "mine", "domains": ["sussex.example", "blog.example"]}],
    )
    assert decide(step, "http://www.pornhub.com/porn") is True  # blocklist and a banned word
    assert decide(step, "http://sussex.example/") is True  # on both lists: allow wins
    assert decide(step, "http://blog.example/sexy/babes") is True  # an allowed URL in a denied domain
    assert decide(step, "http://blog.example/other") == "user_denied_domain:mine"
    assert decide(step, "http://example.com/porn") == "banned_word"  # not allowed: the rules apply
    assert step.stats["allowed_domain:reviewed"].total == 1
    assert step.stats["allowed_over_blocklisted_domain"].total == 1
    assert step.stats["allowed_domain"].total == 1
    assert step.stats["allowed_over_user_denied_domain:mine"].total == 2
    assert step.stats["allowed_url"].total == 1


def test_url_key_and_host_normalisation():
    assert url_key("HTTPS://User:pw@Example.COM.:8080") == "example.com/"
    assert url_key("example.com?q=1") == "example.com/?q=1"
    assert url_key("//bücher.de/A#b") == "xn--bcher-kva.de/A#b"
    assert url_key("http://[2001:DB8::1]:80/x") == "[2001:db8::1]/x"
    assert normalize_host("Ex\u3002Ample\uff0ecom.") == "ex.ample.com"
    assert normalize_host("xn--BCHER-KVA.de") == "xn--bcher-kva.de"


# --- configuration --------------------------------------------------------------------------------


def _cfg(tmp_path: Path, **params) -> dict:
    return {
        "run_dir": str(tmp_path / "run"),
        "input": {"paths": ["unused.warc.wet.gz"]},
        "steps": [{"url_filter": {"blocklist": False, "cache_dir": str(tmp_path / "cache"), **params}}],
    }


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"steps\[0\]\.url_filter\.deny\[0\]\.category: "):
        from_dict(_cfg(tmp_path, deny=[{"category": "bad category", "domains": ["a.example"]}]))
    with pytest.raises(ConfigError, match=r"steps\[0\]\.url_filter\.deny\[0\]: .*an empty list"):
        from_dict(_cfg(tmp_path, deny=[{"category": "x"}]))
    with pytest.raises(ConfigError, match=r"steps\[0\]\.url_filter\.allow\[0\]\.domains\[1\]: .*a URL belongs"):
        from_dict(_cfg(tmp_path, allow=[{"domains": ["a.example", "http://b.example/x"]}]))
    with pytest.raises(ConfigError, match=r"soft_banned_threshold"):
        from_dict(_cfg(tmp_path, soft_banned_threshold=0))
    with pytest.raises(ConfigError, match=r"blocklist_match"):
        from_dict(_cfg(tmp_path, blocklist_match="fuzzy"))


def test_a_missing_list_file_is_one_line_naming_it(tmp_path, wet_files):
    missing = tmp_path / "nowhere" / "deny.txt"
    with pytest.raises(ConfigError) as e:
        UrlFilter(
            blocklist=False,
            cache_dir=str(tmp_path),
            deny=[{"category": "x", "domains": ["a.example"]}, {"domains_file": str(missing)}],
        )
    assert str(e.value) == f"url_filter.deny[1].domains_file: {missing}: no such file"
    # through the CLI: exit 2, one line
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        json.dumps({**_cfg(tmp_path, allow=[{"urls_file": str(missing)}]), "input": {"paths": [str(wet_files[1])]}})
    )
    r = pipeline("plan", str(cfg))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == f"error: steps[0].url_filter.allow[0].urls_file: {missing}: no such file"


def test_a_bad_line_in_a_domains_file_names_file_and_line(tmp_path):
    f = tmp_path / "deny.txt"
    f.write_text("a.example\n# fine\nhttp://b.example/x\n")
    with pytest.raises(ConfigError, match=rf"url_filter\.deny\[0\]\.domains_file: {re.escape(str(f))}, line 3: "):
        UrlFilter(blocklist=False, cache_dir=str(tmp_path / "c"), deny=[{"domains_file": str(f)}])
    f.write_bytes(b"a.example\n\xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        UrlFilter(blocklist=False, cache_dir=str(tmp_path / "c"), deny=[{"domains_file": str(f)}])


# --- lookup files ----------------------------------------------------------------------------------


@pytest.fixture
def log_lines():
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    yield lines
    logger.remove(sink)


def _user_step(tmp_path: Path, entries: list[str]) -> UrlFilter:
    tmp_path.mkdir(exist_ok=True)
    f = tmp_path / "deny.txt"
    f.write_text("".join(e + "\n" for e in entries))
    return UrlFilter(
        blocklist=False, banned_words=False, cache_dir=str(tmp_path / "cache"), deny=[{"domains_file": str(f)}]
    )


@pytest.mark.parametrize("damage", ["flipped", "truncated", "stale", "header"])
def test_a_damaged_lookup_file_is_rebuilt_at_planning(tmp_path, damage, log_lines):
    entries = [f"host{i}.example" for i in range(1000)]
    first = _user_step(tmp_path, entries)
    path = Path(first.user[0].hashes.planned.path)
    good = path.read_bytes()
    if damage == "flipped":
        path.write_bytes(good[:500] + bytes([good[500] ^ 1]) + good[501:])
    elif damage == "truncated":
        path.write_bytes(good[: len(good) - 12])
    elif damage == "header":
        path.write_bytes(good[:60])
    else:  # a file built from other lists, under this name
        other = _user_step(tmp_path / "other", ["else.example"])
        path.write_bytes(Path(other.user[0].hashes.planned.path).read_bytes())
    second = _user_step(tmp_path, entries)
    assert path.read_bytes() == good
    assert second.user[0].hashes.planned == first.user[0].hashes.planned
    words = {"flipped": "corrupted", "truncated": "truncated", "header": "truncated", "stale": "stale"}[damage]
    assert len(log_lines) == 1 and re.search(rf"{re.escape(str(path))}: {words}.*; rebuilding it", log_lines[0])
    assert decide(second, "http://host999.example/") == "user_denied_domain"


def test_the_blocklist_file_truncated_is_rebuilt(cache_dir, tmp_path):
    good = UrlFilter(cache_dir=str(cache_dir)).block_domains.planned
    copy = tmp_path / "cache"
    copy.mkdir()
    for f in cache_dir.glob("blocklist-*.hashes"):
        (copy / f.name).write_bytes(f.read_bytes())
    damaged = copy / Path(good.path).name
    with open(damaged, "r+b") as f:
        f.truncate(HEADER_BYTES + 8 * 1000)
    rebuilt = UrlFilter(cache_dir=str(copy)).block_domains.planned
    assert (rebuilt.count, rebuilt.sha256) == (good.count, good.sha256)
    assert hashlib.sha256(damaged.read_bytes()[HEADER_BYTES:]).hexdigest() == good.sha256


def test_a_task_refuses_a_lookup_file_changed_since_planning(tmp_path):
    step = _user_step(tmp_path, ["a.example", "b.example"])
    path = Path(step.user[0].hashes.planned.path)
    planned = path.read_bytes()
    path.write_bytes(planned[:-8] + bytes(8))  # damaged after planning
    import pickle

    task = pickle.loads(pickle.dumps(step))  # as an executor ships it
    with pytest.raises(LookupFileError) as e:
        task._open()
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "corrupted" in msg and "re-run" in msg
    path.unlink()
    with pytest.raises(LookupFileError, match="is missing since the run was planned"):
        pickle.loads(pickle.dumps(step))._open()
    path.write_bytes(planned)
    task = pickle.loads(pickle.dumps(step))
    assert decide(task, "http://b.example/") == "user_denied_domain"


# --- in a run, and its memory ---------------------------------------------------------------------


def test_a_run_counts_drops_by_rule(tmp_path, wet_files, cache_dir, sample_urls):
    from gristmill.pipeline.report.journey import funnel
    from gristmill.pipeline.report.page import build as build_report
    from gristmill.pipeline.runner import run

    cfg = {
        "run_dir": str(tmp_path / "run"),
        "executor": {"type": "local", "tasks": 2, "workers": 1},
        "input": {"paths": [str(p) for p in wet_files]},
        "steps": [{"url_filter": {"cache_dir": str(cache_dir), "deny": [{"category": "news", "domains": ["go.com"]}]}}],
        "output": {"dropped_sample": 1.0},
    }
    merged = run(from_dict(cfg))
    row = next(r for r in funnel(merged) if r.step == "00_url_filter")
    assert row.docs_in == 609
    news = sum(1 for u in sample_urls if re.match(r"http://([^/]+\.)?go\.com/", u))
    assert news == 32
    assert row.drops == {"blocklisted_domain": 24, "banned_word": 1, "user_denied_domain:news": news}
    # the report's drops by reason name the rules
    html = build_report(tmp_path / "run")
    for reason in row.drops:
        assert f'<td class="l">{reason}</td>' in html, reason
    assert "url_filter" in registered_steps()


def test_memory_of_a_task_is_the_estimate_and_small(cache_dir, ours):
    """A child process holding the filter, its domain hashes all touched (100,000 URLs of random
    hosts), peaks below the planner's estimate (BASE_TASK_BYTES + memory_bytes), which is below
    the stated bound; datatrove's URLFilter peaks at ~850 MB."""
    estimate = ours.memory_bytes(Workload(documents=1e6, text_bytes=1e9, tasks=1))
    assert estimate <= TASK_BOUND
    # VmHWM is the peak of this process's own memory map: ru_maxrss would carry over the parent's
    # across fork and exec (pytest, holding datatrove's lists, is large)
    script = textwrap.dedent(
        f"""
        import random, re
        from datatrove.data import Document
        from gristmill.filters.url_filter import UrlFilter
        def peak():
            return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        base = peak()
        f = UrlFilter(cache_dir={str(cache_dir)!r})
        f._open()
        rng = random.Random(0)
        for i in range(100_000):
            host = "".join(rng.choice("abcdefghij") for _ in range(12))
            f.filter(Document(text="", id=str(i), metadata={{"url": f"http://www.{{host}}.com/a/b"}}), f.config)
        print(base, peak(), len(f._hosts))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True).stdout
    base, peak, cached = map(int, out.split())
    assert cached == 100_000 % uf.HOST_CACHE  # the cache was cleared when full
    print(
        f"url_filter task: {base / 2**20:.0f} MB imported, {peak / 2**20:.0f} MB peak, estimate "
        f"{(BASE_TASK_BYTES + estimate) / 2**20:.0f} MB"
    )
    assert peak - base <= estimate
    assert peak <= BASE_TASK_BYTES + estimate


def _browser_forms(host: str) -> list[str]:
    """URLs a browser reads as `http://{host}/`, which a lenient split reads otherwise."""
    first = f"%{ord(host[0]):02X}{host[1:]}"
    return [
        f"http://{first}/",  # a percent-encoded host
        f"http://{host}\\@elsewhere.example/",  # a backslash before the userinfo's @
        f"http:/{host}/",  # one slash
        f"http:{host}/",  # none
        f"http:\\\\{host}/",  # backslashes
        f"https:///{host}/x",  # three slashes
        f" http://{host}/",  # leading space
        f"http://{host[:1]}\t{host[1:]}/",  # a tab inside (removed)
        f"http://u:p@{host}:8080/",  # userinfo and port
        f"http://{host}%2E/",  # an encoded trailing dot
        f"http://{host}./",  # a trailing dot
    ]


def test_browser_forms_of_a_listed_host_are_decided_as_the_host(ours, suffixes, listed):
    """For ~230 real blocklisted domains and hosts, every form a browser reads as the same host
    (percent-encoding, `\\` before userinfo, one or no slash, ...) gets the plain URL's decision
    in both matches: 100% of them passed before. IPv4 hosts in their other forms (hex, octal,
    one number) as the dotted form: dropped by `host_suffixes`, kept by `datatrove` (its quirk)."""
    hosts = listed["domains"] + listed["hosts"][:20]
    assert len(hosts) > 200
    for step in (ours, suffixes):
        for host in hosts:
            plain = decide(step, f"http://{host}/")
            assert plain in ("blocklisted_domain", "blocklisted_subdomain"), (host, plain)
            for url in _browser_forms(host):
                assert decide(step, url) == plain, (step.config.blocklist_match, url)
    for ip in listed["ips"][:10]:
        a, b, c, d = map(int, ip.split("."))
        forms = [
            f"http://0x{a:x}.{b}.{c}.{d}/",
            f"http://0{a:o}.{b}.{c}.{d}/",
            f"http://{a << 24 | b << 16 | c << 8 | d}/",
        ]
        forms.append(f"http://{a}.{b}.{c << 8 | d}/")
        assert decide(suffixes, f"http://{ip}/") == "blocklisted_domain"
        for url in forms:
            assert decide(suffixes, url) == "blocklisted_domain", url
            assert decide(ours, url) is True, url  # datatrove's: an IP host has no registered domain
    # the quirks datatrove mode keeps are kept: case, and no lookup between host and domain
    assert decide(ours, "http://WWW.0-800-EMAIL.COM/") is True


def test_an_allow_list_is_not_fooled_by_a_backslash(cache_dir):
    """`http://bad.com\\@good.com/` goes to bad.com: an allow list of good.com does not keep it,
    the blocklist drops it, in both matches; good.com's own pages stay allowed."""
    listed_host = "0-800-email.com"
    for match in ("datatrove", "host_suffixes"):
        step = UrlFilter(cache_dir=str(cache_dir), blocklist_match=match, allow=[{"domains": ["good.com"]}])
        for url in (
            f"http://{listed_host}\\@good.com/",
            f"http://{listed_host}\\@www.good.com/x",
            f"http:/{listed_host}\\@good.com",
            f"http://%{ord(listed_host[0]):02x}{listed_host[1:]}\\@good.com/",
        ):
            assert decide(step, url) == "blocklisted_domain", (match, url)
        assert decide(step, f"http://{listed_host}@good.com/") is True  # userinfo: good.com's page
        assert decide(step, "http://www.good.com/porn") is True  # allowed over a banned word
        assert step.stats["allowed_domain"].total == 2
    # a URL allow list: the same reading (`url_key`)
    step = UrlFilter(cache_dir=str(cache_dir), allow=[{"urls": ["good.com/@x"]}])
    assert url_key(f"http://{listed_host}\\@good.com/@x") == f"{listed_host}/@good.com/@x"
    assert decide(step, f"http://{listed_host}\\@good.com/@x") == "blocklisted_domain"
    assert decide(step, "http://good.com/@x") is True and step.stats["allowed_url"].total == 1


def test_hosts_are_parsed_as_the_url_standard_parses_them():
    from gristmill.filters.url_host import browser_host, parse

    cases = {
        "http://%62ad.com/": "bad.com",
        "http://bad.com\\@x/": "bad.com",
        "http:/bad.com/": "bad.com",
        "HTTP:\\\\BAD.com.:80": "bad.com",
        "http://b\u00fccher.de/": "xn--bcher-kva.de",
        "http://\uff42\uff41\uff44.com/": "bad.com",  # fullwidth letters map to ASCII
        "http://0x7f.1/": "127.0.0.1",
        "http://2130706433/": "127.0.0.1",
        "http://0177.0.0.1/": "127.0.0.1",
        "http://[2001:DB8:0::1]/": "[2001:db8::1]",
        "http://@bad.com/": "bad.com",
        "android-app://com.Example/x": "com.Example",  # an opaque host: as written
    }
    for url, host in cases.items():
        assert browser_host(url) == host, url
    # what no browser opens: no host
    for url in ("http://256.1.1.1/", "http://x@/", "http://bad.com:99999/", "http://a%00b.com/", "mailto:a@bad.com"):
        assert browser_host(url) is None, url
    assert browser_host("noscheme.com/x") is None
    assert parse("http://a.com\\p\\q?x\\y#z\\").rest == "/p/q?x\\y#z\\"  # the path's backslashes only
    assert parse("file:///etc/x").host == "" and parse("file://srv/x").host == "srv"
