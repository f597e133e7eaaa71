"""datatrove's executors, as gristmill runs them.

The only change to `LocalPipelineExecutor` is where task logs go: datatrove prints every
task's INFO log to the terminal, which buries the progress bar; we keep INFO and below in
each task's log file (`<stage>/logs/task_NNNNN.log`) and show warnings and errors live.
"""

from __future__ import annotations

import sys

import datatrove.executor.base as dt_base
from datatrove.executor.local import LocalPipelineExecutor
from loguru import logger

from gristmill.pipeline.planner import Stage

_original_add_task_logger = dt_base.add_task_logger


def _add_task_logger_quiet(logging_dir, rank, local_rank=0, node_rank=-1):
    logfile = _original_add_task_logger(logging_dir, rank, local_rank, node_rank)
    # datatrove added two sinks (terminal at INFO, file at DEBUG); drop to WARNING on the terminal.
    logger.remove()
    logger.add(sys.stderr, level="WARNING", format="{level: <8} | task {extra[rank]} | {message}")
    logger.add(logfile, level="DEBUG", format="{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <8} | {name}:{line} - {message}")
    logger.configure(extra={"rank": rank})
    return logfile


class LocalExecutor(LocalPipelineExecutor):
    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        dt_base.add_task_logger = _add_task_logger_quiet  # in the task's own process
        return super()._run_for_rank(rank, local_rank, node_rank)


def make_executor(stage: Stage) -> LocalPipelineExecutor:
    return LocalExecutor(
        pipeline=stage.pipeline,
        tasks=stage.tasks,
        workers=stage.workers,
        logging_dir=str(stage.folder),
        skip_completed=True,
    )
