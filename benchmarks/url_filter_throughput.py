"""URL filter, gristmill's `url_filter` against datatrove's `URLFilter`, one core, the same URLs.

    python benchmarks/url_filter_throughput.py [--urls 200000] [--repeat 3] [--smoke]

Both filters run with datatrove's integrated lists (4.56M domains, 19,587 URLs, banned words,
soft-banned words, subwords) and the same host split (tldextract's bundled Public Suffix List
snapshot: `TLDExtract(suffix_list_urls=())` on both sides). Each side runs in its own child
process, so that its peak RSS (VmHWM, the process's own) is its own: it loads its lists (the
setup a task pays: datatrove reads its lists into Python sets; ours maps the lookup files built
once at planning, timed here too), then calls `filter` on every URL `--repeat` times. Prints
setup seconds, CPU microseconds per URL (best pass), peak RSS and the filter's share of it, the
drops by reason, whether the decisions are identical URL for URL, and the ratios; then the same
per URL on the sample's URLs alone (best of 20 passes), whose hosts repeat as a crawl's do.

The URLs: the shared WET sample's 609, then generated ones, each with a host of its own (our
host cache never hits: the worst case for us; Common Crawl files repeat hosts), of words drawn
from the sample's text (so banned and soft-banned words occur as often as in English web text),
2% of them hosts of the blocklist, with `www.` and other subdomains, ports, query strings.
Deterministic.

Needs `fasteners` for datatrove's side (the bench extra: `pip install -e '.[bench]'`); without
it that side is skipped with a line saying so.

`--smoke`: 2,000 URLs (the listed hosts among them drawn from the blocklist's first 300,000
domains, not all 4.5 million), one pass each, our lookup files from the default cache folder
(built there once per machine) instead of a fresh one (checks that the benchmark still runs, its
figures mean nothing; most of its time is datatrove reading its lists).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from itertools import islice
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
#: the shared WET sample's conversion records, whose URLs lead the input
SAMPLE_URLS = 609
SAMPLE_PASSES = 20
TLDS = ["com"] * 10 + [
    "org",
    "net",
    "de",
    "co.uk",
    "fr",
    "ru",
    "jp",
    "com.br",
    "it",
    "nl",
    "pl",
    "info",
    "blogspot.com",
]


def peak_rss() -> int:
    """This process's peak resident set (VmHWM): ru_maxrss would carry over the parent's."""
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def make_urls(n: int, scan: int | None = None) -> list[str]:
    """The sample's URLs, then generated ones up to `n`, each with a host of its own; 2% of the
    hosts are drawn from every 997th domain of the blocklist's first `scan` (None: all of them)."""
    from gristmill.filters.url_filter import BLOCKLIST_TARBALL, DATATROVE_ASSETS, blocklist_entries
    from gristmill.input.wet import WetReader

    docs = list(WetReader([str(p) for p in sorted((DATA / "cc" / "wet").glob("*.warc.wet.gz"))]).run())
    urls = [d.metadata["url"] for d in docs]
    words = [
        w for w, _ in Counter(re.findall(r"[a-z]{3,12}", " ".join(d.text.lower() for d in docs))).most_common(5000)
    ]
    rng = random.Random(0)
    listed = [
        d
        for i, d in enumerate(
            islice(blocklist_entries(Path(str(DATATROVE_ASSETS / BLOCKLIST_TARBALL)), "domains"), scan)
        )
        if i % 997 == 0
    ]
    seen: set[str] = set()
    while len(urls) < n:
        if rng.random() < 0.02:
            host = rng.choice(listed)
        else:
            host = (
                "-".join(rng.choices(words, k=rng.choice((1, 1, 2))))
                + str(rng.randrange(1000))
                + "."
                + rng.choice(TLDS)
            )
        if host in seen:
            continue
        seen.add(host)
        sub = rng.random()
        host = ("www." if sub < 0.4 else rng.choice(words) + "." if sub < 0.5 else "") + host
        path = "/".join(rng.choices(words, k=rng.randrange(0, 5)))
        port = ":8080" if rng.random() < 0.01 else ""
        query = f"?id={rng.randrange(10**6)}&q={rng.choice(words)}" if rng.random() < 0.2 else ""
        urls.append(f"{rng.choice(('http', 'https'))}://{host}{port}/{path}{query}")
    return urls[:n]


def run_side(side: str, urls_file: Path, repeat: int, cache_dir: str) -> dict:
    """In the child: load the side's filter, filter every URL `repeat` times; the figures."""
    from datatrove.data import Document

    warnings.simplefilter("ignore", DeprecationWarning)  # datatrove reads tldextract's deprecated name
    urls = urls_file.read_text().split("\n")
    docs = [Document(text="", id=str(i), metadata={"url": u}) for i, u in enumerate(urls)]
    # the modules first: their import is every step's (BASE_TASK_BYTES), not the filter's
    if side == "gristmill":
        from gristmill.filters.url_filter import UrlFilter
    else:
        from datatrove.pipeline.filters.url_filter import URLFilter
        from tldextract import TLDExtract
    base = peak_rss()
    t0 = time.process_time()
    if side == "gristmill":
        step = UrlFilter(cache_dir=cache_dir)  # the lookup files, built by the parent, checked
        step._open()  # what a task does: maps them (checking their sha256), builds the automaton
        config = step.config

        def decide(d):
            r = step.filter(d, config)
            return True if r is True else r[1]

        def reset():
            step._hosts.clear()  # every pass starts cold
    else:
        step = URLFilter()
        step.tldextractor = TLDExtract(suffix_list_urls=())
        step.download_data()  # what every task does: the lists read into Python sets

        from gristmill.filters.url_filter import DATATROVE_REASONS

        def decide(d):
            r = step.filter(d)
            return True if r is True else DATATROVE_REASONS[r[1]]

        def reset():
            pass

    setup = time.process_time() - t0
    best, decisions = None, None
    for _ in range(repeat):
        reset()
        c0 = time.process_time()
        decisions = [decide(d) for d in docs]
        cpu = time.process_time() - c0
        best = cpu if best is None else min(best, cpu)
    # the sample's own URLs alone: Common Crawl's repetition of hosts (433 hosts in its 609
    # URLs), each pass from a cold cache
    sample, sample_best = docs[:SAMPLE_URLS], None
    for _ in range(SAMPLE_PASSES if repeat > 1 else 1):
        reset()
        c0 = time.process_time()
        for d in sample:
            decide(d)
        cpu = time.process_time() - c0
        sample_best = cpu if sample_best is None else min(sample_best, cpu)
    digest = hashlib.sha256("\n".join(map(str, decisions)).encode()).hexdigest()
    return {
        "sample_cpu_s": sample_best,
        "sample_urls": len(sample),
        "side": side,
        "urls": len(docs),
        "setup_s": setup,
        "cpu_s": best,
        "peak_rss": peak_rss(),
        "base_rss": base,
        "dropped": dict(Counter(d for d in decisions if d is not True)),
        "digest": digest,
        "decisions": [d if d is not True else 1 for d in decisions],
    }


def child(side: str, urls_file: Path, repeat: int, cache_dir: str) -> dict | str:
    """The side's figures from a child process, or the line it failed with."""
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--side",
            side,
            "--urls-file",
            str(urls_file),
            "--repeat",
            str(repeat),
            "--cache-dir",
            cache_dir,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--urls", type=int, default=200_000, help="URLs in all (the sample's 609 first)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="2,000 URLs, one pass: checks that it runs")
    ap.add_argument("--cache-dir", help="our lookup files (default: a temporary folder, built in this run)")
    ap.add_argument("--side", choices=("gristmill", "datatrove"), help=argparse.SUPPRESS)
    ap.add_argument("--urls-file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        print(json.dumps(run_side(args.side, args.urls_file, args.repeat, args.cache_dir)))
        return 0
    if args.smoke:
        args.urls, args.repeat = 2_000, 1
    from loguru import logger

    logger.remove()  # datatrove's extraction INFO lines would interleave with the table
    with tempfile.TemporaryDirectory() as tmp:
        # a smoke run draws its ~30 listed hosts from the first 300,000 of 4.5 million domains
        urls = make_urls(args.urls, 300_000 if args.smoke else None)
        urls_file = Path(tmp) / "urls.txt"
        urls_file.write_text("\n".join(urls))
        # a full run builds its lookup files on the clock; a smoke run reuses the user's (built once per
        # machine by whatever ran url_filter first), since its figures mean nothing
        from gristmill.filters.url_filter import UrlFilter

        cache_dir = args.cache_dir or (UrlFilter.Config().cache_dir if args.smoke else str(Path(tmp) / "cache"))

        t0 = time.process_time()
        UrlFilter(cache_dir=cache_dir)  # planning, here: builds the lookup files once
        plan_s = time.process_time() - t0
        ours = child("gristmill", urls_file, args.repeat, cache_dir)
        if isinstance(ours, str):
            print(f"gristmill's side failed: {ours}", file=sys.stderr)
            return 1
        try:
            import fasteners  # noqa: F401  (datatrove's URLFilter requires it)

            theirs = child("datatrove", urls_file, max(1, args.repeat), cache_dir)
        except ImportError as e:
            theirs = f"skipped: {e} (pip install -e '.[bench]')"
    hosts = len({re.sub(r"^[a-z]+://", "", u).split("/")[0] for u in urls})
    print(
        f"input: {len(urls):,} URLs ({hosts:,} distinct authorities); one process per side, "
        f"CPU time per URL (best of {args.repeat} passes), peak RSS of the process"
    )
    if isinstance(theirs, str):
        print(f"datatrove's side {theirs}" if theirs.startswith("skipped") else f"datatrove's side failed: {theirs}")
    rows = [ours] if isinstance(theirs, str) else [ours, theirs]
    print(
        f"{'filter':<10} {'setup CPU s':>12} {'us/URL':>8} {'URLs/s/core':>12} {'peak RSS MB':>12} {'filter MB':>10}"
        "  dropped by reason"
    )
    for r in rows:
        drops = ", ".join(f"{k} {v}" for k, v in sorted(r["dropped"].items()))
        print(
            f"{r['side']:<10} {r['setup_s']:>12.2f} {r['cpu_s'] / r['urls'] * 1e6:>8.2f} "
            f"{r['urls'] / r['cpu_s']:>12,.0f} {r['peak_rss'] / 2**20:>12.0f} "
            f"{(r['peak_rss'] - r['base_rss']) / 2**20:>10.0f}  {drops}"
        )
    print(
        "(filter MB: peak RSS less the process's before the filter was built, its modules imported and the URLs held)"
    )
    print(f"gristmill lookup files at planning: {plan_s:.1f} CPU s (built once per cache_dir, then checked by sha256)")
    if isinstance(theirs, str):
        return 0
    differ = [(u, a, b) for u, a, b in zip(urls, ours["decisions"], theirs["decisions"]) if a != b]
    if differ:
        print(f"decisions differ on {len(differ)} URLs, first: {differ[:5]}")
    else:
        print(f"decisions: identical on all {len(urls):,} URLs, reason for reason")
    print(f"ratio gristmill/datatrove (URLs/s per core): {theirs['cpu_s'] / ours['cpu_s']:.1f}x")
    per_url = [r["sample_cpu_s"] / r["sample_urls"] * 1e6 for r in (ours, theirs)]
    print(
        f"the WET sample's {ours['sample_urls']} URLs alone (its hosts repeat): gristmill {per_url[0]:.2f} us/URL, "
        f"datatrove {per_url[1]:.2f}: ratio {per_url[1] / per_url[0]:.1f}x"
    )
    mine, peer = (r["peak_rss"] - r["base_rss"] for r in (ours, theirs))
    print(f"ratio datatrove/gristmill (filter memory): {peer / mine:.1f}x")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
