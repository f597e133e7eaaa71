"""The pipeline on WET records just under the size limit: each stage's peak RSS against its model.

    python benchmarks/large_records_run.py [--records 12] [--mb 30] [--mutate 0.2] [--work $TMPDIR/gristmill-large]
        [--configs crawl open] [--src DIR] [--tasks 2] [--workers 2] [--json OUT.json] [--smoke]

Writes one WET file of `--records` records of `--mb` MB each (`make_large_records.py`, kept in
`--work` and reused) and runs `pipeline run` (the real CLI, a process per task, no training) with:

- `crawl`: `configs/crawl.yaml` as shipped (its filters drop such pages early: gopher_quality's
  `max_doc_words`);
- `open`: the same step list with every threshold opened (each rule still computed, none drops;
  c4_lines keeps lines without terminal punctuation), so the large documents reach every step,
  both dedups and tokenization included.

Per stage it prints the largest task's peak RSS (`<stage>/usage/`) and the planner's memory model
for that stage (`estimate_memory`, with `input.max_record_bytes` set to `--mb` MB rounded up to
a MiB), and whether every task stayed within it. `--src` runs another checkout's code (another
checkout's `src/`, for a before/after table); the models printed are always this checkout's.
`--smoke`: 3 records of 0.3 MB, the `open` configuration, one task per stage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

OPEN_STEPS = {
    "langid": {"languages": None, "min_score": 0.0},
    "gopher_quality": {
        k: None
        for k in (
            "min_doc_words",
            "max_doc_words",
            "min_avg_word_length",
            "max_avg_word_length",
            "max_symbol_word_ratio",
            "max_bullet_lines_ratio",
            "max_ellipsis_lines_ratio",
            "max_non_alpha_words_ratio",
            "min_stop_words",
        )
    },
    "gopher_repetition": {
        "dup_line_frac": 1.0,
        "dup_para_frac": 1.0,
        "dup_line_char_frac": 1.0,
        "dup_para_char_frac": 1.0,
        "top_n_grams": [[2, 1.0], [3, 1.0], [4, 1.0]],
        "dup_n_grams": [[n, 1.0] for n in range(5, 11)],
    },
    "c4_lines": {
        "filter_no_terminal_punct": False,
        "filter_lorem_ipsum": False,
        "filter_curly_bracket": False,
        "min_num_sentences": -1,
        "min_paragraph_words": -1,
    },
    "kenlm": {"max_perplexity": None},
    "quality": {"min_score": 0.0},
}


def config(name: str, wet: Path, run_dir: Path, limit: int, tasks: int, workers: int) -> dict:
    cfg = yaml.safe_load((ROOT / "configs" / "crawl.yaml").read_text())
    cfg["run_dir"] = str(run_dir)
    cfg["executor"] = {"type": "local", "tasks": tasks, "workers": workers}
    cfg["input"] = {"paths": [str(wet)], "max_record_bytes": limit}
    cfg["train"] = None
    if name == "open":
        for entry in cfg["steps"]:
            ((step, params),) = entry.items()
            params.update(OPEN_STEPS.get(step, {}))
    return cfg


def run(cfg_path: Path, src: Path) -> float:
    start = time.monotonic()
    cmd = [sys.executable, "-m", "gristmill.cli", "run", str(cfg_path)]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(src)})
    return time.monotonic() - start


def models(cfg_path: Path) -> dict[str, float]:
    from gristmill.config import load
    from gristmill.pipeline.planning.planner import estimate_memory
    from gristmill.pipeline.planning.projection import plan_for_size

    with contextlib.chdir(ROOT):
        cfg = load(str(cfg_path), [], None)
        stages, _ = plan_for_size(cfg, None, None)
    return {e.stage.label: e.bytes / 1e6 for e in estimate_memory(cfg, stages)}


def measured(run_dir: Path) -> dict[str, dict]:
    out = {}
    for stage in sorted(p for p in run_dir.iterdir() if p.is_dir() and p.name[:2].isdigit()):
        rows = [json.loads(f.read_text()) for f in sorted((stage / "usage").glob("task_*.json"))]
        if rows:
            out[stage.name] = {
                "max_rss_mb": max(r["max_rss_mb"] for r in rows),
                "tasks": len(rows),
                "cpu_s": round(sum(r["cpu_s"] for r in rows), 1),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=12)
    ap.add_argument("--mb", type=float, default=30.0)
    ap.add_argument("--mutate", type=float, default=0.2)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gristmill-large")
    ap.add_argument("--configs", nargs="+", default=["crawl", "open"], choices=["crawl", "open"])
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="the code to run (another checkout's src/)")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tag", default="", help="suffix of the run directories (e.g. before)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="3 records of 0.3 MB, the open configuration, 1 task")
    a = ap.parse_args()
    if a.smoke:
        a.records, a.mb, a.configs, a.tasks, a.workers = 3, 0.3, ["open"], 1, 1
    from make_large_records import write

    a.work.mkdir(parents=True, exist_ok=True)
    size = int(a.mb * 1e6)
    wet = a.work / f"large-{a.records}x{a.mb:g}mb-m{a.mutate:g}.warc.wet.gz"
    if not wet.is_file():
        write(wet, a.records, size, mutate=a.mutate)
    limit = math.ceil(size / (1 << 20)) << 20
    results = {}
    for name in a.configs:
        run_dir = a.work / f"run-{name}{'-' + a.tag if a.tag else ''}"
        cfg_path = a.work / f"{name}{'-' + a.tag if a.tag else ''}.yaml"
        cfg_path.write_text(yaml.safe_dump(config(name, wet, run_dir, limit, a.tasks, a.workers), sort_keys=False))
        wall = run(cfg_path, a.src)
        model = models(cfg_path)
        rows = measured(run_dir)
        results[name] = {
            "wall_s": round(wall, 1),
            "stages": {k: {**v, "model_mb": model.get(k)} for k, v in rows.items()},
        }
        print(
            f"\n{name}: {a.records} records of {a.mb:g} MB, max_record_bytes {limit}, {wall:.0f} s wall, code {a.src}"
        )
        print("| stage | tasks | peak RSS MB (largest task) | model MB | CPU s |")
        print("|---|---:|---:|---:|---:|")
        for stage, r in results[name]["stages"].items():
            m = "—" if r["model_mb"] is None else f"{r['model_mb']:.0f}"
            print(f"| {stage} | {r['tasks']} | {r['max_rss_mb']:.0f} | {m} | {r['cpu_s']} |")
        stages = results[name]["stages"]
        over = [k for k, r in stages.items() if r["model_mb"] is None or r["max_rss_mb"] > r["model_mb"]]
        top = max(stages.items(), key=lambda kv: kv[1]["max_rss_mb"])
        print(
            f"{name}: {len(stages)} stages, largest task peak {top[1]['max_rss_mb']:.0f} MB ({top[0]}); "
            f"over their model: {', '.join(over) or 'none'}"
        )
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
