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

#: states of a job that is still in the queue's hands: waiting, running, or passing between the
#: two (a requeue shows REQUEUED, REQUEUE_FED or COMPLETING; a signal being delivered, as `scancel
#: --signal` does, SIGNALING; a suspended or stopped job resumes). Held jobs (REQUEUE_HOLD,
#: SPECIAL_EXIT) wait for a person, so a follower does not wait for them.
ACTIVE = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_FED",
        "SIGNALING",
        "STAGE_OUT",
        "SUSPENDED",
        "STOPPED",
        "RESIZING",
    }
)

#: what scontrol says of a job it does not know (never submitted, or ended more than MinJobAge ago)
_UNKNOWN_JOB = "Invalid job id specified"


class SlurmQueryFailed(OSError):
    """scontrol did not answer (slurmctld busy, restarting or unreachable): the job's state is not
    known, which is not the same as the job being gone. An OSError: the CLI says it in one line."""


def is_active(states: Counter | dict) -> bool:
    return any(s in ACTIVE for s in states)


def job_states(job_id: str) -> Counter:
    """Counts of array-task states of one job, e.g. {"RUNNING": 2, "PENDING": 6}; empty if gone.
    A stage of several arrays is recorded as their ids joined by `:` ("101:102"): summed.
    SlurmQueryFailed where scontrol gives no answer (an unknown job is an answer: gone)."""
    if ":" in str(job_id):
        return sum((job_states(j) for j in str(job_id).split(":")), Counter())
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmQueryFailed(f"scontrol show job {job_id}: {e}") from e
    states: Counter = Counter()
    if out.returncode != 0:
        if _UNKNOWN_JOB in out.stderr:
            return states
        reason = (out.stderr.strip() or out.stdout.strip() or f"exit status {out.returncode}").splitlines()[-1]
        raise SlurmQueryFailed(f"scontrol show job {job_id}: {reason}")
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


def wait_until_gone(job_ids: list[str], poll_s: float = 2.0, on_poll=None, give_up_s: float = 600.0) -> None:
    """Return once none of `job_ids` is active. A poll scontrol does not answer counts as "still
    there" (a busy slurmctld must not end a follower early); SlurmQueryFailed once it has not
    answered for `give_up_s` in a row."""
    import time

    failing_since = None
    while True:
        try:
            live = [j for j in job_ids if is_active(job_states(j))]
            failing_since = None
        except SlurmQueryFailed:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > give_up_s:
                raise
            live = job_ids
        if on_poll:
            on_poll()
        if not live:
            return
        time.sleep(poll_s)
