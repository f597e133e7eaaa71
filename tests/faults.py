"""Faults the tests inject into a run's tasks, through the task plug-in point
(`GRISTMILL_TASK_HOOKS`, `gristmill.pipeline.execution.task`), which tests/conftest.py installs for every
command the suite starts. Each hook does nothing unless its own variable is set:

- GRISTMILL_KILL_TASK="RANK:SIGNAL:DOCS": task RANK sends itself SIGNAL (a name: SIGKILL,
  SIGSEGV, SIGSTOP, ...) once DOCS documents have been read;
- GRISTMILL_FAIL_TASK="RANK": task RANK raises (a failed task, not a kill);
- GRISTMILL_FAULT_AFTER_DOCS="N": every task dies (exit 137, as if killed) once its writer has
  written N documents, its half-written `.tmp` file flushed and left behind.

Loaded by path in the task's process (never imported as `tests.faults` there), so it imports
only what any task has.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

KILL_TASK_ENV = "GRISTMILL_KILL_TASK"
FAIL_TASK_ENV = "GRISTMILL_FAIL_TASK"
FAULT_ENV = "GRISTMILL_FAULT_AFTER_DOCS"
#: the value of GRISTMILL_TASK_HOOKS that installs every hook below
HOOKS = ",".join(f"{Path(__file__).resolve()}:{name}" for name in ("kill_after", "fail_task", "die_after_writing"))


def kill_after(steps: list, rank: int) -> list:
    parts = os.environ.get(KILL_TASK_ENV, "").split(":")
    if len(parts) != 3 or parts[0] != str(rank):
        return steps
    sig, after = signal.Signals[parts[1]], int(parts[2])

    def kill_after(data, rank=0, world_size=1):
        for i, doc in enumerate(data, 1):
            if i == after:
                os.kill(os.getpid(), sig)
            yield doc

    return [steps[0], kill_after, *steps[1:]]


def fail_task(steps: list, rank: int) -> list:
    from gristmill.core.parquet_io import ParquetWriter

    if os.environ.get(FAIL_TASK_ENV) != str(rank) or not any(isinstance(s, ParquetWriter) for s in steps):
        return steps  # as a writer that raised would: only stages that write documents

    def fail(data, rank=0, world_size=1):
        raise RuntimeError(f"injected failure of task {rank} ({FAIL_TASK_ENV})")
        yield  # a generator, as a step is

    return [*steps[:-1], fail, steps[-1]]


def die_after_writing(steps: list, rank: int) -> list:
    after = int(os.environ.get(FAULT_ENV, "0"))
    if not after:
        return steps
    from gristmill.core.parquet_io import ParquetWriter

    for step in steps:
        if isinstance(step, ParquetWriter):
            write = step._write

            def dying(data, rank, files, write=write):
                for i, doc in enumerate(write(data, rank, files), 1):
                    if i == after:
                        for out in files.values():
                            out.flush()
                        os._exit(137)
                    yield doc

            step._write = dying
    return steps
