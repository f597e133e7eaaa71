"""Reader + language ID + Gopher/C4 filters, gristmill against datatrove, one core, same input.

    python benchmarks/filter_throughput.py [--wet FILE ...] [--repeat 3] [--smoke]

Both pipelines run in this one process, one after the other, on the same WET files and the
same lid.176.ftz model, with the same thresholds (languages=[en], min score 0.65, datatrove's
default Gopher/C4 parameters). datatrove runs as its users run it: WarcReader (libmagic on
every record), LanguageFilter, GopherQualityFilter and GopherRepetitionFilter with its English
word tokenizer (spaCy), C4QualityFilter. Needs the bench extra (`make bench` installs it).
Prints MB/s (compressed WET) and documents/s per core for each, and the ratio. Without the
bench extra, datatrove's side is skipped with a line saying so.

Then FineWeb's steps one by one, on the same documents for both sides: the English pages
(langid `en` at score >= 0.65), as read and as they leave FineWeb's Gopher and C4 filters
(gopher_repetition, gopher_quality, c4_lines without its terminal-punctuation rule).
`fineweb_quality` against datatrove's FineWebQualityFilter (its English words: spaCy), `pii`
against its PIIFormatter, each step's `run` over the documents as a pipeline runs it: CPU
microseconds per document and the ratio. Last, `pii` on adversarial documents of 1 MB
(matching must stay linear), datatrove's PIIFormatter on 10 KB versions (quadratic on some).

`--config CONFIG [CONFIG ...]`: instead, the curate stage of each run config as `pipeline run`
fuses it (the streamable steps from the reader to the first step that ends a stage: url_filter,
langid, the heuristics, kenlm, quality) on the same WET files, one after the other in this
process, CPU time per config and each config's ratio to the first: how a change to a shipped
config moves the cost of its curation pass (`--config before.yaml configs/crawl.yaml`). Model
paths in a config are relative to the repository root, as `pipeline run` from there reads them.

`--smoke`: the smaller sample file (43 records), one run each, adversarial documents of 100 KB
and 2 KB (seconds; checks that the benchmark still runs, its figures mean nothing).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from collections import deque
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
LID = REPO / "models" / "lid.176.ftz"


def run_steps(steps) -> dict:
    data = None
    for step in steps:
        data = step(data, 0, 1)
    n = 0
    kept = deque(maxlen=1)
    for doc in data:
        n += 1
        kept.append(doc)
    return {"kept": n}


def gristmill_pipeline(files: list[Path]):
    from gristmill.filters.c4_lines import C4Lines
    from gristmill.filters.gopher_quality import GopherQuality
    from gristmill.filters.gopher_repetition import GopherRepetition
    from gristmill.filters.langid import LangId
    from gristmill.input.wet import WetReader

    reader = WetReader([str(f) for f in files])
    return [
        reader,
        LangId(model=str(LID), languages=["en"], min_score=0.65),
        GopherQuality(),
        GopherRepetition(),
        C4Lines(),
    ], reader


def config_pipeline(files: list[Path], config: Path):
    """Our reader of `files`, then the curate stage of a run config: its steps up to the first that
    is not streamable (dedup's phases, tokenize), built as `pipeline run` builds them."""
    from gristmill.config import load
    from gristmill.core.step import registered_steps
    from gristmill.input.sources import fetcher_for
    from gristmill.input.wet import WetReader
    from gristmill.pipeline.planning.planner import PlanContext

    cfg = load(config)
    ctx, registry, steps = PlanContext(cfg, fetcher_for(cfg.input.commoncrawl)), registered_steps(), []
    for spec in cfg.specs:
        step_class = registry[spec.name]
        if not step_class.streamable:
            break
        steps.append(step_class.build(spec.params, ctx, step_id=spec.step_id))
    reader = WetReader([str(f) for f in files])
    return [reader, *steps], reader


def compare_configs(files: list[Path], configs: list[Path], repeat: int, mb: float) -> None:
    os.chdir(REPO)  # the configs' model paths are the repository's, as `pipeline run` reads them
    runs = [measure(str(c), partial(config_pipeline, config=c), files, repeat) for c in configs]
    print(f"input: {len(files)} WET files, {mb:.2f} MB compressed; the curate stage of each config, one process,")
    print("CPU time per config (best of runs) and its ratio to the first config's")
    header = ("config", "docs read", "kept", "cpu s", "MB/s/core", "docs/s/core", "vs first")
    print(f"{header[0]:<40} " + " ".join(f"{h:>11}" for h in header[1:]))
    for r in runs:
        docs_s = f"{r['read'] / r['cpu_s']:.0f}" if r["read"] else "-"
        cells = (r["read"], r["kept"], f"{r['cpu_s']:.2f}", f"{mb / r['cpu_s']:.2f}", docs_s)
        ratio = r["cpu_s"] / runs[0]["cpu_s"]
        print(f"{r['name']:<40} " + " ".join(f"{c:>11}" for c in cells) + f" {ratio:>10.2f}x")


def datatrove_pipeline(files: list[Path], paths_file: Path):
    import datatrove.utils.lid as dt_lid
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
        LanguageFilter,
    )
    from datatrove.pipeline.readers import WarcReader

    # LanguageFilter has no model-path argument and would download lid.176.bin from the web;
    # point it at the same .ftz file we use so both sides run the same model.
    dt_lid.cached_asset_path_or_download = lambda *a, **k: str(LID)
    # datatrove insists on the `fasttext-numpy2-wheel` distribution; the installed fastText
    # module (fasttext-community) has the same API, so accept it.
    dt_lid.check_required_dependencies = lambda *a, **k: None
    LanguageFilter._requires_dependencies = ["fasteners"]
    # the reader takes a folder: a paths file names exactly the files given to ours
    paths_file.write_text("".join(f"{f.name}\n" for f in files))
    reader = WarcReader(str(files[0].parent), paths_file=str(paths_file))
    return [
        reader,
        LanguageFilter(languages=["en"], language_threshold=0.65),
        GopherQualityFilter(),
        GopherRepetitionFilter(),
        C4QualityFilter(),
    ], reader


def measure(name: str, build, files: list[Path], repeat: int) -> dict:
    best = None
    for _ in range(repeat):
        steps, reader = build(files)
        gc.collect()
        t0 = time.process_time()
        w0 = time.perf_counter()
        out = run_steps(steps)
        cpu = time.process_time() - t0
        wall = time.perf_counter() - w0
        docs = reader.stats["documents"].total if "documents" in reader.stats.stats else None
        res = {"name": name, "cpu_s": cpu, "wall_s": wall, "kept": out["kept"], "read": docs}
        if best is None or cpu < best["cpu_s"]:
            best = res
    return best


# --- FineWeb's steps, one by one ------------------------------------------------------------------


def copies(docs):
    from datatrove.data import Document

    return [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in docs]


def english_pages(files: list[Path]) -> dict[str, list]:
    """The English pages as read, and as FineWeb's Gopher and C4 filters leave them."""
    from gristmill.filters.c4_lines import C4Lines
    from gristmill.filters.gopher_quality import GopherQuality
    from gristmill.filters.gopher_repetition import GopherRepetition
    from gristmill.filters.langid import LangId
    from gristmill.input.wet import WetReader

    lid = LangId(model=str(LID), languages=["en"], min_score=0.65)
    read = list(lid.run(WetReader([str(f) for f in files]).run()))
    steps = [GopherRepetition(), GopherQuality(), C4Lines(filter_no_terminal_punct=False)]
    after = [d for d in copies(read) if all(step.filter_batch([d])[0] is True for step in steps)]
    return {"read": read, "after gopher/c4": after}


def us_per_doc(make_step, docs, repeat: int) -> float:
    """CPU microseconds per document of a fresh step's `run` over copies of `docs`, best of runs."""
    best = float("inf")
    for _ in range(repeat):
        step, batch = make_step(), copies(docs)
        gc.collect()
        t0 = time.process_time()
        deque(step.run(iter(batch)), maxlen=0)
        best = min(best, time.process_time() - t0)
    return best / max(len(docs), 1) * 1e6


def datatrove_fineweb_quality():
    from datatrove.pipeline.filters import FineWebQualityFilter
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    load_word_tokenizer("en").word_tokenize("Loaded before the clock starts.")  # spaCy, once per process
    return FineWebQualityFilter


def compare_steps(files: list[Path], repeat: int) -> None:
    from datatrove.pipeline.formatters import PIIFormatter

    from gristmill.filters.fineweb_quality import FineWebQuality
    from gristmill.filters.pii import PII

    pages = english_pages(files)
    try:
        theirs_fineweb = datatrove_fineweb_quality()
    except ImportError as e:  # spaCy: the bench extra
        theirs_fineweb = None
        print(f"datatrove's FineWebQualityFilter skipped: {e} (pip install -e '.[bench]')")
    print("\nFineWeb's steps, same documents (English pages); CPU us per document, best of runs")
    print(f"{'step':<16} {'documents':<22} {'gristmill':>10} {'datatrove':>10} {'ratio':>7}")
    ratios: dict[str, list[tuple[float, float]]] = {"fineweb_quality": [], "pii": []}
    for name, docs in pages.items():
        for step, ours, theirs in (
            ("fineweb_quality", FineWebQuality, theirs_fineweb),
            ("pii", PII, PIIFormatter),
        ):
            a = us_per_doc(ours, docs, repeat)
            b = us_per_doc(theirs, docs, repeat) if theirs else None
            label = f"{name} ({len(docs)})"
            if b is None:
                print(f"{step:<16} {label:<22} {a:>10.1f} {'-':>10} {'-':>7}")
                continue
            ratios[step].append((a * len(docs), b * len(docs)))
            print(f"{step:<16} {label:<22} {a:>10.1f} {b:>10.1f} {b / a:>6.1f}x")
    for step, pairs in ratios.items():
        if pairs:  # over both document sets: total CPU time of datatrove's side over ours
            ratio = sum(b for _, b in pairs) / sum(a for a, _ in pairs)
            print(f"ratio {step} gristmill/datatrove (per core): {ratio:.1f}x")


def adversarial(n: int) -> dict[str, str]:
    """Documents of n characters that make a backtracking matcher work hard."""
    return {
        "a-a-a-...@": ("a-" * n)[: n - 1] + "@",
        "x@a-a-a-...": "x@" + ("a-" * n)[: n - 2],
        "a@a@a@...": "a@" * (n // 2),
        "x@a.a.a....": "x@" + ("a." * n)[: n - 2],
        "......@": "." * (n - 1) + "@",
        "1.1.1.1.1...": "1." * (n // 2),
        "x@[1.1.1.x@[1.1.1...": "x@[1.1.1." * (n // 9),
        "8.8.8.8 8.8.8.8 ...": "8.8.8.8 " * (n // 8),
        "a.b@a.b@...": "a.b@" * (n // 4),
    }


def adversarial_pii(size: int, peer_size: int) -> None:
    from datatrove.pipeline.formatters import PIIFormatter

    from gristmill.filters.pii import PII, replace_pii

    config, theirs = PII.Config(), PIIFormatter()

    def cpu_ms(fn, text) -> float:
        t0 = time.process_time()
        fn(text)
        return (time.process_time() - t0) * 1e3

    sizes = f"ours at {size // 10:,} and {size:,} characters, datatrove at {peer_size:,}"
    print(f"\npii on adversarial documents: CPU ms; {sizes}")
    print(f"{'document':<22} {'ours small':>10} {'ours large':>10} {'growth':>7} {'datatrove':>10}")
    worst = 0.0
    for name, small in adversarial(size // 10).items():
        large = adversarial(size)[name]
        a = cpu_ms(lambda t: replace_pii(t, "id", config), small)
        b = cpu_ms(lambda t: replace_pii(t, "id", config), large)
        c = cpu_ms(theirs.format, adversarial(peer_size)[name])
        worst = max(worst, b)
        print(f"{name:<22} {a:>10.2f} {b:>10.2f} {b / max(a, 1e-3):>6.1f}x {c:>10.2f}")
    print(f"pii worst case on {size:,} characters: {worst:.0f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wet", nargs="*", type=Path, help="WET files (default: the shared samples)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the smaller sample file, one run each: checks that it runs")
    ap.add_argument("--config", nargs="+", type=Path, help="time the curate stage of these run configs instead")
    args = ap.parse_args()
    files = args.wet or sorted((DATA / "cc" / "wet").glob("*.warc.wet.gz"))
    if args.smoke:
        files, args.repeat = files if args.wet else sorted(files, key=lambda f: f.stat().st_size)[:1], 1
    if not files or not LID.is_file():
        print(f"need WET files ({DATA}/cc/wet) and {LID} (make models)", file=sys.stderr)
        return 2
    if len({f.parent for f in files}) != 1:
        print("all --wet files must be in one folder (datatrove's reader takes a folder)", file=sys.stderr)
        return 2
    mb = sum(f.stat().st_size for f in files) / 1e6
    from loguru import logger

    logger.remove()  # datatrove's per-file INFO lines would interleave with the table
    if args.config:
        compare_configs([f.resolve() for f in files], [c.resolve() for c in args.config], args.repeat, mb)
        return 0
    ours = measure("gristmill", gristmill_pipeline, files, args.repeat)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            build = partial(datatrove_pipeline, paths_file=Path(tmp) / "paths.txt")
            theirs = measure("datatrove", build, files, max(1, args.repeat // 2))
    except ImportError as e:  # WarcReader's warcio/libmagic, spaCy: the bench extra
        theirs = None
        print(f"datatrove's side skipped: {e} (pip install -e '.[bench]')")
    print(f"input: {len(files)} WET files, {mb:.2f} MB compressed; one process, CPU time per pipeline (best of runs)")
    print(f"{'pipeline':<10} {'docs read':>9} {'kept':>6} {'cpu s':>8} {'MB/s/core':>10} {'docs/s/core':>12}")
    for r in (ours, theirs) if theirs else (ours,):
        read = r["read"] if r["read"] is not None else "-"
        docs_s = f"{r['read'] / r['cpu_s']:.0f}" if r["read"] else "-"
        print(f"{r['name']:<10} {read:>9} {r['kept']:>6} {r['cpu_s']:>8.2f} {mb / r['cpu_s']:>10.2f} {docs_s:>12}")
    if theirs is not None:
        if ours["read"] and theirs["read"] is not None and theirs["read"] < ours["read"]:
            print(
                f"datatrove's WarcReader dropped {ours['read'] - theirs['read']} records without counting them"
                " (libmagic labelled them code/CSV)"
            )
        print(f"ratio gristmill/datatrove (MB/s per core): {theirs['cpu_s'] / ours['cpu_s']:.1f}x")
    compare_steps(files, args.repeat)
    adversarial_pii(100_000 if args.smoke else 1_000_000, 2_000 if args.smoke else 10_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
