"""datatrove's executors, as gristmill runs them.

Local: the only change to `LocalPipelineExecutor` is where task logs go: datatrove prints every
task's INFO log to the terminal, which buries the progress bar; we keep INFO and below in
each task's log file (`<stage>/logs/task_NNNNN.log`) and show warnings and errors live.

Slurm: `SlurmPipelineExecutor` per stage, each a job array depending (afterok) on the stage
before, so a failed task cancels everything downstream. datatrove's extra merge-stats job per
stage is not submitted: `pipeline status`/`stats` merge the per-task files themselves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import datatrove.executor.base as dt_base
from datatrove.executor.local import LocalPipelineExecutor
from datatrove.executor.slurm import SlurmPipelineExecutor
from loguru import logger

from gristmill.config import SlurmConfig
from gristmill.pipeline.planner import Stage

_original_add_task_logger = dt_base.add_task_logger
_original_close_task_logger = dt_base.close_task_logger
_TERMINAL = {"level": "WARNING", "format": "{level: <8} | {message}"}


def _add_task_logger_quiet(logging_dir, rank, local_rank=0, node_rank=-1):
    # local_rank=1 makes datatrove's own terminal sink ERROR-only (its "Launching pipeline" line)
    logfile = _original_add_task_logger(logging_dir, rank, 1, node_rank)
    # datatrove added two sinks (terminal, file at DEBUG); keep the file, show warnings live.
    logger.remove()
    logger.add(sys.stderr, **_TERMINAL)
    logger.add(logfile, level="DEBUG", format="{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <8} | {name}:{line} - {message}")
    return logfile


def _close_task_logger_quiet(logfile):
    _original_close_task_logger(logfile)  # re-adds datatrove's INFO terminal sink ("N/M tasks completed")
    logger.remove()
    logger.add(sys.stderr, **_TERMINAL)


def _quiet_task_logging() -> None:
    """In the task's own process: route datatrove's per-task logging through the two above."""
    dt_base.add_task_logger = _add_task_logger_quiet
    dt_base.close_task_logger = _close_task_logger_quiet


class LocalExecutor(LocalPipelineExecutor):
    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        _quiet_task_logging()
        return super()._run_for_rank(rank, local_rank, node_rank)


def make_executor(stage: Stage) -> LocalPipelineExecutor:
    return LocalExecutor(
        pipeline=stage.pipeline,
        tasks=stage.tasks,
        workers=stage.workers,
        logging_dir=str(stage.folder),
        skip_completed=True,
    )


class SlurmExecutor(SlurmPipelineExecutor):
    def launch_merge_stats(self):
        pass  # merged from the per-task stats files by gristmill instead

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        _quiet_task_logging()
        return super()._run_for_rank(rank, local_rank, node_rank)


def default_venv_activate() -> str | None:
    activate = Path(sys.prefix) / "bin" / "activate"
    return str(activate) if activate.is_file() else None


def make_slurm_executor(stage: Stage, slurm: SlurmConfig, depends: SlurmExecutor | None) -> SlurmExecutor:
    over = slurm.stages.get(stage.name)
    cpus = (over and over.cpus_per_task) or slurm.cpus_per_task
    mem_gb = (over and over.mem_per_cpu_gb) or slurm.mem_per_cpu_gb
    sbatch = dict(slurm.sbatch_args)
    # datatrove writes `--mem-per-cpu={gb}G`, which takes only whole gigabytes; MB is exact.
    sbatch.setdefault("mem-per-cpu", f"{int(mem_gb * 1024)}M")
    if slurm.account:
        sbatch.setdefault("account", slurm.account)
    return SlurmExecutor(
        pipeline=stage.pipeline,
        tasks=stage.tasks,
        time=(over and over.time) or slurm.time,
        partition=slurm.partition,
        cpus_per_task=cpus,
        job_name=f"{slurm.job_name_prefix}-{stage.name}",
        qos=slurm.qos or "",
        env_command=slurm.env_command,
        venv_path=None if slurm.env_command else (slurm.venv_path or default_venv_activate()),
        sbatch_args=sbatch,
        max_array_size=slurm.max_array_size,
        depends=depends,
        logging_dir=str(stage.folder),
        slurm_logs_folder=str(stage.folder / "slurm_logs"),
        skip_completed=True,
        requeue=slurm.requeue,
        mail_type="NONE",
    )
