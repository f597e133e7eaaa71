"""One task of a stage, in its own process: the one body every executor runs (`run_task`), and
the plumbing of a task process that the local and Ray executors share.

Whatever starts it (the local executor's child forked from the task zygote or exec'd, a Slurm
array task, a Ray task's child), a task does the same, in this order:

1. installs the run's storage settings (`executor.storage_config`: they travel with the
   pickled executor, never through a global of the process that planned);
2. skips a rank already complete (datatrove logs it);
3. where the run directory is on object storage (`executor.remote`), runs in a working copy of
   its own and commits it (`gristmill.pipeline.execution.staging`);
4. records its CPU time, wall time and peak memory (`gristmill.pipeline.execution.usage`);
5. logs quietly (`compat.datatrove.quiet_task_logging`: INFO to its log file only);
6. runs the steps: datatrove's per-rank body (stats, the completion marker).

`GRISTMILL_TASK_HOOKS` names plug-ins (`/path/to/file.py:function`, comma-separated) that a
task calls with its steps and rank before it runs them, each returning the steps to run: the
tests inject their faults (a kill after N documents, a failing task) through it, so no fault
lives in product code.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading

import dill

from gristmill.compat.datatrove import quiet_task_logging, run_steps
from gristmill.core import storage
from gristmill.core.messages import os_error_line
from gristmill.pipeline.execution.staging import run_in_working_copy
from gristmill.pipeline.execution.usage import measured
from gristmill.pipeline.execution.zygote import die_with_parent

TASK_HOOKS_ENV = "GRISTMILL_TASK_HOOKS"
POLL_S = 0.25  # how often a supervisor looks at its tasks and the progress bar
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long


def run_task(executor, rank: int, local_rank: int = 0, node_rank: int = -1):
    """Run one rank of `executor`'s stage in this process (see the module doc)."""
    storage.configure(executor.storage_config)
    if executor.is_rank_completed(rank):
        return run_steps(executor, rank, local_rank, node_rank)

    def body():
        quiet_task_logging()
        return run_steps(executor, rank, local_rank, node_rank)

    steps = executor.pipeline
    for hook in _hooks():
        executor.pipeline = hook(executor.pipeline, rank)
    try:
        if executor.remote is not None:
            return run_in_working_copy(executor, lambda: measured(executor, rank, body), rank)
        return measured(executor, rank, body)
    finally:
        executor.pipeline = steps  # a Slurm array task runs several ranks with one executor


def _hooks() -> list:
    found = []
    for spec in filter(None, os.environ.get(TASK_HOOKS_ENV, "").split(",")):
        path, _, name = spec.rpartition(":")
        module_spec = importlib.util.spec_from_file_location(f"_gristmill_task_hook_{len(found)}", path)
        if module_spec is None or module_spec.loader is None:
            raise RuntimeError(f"{TASK_HOOKS_ENV}: {path} is not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        found.append(getattr(module, name))
    return found


# --- a task's process ------------------------------------------------------------------------------------


class TaskFailed(RuntimeError):
    """A task of a stage died or failed; `str()` is one line naming task, cause and log."""

    def __init__(self, rank: int, cause: str, log: str):
        self.rank, self.cause, self.log = rank, cause, log
        super().__init__(f"task {rank} {cause}; log: {log}")


class Interrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP (or Ctrl-C) reached the supervisor; its tasks have been stopped."""

    def __init__(self, signum: int = signal.SIGINT):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def describe_exit(returncode: int, error: str) -> str:
    """Why a task process ended without completing, in words."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = {
            "SIGKILL": " (killed: out of memory?)",
            "SIGSEGV": " (segmentation fault in native code)",
            "SIGBUS": " (bus error: a memory-mapped file truncated?)",
            "SIGABRT": " (aborted in native code)",
        }
        return f"was killed by {name}{hint.get(name, '')}"
    if error:
        return f"failed: {error}"
    if returncode:
        return f"exited with code {returncode} without reporting an error"
    return "exited without marking itself complete"


def _error_line(e: BaseException, stage_dir: str | None) -> str:
    if isinstance(e, OSError) and (e.errno is not None or e.filename):
        # pyarrow and others raise ENOSPC without the path: name the stage folder being written
        return os_error_line(e, f"writing under {stage_dir}")
    return f"{type(e).__name__}: {e}"


def task_process(status_fd: int, executor_file: str, rank: str, local_rank: str, parent: str) -> None:
    """In a task's own process (exec'd, or forked by a zygote): run one rank of the pickled
    executor, write why it failed to `status_fd`, and end the process."""
    die_with_parent(int(parent))
    status = os.fdopen(status_fd, "w")
    code, stage_dir = 0, None
    try:
        with open(executor_file, "rb") as f:
            executor = dill.load(f)
        stage_dir = getattr(executor.logging_dir, "path", None)
        run_task(executor, int(rank), int(local_rank))
    except BaseException as e:  # noqa: BLE001 - reported by the supervisor; the traceback is in the task log
        status.write(_error_line(e, stage_dir).replace("\n", " "))
        code = 1
    status.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit work: nothing of the task is left to tidy


def _task_main() -> None:
    """Entry point of a task's process started with exec (`TASK_CMD`)."""
    executor_file, rank, local_rank, parent, status_fd = sys.argv[2:7]
    task_process(int(status_fd), executor_file, rank, local_rank, parent)


#: a task's process started with exec: `python -c TASK_CMD SYS_PATH EXECUTOR RANK LOCAL_RANK PARENT STATUS_FD`
TASK_CMD = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from gristmill.pipeline.execution.task import _task_main; _task_main()"
)
TASK_TARGET = "gristmill.pipeline.execution.task:task_process"  # what a zygote's child calls


class Signals:
    """While supervising: SIGTERM/SIGHUP raise Interrupted in the main thread, so tasks are stopped."""

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self.previous[sig] = signal.signal(sig, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise Interrupted(signum)

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
