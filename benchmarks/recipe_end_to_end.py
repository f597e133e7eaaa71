"""FineWeb's recipe end to end: `configs/fineweb.yaml` against datatrove's FineWeb pipeline, CPU
seconds per GB of compressed WET, on the same generated corpus.

    python benchmarks/recipe_end_to_end.py [--gb 0.25] [--work DIR] [--seed 1] [--tasks 2]
        [--workers 2] [--skip datatrove] [--json OUT] [--smoke]

The corpus is `make_wet_corpus.py --gb GB --seed SEED` (made once in `--work`, reused). Each side
runs as its users run it, in a child process of this script, and its CPU time is that child's
and every process it started and waited for (`RUSAGE_CHILDREN` around it: the CLI's planning
process, each task's process, datatrove's pool workers and `multiprocess` manager processes,
model trial loads), from start-up and imports to the last file written:

* gristmill: `pipeline run configs/fineweb.yaml` as shipped (`--set` only the input, tasks and
  workers): url_filter, langid, gopher_repetition, gopher_quality, c4_lines, fineweb_quality,
  near_dedup (14 x 8 MinHash), pii, tokenize (GPT-2's tokenizer; token shards shuffled across the
  run), its dropped-document samples (10%) included;
* datatrove 0.10.1: the pipeline of its examples/fineweb.py on WET files (no extraction), with
  the same parameters (benchmarks/recipe_compare.py builds it; same lid.176.ftz model, tldextract's
  bundled suffix list): WarcReader, URLFilter, LanguageFilter, GopherRepetitionFilter,
  GopherQualityFilter, C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter,
  JsonlWriter; MinhashDedupSignature, MinhashDedupBuckets (14 tasks), MinhashDedupCluster;
  MinhashDedupFilter, PIIFormatter, JsonlWriter, DocumentTokenizer (HF tokenizers, the same GPT-2
  tokenizer.json); DocumentTokenizerMerger (the shuffle across files). No exclusion writers
  (FineWeb's example wrote every dropped document: datatrove does less writing than it did).

Both with `--tasks` tasks per stage and `--workers` at once (the curate stage: one task per file).
gristmill's url_filter lookup files are built before the clock starts (once per cache folder,
~9 CPU s, then reused by every run); datatrove reads its blocklist in every task, counted.
Prints CPU seconds, CPU-s per GB and documents kept for each, gristmill's per stage (its
tasks' own usage records, the rest being the CLI and process start-up), datatrove's per executor,
and the ratio datatrove / gristmill of CPU-s per GB (the goal: >= 20).

Then, with `--profile N` (default 5,000; 0: none), where the time goes: both sides' streaming
steps (reader, URL filter, language ID, the Gopher, C4 and FineWeb filters, PII) one at a time
in this process on the first N records of the first file, CPU seconds per step, each step given
what the one before kept (the stages after curation are in the per-stage lines above).

`--smoke`: the smaller WET sample file instead of a generated corpus, 1 task, no untimed planning
run before gristmill's (its lookup files, if not built yet, are built on the clock), the profile
on its records (checks that the benchmark still runs; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DATA = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
CONFIG = REPO / "configs" / "fineweb.yaml"
sys.path.insert(0, str(BENCH))


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _env() -> dict:
    src = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": src, "TOKENIZERS_PARALLELISM": "false"}


def timed(cmd: list[str], cwd: Path, log: Path) -> dict:
    """Runs `cmd`; its CPU seconds with every process it waited for, and its wall time."""
    c0, w0 = _children_cpu(), time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=cwd, env=_env(), stdout=out, stderr=subprocess.STDOUT)
    result = {"cpu_s": _children_cpu() - c0, "wall_s": time.perf_counter() - w0}
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} ... exited {proc.returncode}; its log: {log}\n{log.read_text()[-3000:]}")
    return result


def corpus(work: Path, gb: float, seed: int) -> list[Path]:
    out = work / f"wet-{gb:g}"
    if not (out / "truth.jsonl").is_file():
        cmd = [sys.executable, str(BENCH / "make_wet_corpus.py"), "--gb", str(gb), "--seed", str(seed), str(out)]
        subprocess.run(cmd, check=True, env=_env())
    return sorted(out.glob("*.warc.wet.gz"))


def gpt2_tokenizer_json(work: Path) -> Path:
    """GPT-2's files as one tokenizer.json, which datatrove's DocumentTokenizer loads."""
    from gristmill.tokenize import tokenizer

    path = work / "gpt2-tokenizer.json"
    if not path.is_file():
        tokenizer.load(DATA / "tokenizers" / "gpt2").save(str(path))
    return path


def gristmill_args(files: list[Path], run_dir: Path, tasks: int, workers: int) -> list[str]:
    return [
        str(CONFIG),
        "--run-dir",
        str(run_dir),
        "--set",
        f"input.paths={json.dumps([str(f) for f in files])}",
        "--set",
        f"executor.tasks={tasks}",
        "--set",
        f"executor.workers={workers}",
    ]


def run_gristmill(files: list[Path], work: Path, tasks: int, workers: int, smoke: bool = False) -> dict:
    from gristmill.pipeline.execution.usage import stage_usage

    run_dir = work / "gristmill"
    shutil.rmtree(run_dir, ignore_errors=True)
    args = gristmill_args(files, run_dir, tasks, workers)
    # untimed: builds url_filter's lookup files if this cache has none yet (once per cache folder);
    # a smoke run leaves that to the run's own planning (its figures mean nothing)
    if not smoke:
        subprocess.run(
            [sys.executable, "-m", "gristmill.cli", "plan", *args],
            cwd=REPO,
            env=_env(),
            check=True,
            capture_output=True,
        )
    r = timed([sys.executable, "-m", "gristmill.cli", "run", *args], REPO, work / "gristmill.log")
    plan = json.loads((run_dir / "plan.json").read_text())
    stages = []
    for st in plan["stages"]:
        u = stage_usage(run_dir / st["label"])
        stages.append({"stage": st["label"], "tasks": st["tasks"], "cpu_s": u.cpu_s if u else 0.0})
    manifest = json.loads((run_dir / "tokens" / "manifest.json").read_text())
    stats = json.loads((run_dir / "stats.json").read_text())
    return {
        **r,
        "stages": stages,
        "tokens": manifest_total(manifest, "tokens"),
        "kept": manifest_total(manifest, "documents"),
        "stats": stats,
    }


def manifest_total(manifest: dict, key: str) -> int:
    totals = manifest.get("totals") or {}
    if key in totals:
        return int(totals[key])
    return sum(int(s[key]) for s in manifest.get("shards", []))


def datatrove_side(files: list[Path], work: Path, tasks: int, workers: int, tokenizer: Path) -> None:
    """Runs in its own process (`--datatrove-side`): datatrove's FineWeb pipeline, each
    executor's CPU (with its workers') written to work/datatrove.json."""
    import contextlib

    from recipe_compare import datatrove_fineweb, datatrove_offline

    from gristmill.filters.c4_lines import C4Lines
    from gristmill.filters.fineweb_quality import FineWebQuality
    from gristmill.filters.gopher_quality import GopherQuality
    from gristmill.filters.gopher_repetition import GopherRepetition

    datatrove_offline()
    # gristmill's defaults are datatrove's; FineWeb's C4 filter has no terminal-punctuation rule
    en = {
        "gopher_repetition": GopherRepetition().config_for("en"),
        "gopher_quality": GopherQuality().config_for("en"),
        "c4_lines": C4Lines(filter_no_terminal_punct=False).config_for("en"),
        "fineweb_quality": FineWebQuality().config_for("en"),
    }
    dt = work / "datatrove"
    shutil.rmtree(dt, ignore_errors=True)
    names = ["filter", "minhash signatures", "minhash buckets", "minhash clusters", "dedup+pii+tokens", "merge tokens"]
    out = []
    with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
        executors = datatrove_fineweb(
            files, dt, en, exclusions=False, tokenizer=tokenizer, tasks=tasks, workers=workers
        )
        for name, ex in zip(names, executors):
            me = resource.getrusage(resource.RUSAGE_SELF)
            c0 = me.ru_utime + me.ru_stime + _children_cpu()
            ex.run()
            me = resource.getrusage(resource.RUSAGE_SELF)
            out.append(
                {"stage": name, "tasks": ex.world_size, "cpu_s": me.ru_utime + me.ru_stime + _children_cpu() - c0}
            )
    kept = 0
    for f in (dt / "final").glob("*.jsonl.gz"):
        with gzip.open(f, "rt") as fh:
            kept += sum(1 for _ in fh)
    tokens = 0
    for f in (dt / "merged").glob("*.ds"):
        tokens += f.stat().st_size // 2  # uint16 ids (GPT-2's vocabulary)
    (work / "datatrove.json").write_text(json.dumps({"stages": out, "kept": kept, "tokens": tokens}))


class _Chain:
    """Two steps run as one (their documents flow through both, one at a time), so that
    gopher_quality reuses the words gopher_repetition split, as it does in a run."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def run(self, data, rank=0, world_size=1):
        return self.second.run(self.first.run(data, rank, world_size), rank, world_size)


def _timed_steps(docs, steps) -> list[tuple[str, int, float]]:
    """(name, documents in, CPU s) of each (name, step) run over the documents the one before
    it kept, materialised in between: each step's own time, its harness (stats) included."""
    out = []
    for name, step in steps:
        c0 = time.process_time()
        kept = list(step.run(iter(docs), 0, 1))
        out.append((name, len(docs), time.process_time() - c0))
        docs = kept
    return out


def step_profile(files: list[Path], records: int, work: Path) -> list[str]:
    """Where each side's curation time goes: both pipelines' streaming steps, one at a time, in
    this process, on the first `records` records of the first file (CPU seconds each)."""
    import contextlib

    from datatrove.pipeline.filters import LanguageFilter
    from datatrove.pipeline.formatters import PIIFormatter
    from recipe_compare import datatrove_filter, datatrove_offline, url_filter, warc_reader

    from gristmill.filters.c4_lines import C4Lines
    from gristmill.filters.fineweb_quality import FineWebQuality
    from gristmill.filters.gopher_quality import GopherQuality
    from gristmill.filters.gopher_repetition import GopherRepetition
    from gristmill.filters.langid import LangId
    from gristmill.filters.pii import PII
    from gristmill.filters.url_filter import UrlFilter
    from gristmill.input.wet import WetReader

    datatrove_offline()
    filters = {
        "gopher_repetition": GopherRepetition(),
        "gopher_quality": GopherQuality(),
        "c4_lines": C4Lines(filter_no_terminal_punct=False),
        "fineweb_quality": FineWebQuality(),
    }
    dt = {name: datatrove_filter(name, step.config_for("en"), "en") for name, step in filters.items()}
    gopher = "gopher_repetition+quality"
    ours = [
        ("url_filter", UrlFilter()),  # its lookup files: built by the run's planning already
        ("langid", LangId(model=str(REPO / "models" / "lid.176.ftz"), languages=["en"], min_score=0.65)),
        (gopher, _Chain(filters["gopher_repetition"], filters["gopher_quality"])),
        ("c4_lines", filters["c4_lines"]),
        ("fineweb_quality", filters["fineweb_quality"]),
        ("pii", PII()),
    ]
    theirs = [
        ("url_filter", url_filter()),
        ("langid", LanguageFilter(languages=["en"], language_threshold=0.65)),
        (gopher, _Chain(dt["gopher_repetition"], dt["gopher_quality"])),
        ("c4_lines", dt["c4_lines"]),
        ("fineweb_quality", dt["fineweb_quality"]),
        ("pii", PIIFormatter()),
    ]
    theirs[1][1].model.model  # noqa: B018 - loaded before the clock, as ours is in the step's run
    rows = {}
    with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
        c0 = time.process_time()
        g_docs = list(WetReader([str(files[0])], limit=records).run(None, 0, 1))
        rows["read"] = [len(g_docs), time.process_time() - c0]
        c0 = time.process_time()
        reader = warc_reader(files[:1], work / "profile")
        reader.limit = len(g_docs)
        d_docs = list(reader.run(None, 0, 1))
        rows["read"] += [len(d_docs), time.process_time() - c0]
        from datatrove.utils.word_tokenizers import load_word_tokenizer

        load_word_tokenizer("en").word_tokenize("spaCy loaded before the clock starts.")
        for (name, n, cpu), (_, m, dcpu) in zip(_timed_steps(g_docs, ours), _timed_steps(d_docs, theirs)):
            rows[name] = [n, cpu, m, dcpu]
    mb = sum(f.stat().st_size for f in files[:1]) / 1e6
    total_g, total_d = sum(r[1] for r in rows.values()), sum(r[3] for r in rows.values())
    out = [
        f"where the time goes: the streaming steps one at a time, in one process, on the first {len(g_docs):,} "
        f"records of {files[0].name} ({mb:.0f} MB file); CPU s",
        "| step | docs in, gristmill | CPU s | share | docs in, datatrove | CPU s | share | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (n, cpu, m, dcpu) in rows.items():
        out.append(
            f"| {name} | {n:,} | {cpu:.2f} | {cpu / total_g:.0%} | {m:,} | {dcpu:.2f} | {dcpu / total_d:.0%} |"
            f" {dcpu / max(cpu, 1e-9):.1f}x |"
        )
    out.append(f"| all | | {total_g:.2f} | | | {total_d:.2f} | | {total_d / total_g:.1f}x |")
    return out


def run_datatrove(files: list[Path], work: Path, tasks: int, workers: int, tokenizer: Path) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--datatrove-side",
        "--work",
        str(work),
        "--tasks",
        str(tasks),
        "--workers",
        str(workers),
        "--tokenizer",
        str(tokenizer),
        "--files",
        *map(str, files),
    ]
    r = timed(cmd, REPO, work / "datatrove.log")
    return {**r, **json.loads((work / "datatrove.json").read_text())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=0.25, help="size of the generated corpus, GB of compressed WET")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gristmill-recipe-e2e"))
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip", nargs="*", default=[], help="sides to skip: datatrove gristmill")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--profile",
        type=int,
        default=5000,
        help="records of the first file for the per-step profile (0: none)",
    )
    ap.add_argument("--smoke", action="store_true", help="the smaller WET sample, one task: checks that it runs")
    # the datatrove side, run by this script in a child process
    ap.add_argument("--datatrove-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--files", nargs="*", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.datatrove_side:
        datatrove_side(a.files, a.work, a.tasks, a.workers, a.tokenizer)
        return 0
    if a.smoke:
        samples = sorted((DATA / "cc" / "wet").glob("*.warc.wet.gz"), key=lambda f: f.stat().st_size)
        files, a.tasks, a.workers, a.profile = samples[:1], 1, 1, 100
        a.work = Path(os.environ.get("TMPDIR", "/tmp")) / "gristmill-recipe-e2e-smoke"
    else:
        a.work.mkdir(parents=True, exist_ok=True)
        files = corpus(a.work, a.gb, a.seed)
    if not files:
        print(f"no WET files (need {DATA}/cc/wet)", file=sys.stderr)
        return 2
    a.work.mkdir(parents=True, exist_ok=True)
    gb = sum(f.stat().st_size for f in files) / 1e9
    sys.path.insert(0, str(REPO / "src"))
    tokenizer = gpt2_tokenizer_json(a.work)
    print(
        f"input: {len(files)} WET files, {gb:.3f} GB compressed; {a.tasks} tasks per stage, {a.workers} workers;"
        " CPU seconds of every process each side starts",
        flush=True,
    )
    results = {}
    if "gristmill" not in a.skip:
        g = results["gristmill"] = run_gristmill(files, a.work, a.tasks, a.workers, a.smoke)
        tasks_cpu = sum(s["cpu_s"] for s in g["stages"])
        print(
            f"gristmill configs/fineweb.yaml: {g['cpu_s']:.1f} CPU s ({g['wall_s']:.0f} s wall), "
            f"{g['cpu_s'] / gb:,.0f} CPU-s per GB; {g['kept']:,} documents kept, {g['tokens']:,} tokens",
            flush=True,
        )
        for s in g["stages"]:
            print(f"  {s['stage']:<26} {s['tasks']:>3} tasks {s['cpu_s']:>9.1f} CPU s")
        print(f"  {'CLI, process start-up, imports':<36} {g['cpu_s'] - tasks_cpu:>9.1f} CPU s")
    if "datatrove" not in a.skip:
        try:
            import spacy  # noqa: F401  (datatrove's English word tokenizer)
        except ImportError as e:
            print(f"datatrove's side skipped: {e} (pip install -e '.[bench]')")
        else:
            d = results["datatrove"] = run_datatrove(files, a.work, a.tasks, a.workers, tokenizer)
            print(
                f"datatrove FineWeb pipeline: {d['cpu_s']:.1f} CPU s ({d['wall_s']:.0f} s wall), "
                f"{d['cpu_s'] / gb:,.0f} CPU-s per GB; {d['kept']:,} documents kept, {d['tokens']:,} tokens",
                flush=True,
            )
            for s in d["stages"]:
                print(f"  {s['stage']:<26} {s['tasks']:>3} tasks {s['cpu_s']:>9.1f} CPU s")
    if len(results) == 2:
        ratio = results["datatrove"]["cpu_s"] / results["gristmill"]["cpu_s"]
        print(f"ratio datatrove/gristmill (CPU-s per GB, end to end): {ratio:.1f}x", flush=True)
    if a.profile and "datatrove" not in a.skip:
        print("\n".join(step_profile(files, a.profile, a.work)), flush=True)
    if a.json:
        for r in results.values():
            r.pop("stats", None)
        a.json.write_text(json.dumps({"gb": gb, "files": [str(f) for f in files], **results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
