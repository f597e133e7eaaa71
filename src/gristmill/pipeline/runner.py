"""`pipeline run`: plan the stages, run them in order on datatrove's executor, merge stats."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gristmill.config import RunConfig
from gristmill.pipeline import run_dir as rd
from gristmill.pipeline.executors import make_executor
from gristmill.pipeline.planner import Stage, plan
from gristmill.pipeline.stats import funnel, merge_run, merge_stage


class StageFailed(RuntimeError):
    pass


def _run_stage(stage: Stage, console: Console) -> None:
    executor = make_executor(stage)
    error: list[BaseException] = []

    def target():
        try:
            executor.run()
        except BaseException as e:  # reported in the main thread
            error.append(e)

    worker = threading.Thread(target=target, daemon=True)
    with Progress(
        TextColumn(f"[bold]{stage.label}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tasks"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task(stage.label, total=stage.tasks, completed=rd.completed_tasks(stage.folder))
        worker.start()
        while worker.is_alive():
            worker.join(0.25)
            progress.update(bar, completed=rd.completed_tasks(stage.folder))
        progress.update(bar, completed=rd.completed_tasks(stage.folder))
    if error or rd.completed_tasks(stage.folder) < stage.tasks:
        merge_stage(stage.folder)
        done = rd.completed_tasks(stage.folder)
        raise StageFailed(
            f"stage {stage.label}: {stage.tasks - done} of {stage.tasks} tasks did not complete"
            f" ({error[0] if error else 'see logs'}); logs: {stage.folder / 'logs'}."
            " Re-run the same command to finish the missing tasks."
        )


def run(cfg: RunConfig, force: bool = False, console: Console | None = None) -> dict:
    console = console or Console(stderr=True)
    run_dir = Path(cfg.run_dir)
    stages = plan(cfg)  # validates sources and models before the run directory is touched
    resumed = rd.prepare(run_dir, cfg.resolved(), force)
    rd.write_plan(run_dir, stages)
    if resumed:
        console.print(f"resuming {run_dir}: completed tasks are kept")
    started = time.perf_counter()
    try:
        for stage in stages:
            if rd.completed_tasks(stage.folder) >= stage.tasks:
                console.print(f"{stage.label}: all {stage.tasks} tasks already complete")
            else:
                _run_stage(stage, console)
            merge_stage(stage.folder)
    finally:
        merged = merge_run(run_dir)
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
    return merged
