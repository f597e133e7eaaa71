"""What each task cost: CPU seconds, peak memory, wall time; written per task, summed per stage.

A task appends nothing to the documents' path: when it completes, its process writes
`<stage>/usage/task_NNNNN.json` = {"cpu_s", "wall_s", "max_rss_mb", "start", "end"} from `getrusage` and
/proc (its own
process: the local executor runs each task in a child of its own, forked from the task zygote
or exec'd; a Slurm array task is its own job). `max_rss_mb` is the process's peak resident set,
imports and models included (a forked task counts the zygote's resident pages it shares: the
kernel starts a forked process's high-water mark at its resident set, not at the zygote's peak):
the figure a memory limit (`executor.memory_gb_per_task`, Slurm's `--mem-per-cpu`) is compared with.

`stage_usage` sums them for `pipeline stats`, `benchmarks/scale_run.py` and the calibration of
`pipeline plan`.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gristmill.core.files import write_text_atomic

USAGE_FOLDER = "usage"


def _rss_mb(ru) -> float:
    """The process's peak resident set, MB. On Linux, `VmHWM` of /proc/self/status: `ru_maxrss`
    carries over the high-water mark of the process that started this one (the kernel keeps the
    larger of the old and new address space's at exec), so a task started from a large parent (a
    test runner holding 800 MB) would report the parent's peak as its own."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    # Linux reports ru_maxrss in KiB, macOS in bytes
    return ru.ru_maxrss / (1 << 20 if sys.platform == "darwin" else 1 << 10)


def measured(executor, rank: int, body):
    """`body()` (a task's steps), its usage written to `<stage>/usage/task_NNNNN.json` when it
    returns."""
    start, start_wall = time.time(), time.monotonic()
    before = resource.getrusage(resource.RUSAGE_SELF)
    stats = body()
    after = resource.getrusage(resource.RUSAGE_SELF)
    usage = {
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 3),
        "wall_s": round(time.monotonic() - start_wall, 3),
        "max_rss_mb": round(_rss_mb(after), 1),
        "start": round(start, 3),
        "end": round(time.time(), 3),
    }
    folder = Path(executor.logging_dir.resolve_paths(USAGE_FOLDER))
    try:
        write_text_atomic(folder / f"task_{rank:05d}.json", json.dumps(usage))
    except OSError:
        pass  # usage is a report: a full disk must not fail a task that completed
    return stats


@dataclass
class StageUsage:
    tasks: int
    cpu_s: float
    #: the longest task's wall time (a lower bound of the stage's, with enough workers)
    max_task_wall_s: float
    max_rss_mb: float
    #: first task's start to last task's end (the stage's wall time, if it ran in one go)
    wall_s: float


def stage_usage(stage_folder: Path) -> StageUsage | None:
    """The stage's tasks' usage summed (CPU) and maximised (memory, task time); None if none ran."""
    rows = []
    for f in sorted((Path(stage_folder) / USAGE_FOLDER).glob("task_*.json")):
        try:
            rows.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    if not rows:
        return None
    return StageUsage(
        len(rows),
        sum(r["cpu_s"] for r in rows),
        max(r["wall_s"] for r in rows),
        max(r["max_rss_mb"] for r in rows),
        max(r.get("end", 0) for r in rows) - min(r.get("start", 0) for r in rows),
    )
