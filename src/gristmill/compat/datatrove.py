"""datatrove internals gristmill leans on, in one place.

- Task logging: datatrove's executors set up each task's logging with the module functions
  `datatrove.executor.base.add_task_logger` / `close_task_logger`, which print every task's INFO
  lines to the terminal (burying the progress bar). In the task's own process we replace the
  two: INFO and below go to the task's log file only (a sink that survives a full disk), the
  terminal gets one line per warning or error, tracebacks stay in the file.
- `PipelineExecutor._run_for_rank(rank, local_rank, node_rank)`: runs one task (skips it if
  complete, writes stats and the completion marker). Each of gristmill's executors (local,
  Slurm, Ray) overrides it with `gristmill.pipeline.execution.task.run_task`, the one task body, which
  calls datatrove's own (`run_steps`) once it has installed the logging above.
- Importing `datatrove.utils.logging` configures loguru (INFO to stderr); the CLI imports it
  first so that its own setup afterwards wins.
"""

from __future__ import annotations

import sys

from loguru import logger

#: datatrove versions this module was written and tested for
WRITTEN_FOR = ("0.10.1",)


#: datatrove's own add/close_task_logger, kept when `quiet_task_logging` replaces them
_originals: dict = {}


def _one_line(record) -> str:
    # A callable format gets no traceback appended: tracebacks belong in the task's log file,
    # the terminal shows one line per warning or error.
    return "{level: <8} | {message}\n"


_TERMINAL = {"level": "WARNING", "format": _one_line}


def _guarded(stream):
    """A log sink that survives a full disk: the task fails with its own error, once, instead
    of loguru printing a traceback for every log line it could not write."""

    def write(message: str) -> None:
        try:
            stream.write(message)
        except OSError:
            pass

    return write


def _add_task_logger_quiet(logging_dir, rank, local_rank=0, node_rank=-1):
    # local_rank=1 makes datatrove's own terminal sink ERROR-only (its "Launching pipeline" line)
    logfile = _originals["add_task_logger"](logging_dir, rank, 1, node_rank)
    # datatrove added two sinks (terminal, file at DEBUG); keep the file, show warnings live.
    logger.remove()
    logger.add(sys.stderr, **_TERMINAL)
    logger.add(
        _guarded(logfile),
        level="DEBUG",
        format="{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <8} | {name}:{line} - {message}",
    )
    return logfile


def _close_task_logger_quiet(logfile):
    _originals["close_task_logger"](logfile)  # re-adds datatrove's INFO terminal sink ("N/M tasks completed")
    logger.remove()
    logger.add(sys.stderr, **_TERMINAL)


def quiet_task_logging() -> None:
    """In the task's own process: route datatrove's per-task logging through the two above."""
    # imported here, when a task runs: datatrove.executor.base imports datatrove.io, which imports
    # huggingface_hub and httpx (~0.3 s), and the CLI's commands that run no task never need it
    import datatrove.executor.base as dt_base

    for name in ("add_task_logger", "close_task_logger"):
        _originals.setdefault(name, getattr(dt_base, name))  # datatrove's, not ours on a second call
    dt_base.add_task_logger = _add_task_logger_quiet
    dt_base.close_task_logger = _close_task_logger_quiet


def run_rank(executor, rank: int, local_rank: int = 0):
    """Run one task of `executor` in this process (datatrove's per-rank entry: the executor's
    `_run_for_rank`, which gristmill's executors point at `gristmill.pipeline.execution.task.run_task`)."""
    return executor._run_for_rank(rank, local_rank)


def run_steps(executor, rank: int, local_rank: int = 0, node_rank: int = -1):
    """datatrove's own per-rank body (its steps, stats and completion marker), whatever the
    executor's class overrides."""
    from datatrove.executor.base import PipelineExecutor

    return PipelineExecutor._run_for_rank(executor, rank, local_rank, node_rank)


def configure_cli_logging(level: str = "WARNING") -> None:
    """The CLI's terminal logging: datatrove's import-time loguru setup, then ours over it."""
    import datatrove.utils.logging  # noqa: F401  (configures loguru on import)

    logger.remove()
    logger.add(sys.stderr, level=level, format="{level: <8} | {message}")
