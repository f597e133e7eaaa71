"""Task start-up: tasks forked from the task zygote against a fresh interpreter per task.

    PYTHONPATH=src python benchmarks/task_start.py [--config configs/crawl.yaml] [--pairs 2]
        [--work DIR] [--smoke]

Runs `pipeline run CONFIG --set train=null` (the real CLI, from the repository root) twice per
pair: with `GRISTMILL_TASK_START=exec` (every task a fresh `python -c` that imports gristmill,
datatrove, pyarrow and numpy first) and with the default start (tasks forked from the zygote,
`gristmill.pipeline.execution.zygote`), back to back, exec first in odd pairs and fork first in even
ones, so that a shared machine's load weighs on both alike. Per run: the command's wall time and
the CPU seconds of the command and everything it waited for (`getrusage(RUSAGE_CHILDREN)`: the
command, its zygote, which it waits for at exit, and every task); the tasks' own CPU
(`<stage>/usage/` records, the same work on both sides) and the number of tasks. The outputs
(Parquet, token shards, manifest) of the two runs of a pair are compared byte for byte.

`--smoke`: a small config (URL filter, C4 lines, near dedup) on the smaller WET sample, one task
per stage (every task still its own process, exec'd or forked), one pair (checks that it runs;
its figures mean little).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gristmill.pipeline.execution.usage import stage_usage  # noqa: E402
from gristmill.pipeline.execution.zygote import START_ENV  # noqa: E402

PYTHONPATH = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
OUTPUTS = ("*.parquet", "*.arrow", "manifest.json")


def smoke_config(work: Path) -> Path:
    data = Path(os.environ.get("GRISTMILL_DATA", ROOT.parent / "shared" / "data"))
    cfg = {
        "run_dir": str(work / "unused"),
        # one task per stage: each still starts as a full run's do (exec'd or forked), half as many
        "executor": {"type": "local", "tasks": 1, "workers": 1},
        "input": {"paths": [str(data / "cc/wet/CC-MAIN-20170720121902-20170720141902-00000.head43.warc.wet.gz")]},
        "steps": [{"url_filter": {}}, {"c4_lines": {}}, {"near_dedup": {"threshold": 0.8}}],
    }
    path = work / "smoke.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(config: Path, run_dir: Path, start: str) -> dict:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, START_ENV: start}
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gristmill.cli", "run", str(config), "--run-dir", str(run_dir), "--set", "train=null"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{start}: pipeline run exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    usages = [u for s in sorted(run_dir.glob("[0-9]*_*")) if (u := stage_usage(s))]
    return {
        "wall": wall,
        "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "task_cpu": sum(u.cpu_s for u in usages),
        "tasks": sum(u.tasks for u in usages),
        "outputs": digests(run_dir),
        "warned": "task zygote" in proc.stderr,
    }


def digests(run_dir: Path) -> dict[str, str]:
    files = sorted(p for pattern in OUTPUTS for p in run_dir.rglob(pattern))
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "crawl.yaml")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--work", type=Path, default=None, help="run directories go here (default: a temporary one)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="gristmill-task-start-"))
    work.mkdir(parents=True, exist_ok=True)
    config = smoke_config(work) if args.smoke else args.config.resolve()
    pairs = 1 if args.smoke else args.pairs
    totals = {"exec": [0.0, 0.0], "fork": [0.0, 0.0]}
    ratios, identical = [], True
    print(f"config {config}, {pairs} pair(s); CPU = the command, its zygote and its tasks")
    for pair in range(1, pairs + 1):
        order = ("exec", "fork") if pair % 2 else ("fork", "exec")
        load = os.getloadavg()[0]
        results = {}
        for start in order:
            run_dir = work / f"run-{start}-{pair}"
            shutil.rmtree(run_dir, ignore_errors=True)
            results[start] = r = run(config, run_dir, start)
            totals[start][0] += r["wall"]
            totals[start][1] += r["cpu"]
            shutil.rmtree(run_dir, ignore_errors=True)
        same = results["exec"]["outputs"] == results["fork"]["outputs"] and results["fork"]["outputs"]
        identical = identical and bool(same)
        ratios.append(results["exec"]["cpu"] / results["fork"]["cpu"])
        print(f"pair {pair} ({order[0]} first, load average {load:.1f}):")
        for start in ("exec", "fork"):
            r = results[start]
            print(
                f"  {start}: {r['wall']:.2f} s wall, {r['cpu']:.2f} CPU s, of which {r['task_cpu']:.2f} in"
                f" {r['tasks']} tasks' work" + ("  (warned: zygote not used)" if r["warned"] else "")
            )
        print(f"  outputs identical: {'yes' if same else 'NO'} ({len(results['fork']['outputs'])} files)")
    for start in ("exec", "fork"):
        print(f"total {start}: {totals[start][0]:.2f} s wall, {totals[start][1]:.2f} CPU s")
    print(
        f"ratio exec/fork: CPU {totals['exec'][1] / totals['fork'][1]:.2f}×,"
        f" wall {totals['exec'][0] / totals['fork'][0]:.2f}×;"
        f" per pair CPU geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}×"
    )
    print(f"outputs identical in every pair: {'yes' if identical else 'NO'}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
