"""Reader + language ID + Gopher/C4 filters, gristmill against datatrove, one core, same input.

    python benchmarks/filter_throughput.py [--wet FILE ...] [--repeat 3]

Both pipelines run in this one process, one after the other, on the same WET files and the
same lid.176.ftz model, with the same thresholds (languages=[en], min score 0.65, datatrove's
default Gopher/C4 parameters). datatrove runs as its users run it: WarcReader (libmagic on
every record), LanguageFilter, GopherQualityFilter and GopherRepetitionFilter with its English
word tokenizer (spaCy), C4QualityFilter. Needs the bench extra (`make bench` installs it).
Prints MB/s (compressed WET) and documents/s per core for each, and the ratio.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections import deque
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
    from gristmill.core.wet_reader import WetReader
    from gristmill.filters.c4_lines import C4Lines
    from gristmill.filters.gopher_quality import GopherQuality
    from gristmill.filters.gopher_repetition import GopherRepetition
    from gristmill.filters.langid import LangId

    reader = WetReader([str(f) for f in files])
    return [
        reader,
        LangId(model=str(LID), languages=["en"], min_score=0.65),
        GopherQuality(),
        GopherRepetition(),
        C4Lines(),
    ], reader


def datatrove_pipeline(files: list[Path]):
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
    folder = files[0].parent
    reader = WarcReader(str(folder), glob_pattern="*.warc.wet.gz")
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wet", nargs="*", type=Path, help="WET files (default: the shared samples)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    files = args.wet or sorted((DATA / "cc" / "wet").glob("*.warc.wet.gz"))
    if not files or not LID.is_file():
        print(f"need WET files ({DATA}/cc/wet) and {LID} (make models)", file=sys.stderr)
        return 2
    if len({f.parent for f in files}) != 1:
        print("all --wet files must be in one folder (datatrove's reader takes a folder)", file=sys.stderr)
        return 2
    mb = sum(f.stat().st_size for f in files) / 1e6
    from loguru import logger

    logger.remove()  # datatrove's per-file INFO lines would interleave with the table
    ours = measure("gristmill", gristmill_pipeline, files, args.repeat)
    theirs = measure("datatrove", datatrove_pipeline, files, max(1, args.repeat // 2))
    print(f"input: {len(files)} WET files, {mb:.2f} MB compressed; one process, CPU time per pipeline (best of runs)")
    print(f"{'pipeline':<10} {'docs read':>9} {'kept':>6} {'cpu s':>8} {'MB/s/core':>10} {'docs/s/core':>12}")
    for r in (ours, theirs):
        read = r["read"] if r["read"] is not None else "-"
        docs_s = f"{r['read'] / r['cpu_s']:.0f}" if r["read"] else "-"
        print(f"{r['name']:<10} {read:>9} {r['kept']:>6} {r['cpu_s']:>8.2f} {mb / r['cpu_s']:>10.2f} {docs_s:>12}")
    if ours["read"] and theirs["read"] is not None and theirs["read"] < ours["read"]:
        print(
            f"datatrove's WarcReader dropped {ours['read'] - theirs['read']} records without counting them"
            " (libmagic labelled them code/CSV)"
        )
    print(f"ratio gristmill/datatrove (MB/s per core): {theirs['cpu_s'] / ours['cpu_s']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
