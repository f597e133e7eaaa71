"""`pipeline run`: plan the stages, run them in order on an executor in a run directory, merge stats."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from loguru import logger
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gristmill.config import RunConfig
from gristmill.pipeline.execution.executors import TaskFailed, make_executor, make_slurm_executor
from gristmill.pipeline.planning.planner import Stage, plan
from gristmill.pipeline.report.journey import funnel
from gristmill.pipeline.rundir import RunDir, open_run_dir


class StageFailed(RuntimeError):
    pass


def _run_stage(stage: Stage, console: Console, executor, run_dir: RunDir) -> None:
    """Run a stage's incomplete tasks with a progress bar; `run_dir` counts and merges them."""
    with Progress(
        TextColumn(f"[bold]{stage.label}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tasks"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task(stage.label, total=stage.tasks, completed=run_dir.completed_tasks(stage))
        poll = lambda: progress.update(bar, completed=run_dir.progress(stage))  # noqa: E731
        try:
            executor.run(on_poll=poll)
            error = None
        except TaskFailed as e:
            error = e
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP (Interrupted): tasks already stopped
            signum = getattr(e, "signum", signal.SIGINT)
            run_dir.merge_stage(stage)
            progress.stop()
            console.print(
                f"[red]interrupted[/] ({signal.Signals(signum).name}) stage {stage.label}: running tasks"
                f" stopped, {run_dir.completed_tasks(stage)} of {stage.tasks} tasks complete and kept."
                " Re-run the same command to finish the missing tasks."
            )
            raise SystemExit(128 + signum) from None
        poll()
    if error or run_dir.completed_tasks(stage) < stage.tasks:
        try:
            run_dir.merge_stage(stage)
        except OSError as e:  # the same full disk, say: the task's error is the one to report
            logger.warning(f"stats of {stage.label} not merged: {e}")
        done = run_dir.completed_tasks(stage)
        raise StageFailed(
            f"stage {stage.label}: {error or 'a task did not complete; logs: ' + run_dir.logs(stage)}."
            f" {stage.tasks - done} of {stage.tasks} tasks did not complete;"
            " re-run the same command to finish the missing tasks."
        )


def submit_slurm(cfg: RunConfig, stages: list[Stage], run_dir: RunDir, console: Console) -> dict[str, str]:
    """Submit every stage as a job array, chained by afterok; returns job ids by stage label."""
    executors = []
    for stage in stages:
        executors.append(make_slurm_executor(stage, cfg.executor.slurm, executors[-1] if executors else None))
    executors[-1].run()  # datatrove submits the dependencies first, in order
    jobs = {stage.label: str(ex.job_id) for stage, ex in zip(stages, executors)}
    if cfg.train is not None:
        if run_dir.training_complete():
            jobs["train"] = "-1"
        else:
            from gristmill.pipeline.execution.slurm_train import submit_training

            last = jobs[stages[-1].label]
            jobs["train"] = submit_training(cfg, Path(cfg.run_dir), None if last == "-1" else last)
    run_dir.write_jobs(jobs)
    for label, job in jobs.items():
        console.print(
            f"{label}: "
            + ("already complete" if job == "-1" else f"submitted as Slurm job{'s' if ':' in job else ''} {job}")
        )
    return jobs


def follow_slurm(run_dir: RunDir, stages: list[Stage], jobs: dict[str, str], console: Console) -> None:
    """`--wait`: progress per stage until the chain's jobs have left the queue."""
    from gristmill.pipeline.execution.slurm_state import wait_until_gone

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
                progress.update(bars[s.label], completed=run_dir.completed_tasks(s))

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
    """Run (local, Ray) or submit (Slurm; `wait` follows the jobs to the end) every stage of `cfg`,
    in a run directory wherever it is (`gristmill.pipeline.rundir`).

    `command` is the argv that started the run; `pipeline status` shows it as the way to resume.
    `force_lock` names the holder of a run directory on object storage whose lock to take over.
    """
    console = console or Console(stderr=True)
    run_dir = open_run_dir(cfg.run_dir, cfg.storage)
    run_dir.check_location()  # refuse `/`, $HOME, a foreign directory, a missing bucket: before anything is created
    stages = plan(cfg)  # validates sources and models before the run directory is touched
    run_dir.check_plan(cfg, stages)
    # Held to the end (training included): a second command on this directory stops at once.
    with run_dir.lock(cfg, command, force_lock):
        if cfg.executor.type != "ray":
            return _run_locked(cfg, stages, run_dir, force, console, wait, command)
        from gristmill.pipeline.execution.ray import RayCluster

        # Connected once, before anything is written: an unreachable cluster is one line.
        with RayCluster(cfg, stages) as cluster:
            make = lambda stage, binding: cluster.executor(stage)  # noqa: E731 - Ray tasks write in place
            return _run_locked(cfg, stages, run_dir, force, console, wait, command, make=make)


def _run_locked(
    cfg: RunConfig,
    stages: list[Stage],
    run_dir: RunDir,
    force: bool,
    console: Console,
    wait: bool,
    command: list[str] | None,
    make=None,
) -> dict:
    """The one stage loop, against any run directory and executor."""
    resumed = run_dir.prepare(cfg, force, stages[0].inputs if stages else None)
    run_dir.write_plan(stages)
    if command:
        run_dir.write_command(command)
    if resumed:
        console.print(f"resuming {run_dir}: completed tasks are kept")
    started = time.perf_counter()
    if cfg.executor.type == "slurm":
        return _submitted(cfg, stages, run_dir, console, wait, started)
    make = make or make_executor
    try:
        for stage in stages:
            if run_dir.completed_tasks(stage) >= stage.tasks:
                console.print(f"{stage.label}: all {stage.tasks} tasks already complete")
            else:
                _run_stage(stage, console, make(stage, run_dir.binding(stage)), run_dir)
            run_dir.merge_stage(stage)
    except BaseException:
        # Keep the stats of what completed, but never let a second failure (the same full
        # disk, say) replace the error the user needs to see.
        try:
            run_dir.merge_run(stages)
        except Exception as merge_error:  # noqa: BLE001
            logger.warning(f"stats of {run_dir} not merged: {merge_error}")
        raise
    merged = run_dir.merge_run(stages)
    _summary(merged, run_dir, started, console)
    if cfg.train is not None:  # train on <run_dir>/tokens/ into <run_dir>/train/ (resumes if there)
        from gristmill.trainer.launch import EXIT_INPUT, after_pipeline

        local = Path(cfg.run_dir)  # a run directory on a store refuses `train:` (StoreRunDir.refusals)
        code = after_pipeline(cfg.train, local, console)
        if code == EXIT_INPUT:  # the token shards or a checkpoint cannot be used: re-running will not help
            raise StageFailed("train: stopped before training on unusable input; see the line above.")
        if code:
            raise StageFailed(
                f"train: exited with code {code}; see above. Re-run the same command to resume"
                f" from the last checkpoint in {local / 'train' / 'checkpoints'}."
            )
    return merged


def _submitted(cfg: RunConfig, stages: list[Stage], run_dir: RunDir, console: Console, wait: bool, started) -> dict:
    """Slurm: every stage submitted at once as chained job arrays; `wait` follows them to the end."""
    jobs = submit_slurm(cfg, stages, run_dir, console)
    if not wait:
        console.print(f"follow with: pipeline status {run_dir}")
        return run_dir.merge_run(stages)
    follow_slurm(run_dir, stages, jobs, console)
    merged = run_dir.merge_run(stages)
    missing = [s for s in stages if run_dir.completed_tasks(s) < s.tasks]
    if not missing and cfg.train is not None and not run_dir.training_complete():
        raise StageFailed(f"train: did not finish; see `pipeline status {run_dir}`")
    if missing:
        raise StageFailed(
            f"stage {missing[0].label}: {missing[0].tasks - run_dir.completed_tasks(missing[0])}"
            f" of {missing[0].tasks} tasks did not complete; see `pipeline status {run_dir}`"
        )
    _summary(merged, run_dir, started, console)
    return merged


def _summary(merged: dict, run_dir: RunDir, started: float, console: Console) -> None:
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
