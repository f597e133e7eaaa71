"""What Slurm says about a run's jobs, without accounting (`sacct` needs slurmdbd).

`squeue` shows pending and running array tasks; `scontrol show job` also remembers jobs for a
while after they end (MinJobAge) with their final state. A job neither knows about is gone:
its outcome is read from the completion files instead.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter

_FIELD = re.compile(r"(\w+)=(\S*)")


def job_states(job_id: str) -> Counter:
    """Counts of array-task states of one job, e.g. {"RUNNING": 2, "PENDING": 6}; empty if gone.
    A stage of several arrays is recorded as their ids joined by `:` ("101:102"): summed."""
    if ":" in str(job_id):
        return sum((job_states(j) for j in str(job_id).split(":")), Counter())
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return Counter()
    states: Counter = Counter()
    if out.returncode != 0:
        return states
    for line in out.stdout.splitlines():
        fields = dict(_FIELD.findall(line))
        state = fields.get("JobState")
        if not state:
            continue
        tasks = fields.get("ArrayTaskId", "")
        states[state] += _count_array_ids(tasks) if state == "PENDING" and tasks else 1
    return states


def _count_array_ids(spec: str) -> int:
    """'0-7%2' or '3,5-6' → number of ids."""
    spec = spec.split("%")[0]
    n = 0
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")[:2]
            n += int(b.split(":")[0]) - int(a) + 1
        elif part:
            n += 1
    return n


def wait_until_gone(job_ids: list[str], poll_s: float = 2.0, on_poll=None) -> None:
    import time

    while True:
        live = [
            j
            for j in job_ids
            if any(
                s in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED", "RESIZING")
                for s in job_states(j)
            )
        ]
        if on_poll:
            on_poll()
        if not live:
            return
        time.sleep(poll_s)
