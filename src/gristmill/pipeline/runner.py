"""`pipeline run`: plan the stages, run them in order on datatrove's executor (or Ray's), merge stats."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from loguru import logger
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gristmill.config import ConfigError, RunConfig
from gristmill.core import storage
from gristmill.dirlock import hold
from gristmill.pipeline import run_dir as rd
from gristmill.pipeline.executors import TaskFailed, make_executor, make_slurm_executor
from gristmill.pipeline.planner import Stage, plan
from gristmill.pipeline.stats import funnel, merge_run, merge_stage


class StageFailed(RuntimeError):
    pass


def _run_stage(stage: Stage, console: Console, executor=None, where=None) -> None:
    """Run a stage's incomplete tasks with a progress bar. `where` counts and merges the stage's
    tasks (a local run directory's folders by default; `StoreRunDir` on object storage)."""
    executor = executor or make_executor(stage)
    where = where or _LocalStages()
    with Progress(
        TextColumn(f"[bold]{stage.label}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tasks"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task(stage.label, total=stage.tasks, completed=where.completed_tasks(stage))
        poll = lambda: progress.update(bar, completed=where.progress(stage))  # noqa: E731
        try:
            executor.run(on_poll=poll)
            error = None
        except TaskFailed as e:
            error = e
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP (Interrupted): tasks already stopped
            signum = getattr(e, "signum", signal.SIGINT)
            where.merge_stage(stage)
            progress.stop()
            console.print(
                f"[red]interrupted[/] ({signal.Signals(signum).name}) stage {stage.label}: running tasks"
                f" stopped, {where.completed_tasks(stage)} of {stage.tasks} tasks complete and kept."
                " Re-run the same command to finish the missing tasks."
            )
            raise SystemExit(128 + signum) from None
        poll()
    if error or where.completed_tasks(stage) < stage.tasks:
        try:
            where.merge_stage(stage)
        except OSError as e:  # the same full disk, say: the task's error is the one to report
            logger.warning(f"stats of {stage.label} not merged: {e}")
        done = where.completed_tasks(stage)
        raise StageFailed(
            f"stage {stage.label}: {error or 'a task did not complete; logs: ' + where.logs(stage)}."
            f" {stage.tasks - done} of {stage.tasks} tasks did not complete;"
            " re-run the same command to finish the missing tasks."
        )


class _LocalStages:
    """A local run directory's stage folders, as `_run_stage` reads them."""

    def completed_tasks(self, stage: Stage) -> int:
        return rd.completed_tasks(stage.folder)

    def progress(self, stage: Stage) -> int:
        """The completed tasks for the progress bar (polled four times a second)."""
        return rd.completed_tasks(stage.folder)

    def merge_stage(self, stage: Stage) -> None:
        merge_stage(stage.folder)

    def logs(self, stage: Stage) -> str:
        return str(stage.folder / "logs")


def submit_slurm(cfg: RunConfig, stages: list[Stage], console: Console) -> dict[str, str]:
    """Submit every stage as a job array, chained by afterok; returns job ids by stage label."""
    executors = []
    for stage in stages:
        executors.append(make_slurm_executor(stage, cfg.executor.slurm, executors[-1] if executors else None))
    executors[-1].run()  # datatrove submits the dependencies first, in order
    jobs = {stage.label: str(ex.job_id) for stage, ex in zip(stages, executors)}
    if cfg.train is not None:
        run_dir = Path(cfg.run_dir)
        if rd.training_complete(run_dir):
            jobs["train"] = "-1"
        else:
            from gristmill.pipeline.slurm_train import submit_training

            last = jobs[stages[-1].label]
            jobs["train"] = submit_training(cfg, run_dir, None if last == "-1" else last)
    rd.write_jobs(Path(cfg.run_dir), jobs)
    for label, job in jobs.items():
        console.print(
            f"{label}: "
            + ("already complete" if job == "-1" else f"submitted as Slurm job{'s' if ':' in job else ''} {job}")
        )
    return jobs


def follow_slurm(run_dir: Path, stages: list[Stage], jobs: dict[str, str], console: Console) -> None:
    """`--wait`: progress per stage until the chain's jobs have left the queue."""
    from gristmill.pipeline.slurm_state import wait_until_gone

    with Progress(
        TextColumn("[bold]{task.description}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tasks"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bars = {s.label: progress.add_task(s.label, total=s.tasks) for s in stages}

        def poll():
            for s in stages:
                progress.update(bars[s.label], completed=rd.completed_tasks(s.folder))

        wait_until_gone([j for j in jobs.values() if j != "-1"], on_poll=poll)
        poll()


def run(
    cfg: RunConfig,
    force: bool = False,
    console: Console | None = None,
    wait: bool = False,
    command: list[str] | None = None,
    force_lock: str | None = None,
) -> dict:
    """Run (local) or submit (Slurm; `wait` follows the jobs to the end) every stage of `cfg`.

    `command` is the argv that started the run; `pipeline status` shows it as the way to resume.
    `force_lock` names the holder of a run directory on object storage whose lock to take over.
    """
    console = console or Console(stderr=True)
    storage.configure(cfg.storage)
    if storage.is_url(cfg.run_dir):  # on object storage: gristmill.pipeline.store_run
        from gristmill.pipeline.store_run import run_on_store

        return run_on_store(cfg, force, console, command, force_lock, run_stage=_run_stage, summary=_summary)
    if force_lock is not None:
        raise ConfigError(
            f"--force-lock: {cfg.run_dir} is a local run directory, locked with flock, which the kernel "
            "releases when its holder dies: there is no lock to take over"
        )
    run_dir = Path(cfg.run_dir)
    rd.check_location(run_dir)  # refuse `/`, $HOME, a foreign directory: before anything is created
    stages = plan(cfg)  # validates sources and models before the run directory is touched
    # Held to the end (training included): a second command on this directory stops at once.
    with hold(run_dir, "run directory"):
        if cfg.executor.type != "ray":
            return _run_locked(cfg, stages, run_dir, force, console, wait, command)
        from gristmill.pipeline.ray_executor import RayCluster

        # Connected once, before anything is written: an unreachable cluster is one line.
        with RayCluster(cfg, stages) as cluster:
            return _run_locked(cfg, stages, run_dir, force, console, wait, command, make=cluster.executor)


def _run_locked(
    cfg: RunConfig,
    stages: list[Stage],
    run_dir: Path,
    force: bool,
    console: Console,
    wait: bool,
    command: list[str] | None,
    make=make_executor,
) -> dict:
    resumed = rd.prepare(run_dir, cfg.resolved(), force)
    rd.write_plan(run_dir, stages)
    if command:
        rd.write_command(run_dir, command)
    if resumed:
        console.print(f"resuming {run_dir}: completed tasks are kept")
    started = time.perf_counter()
    if cfg.executor.type == "slurm":
        jobs = submit_slurm(cfg, stages, console)
        if not wait:
            console.print(f"follow with: pipeline status {run_dir}")
            return merge_run(run_dir)
        follow_slurm(run_dir, stages, jobs, console)
        merged = merge_run(run_dir)
        missing = [s for s in stages if rd.completed_tasks(s.folder) < s.tasks]
        if not missing and cfg.train is not None and not rd.training_complete(run_dir):
            raise StageFailed(f"train: did not finish; see `pipeline status {run_dir}`")
        if missing:
            raise StageFailed(
                f"stage {missing[0].label}: {missing[0].tasks - rd.completed_tasks(missing[0].folder)}"
                f" of {missing[0].tasks} tasks did not complete; see `pipeline status {run_dir}`"
            )
        _summary(merged, run_dir, started, console)
        return merged
    try:
        for stage in stages:
            if rd.completed_tasks(stage.folder) >= stage.tasks:
                console.print(f"{stage.label}: all {stage.tasks} tasks already complete")
            else:
                _run_stage(stage, console, make(stage))
            merge_stage(stage.folder)
    except BaseException:
        # Keep the stats of what completed, but never let a second failure (the same full
        # disk, say) replace the error the user needs to see.
        try:
            merge_run(run_dir)
        except Exception as merge_error:  # noqa: BLE001
            logger.warning(f"stats of {run_dir} not merged: {merge_error}")
        raise
    merged = merge_run(run_dir)
    _summary(merged, run_dir, started, console)
    if cfg.train is not None:  # train on <run_dir>/tokens/ into <run_dir>/train/ (resumes if there)
        from gristmill.trainer.launch import EXIT_INPUT, after_pipeline

        code = after_pipeline(cfg.train, run_dir, console)
        if code == EXIT_INPUT:  # the token shards or a checkpoint cannot be used: re-running will not help
            raise StageFailed("train: stopped before training on unusable input; see the line above.")
        if code:
            raise StageFailed(
                f"train: exited with code {code}; see above. Re-run the same command to resume"
                f" from the last checkpoint in {run_dir / 'train' / 'checkpoints'}."
            )
    return merged


def _summary(merged: dict, run_dir: Path, started: float, console: Console) -> None:
    rows = funnel(merged)
    read = next((r for r in rows if r.kind == "reader"), None)
    written = [r for r in rows if r.kind == "writer"]
    if read and written:
        out = written[-1]
        share = out.docs_out / read.docs_out if read.docs_out else 0.0
        console.print(
            f"[bold green]done[/] {run_dir}: {read.docs_out:,} documents read, {out.docs_out:,} kept"
            f" ({share:.1%}), {out.bytes_out / 1e6:.1f} MB written in {time.perf_counter() - started:.1f} s"
        )
