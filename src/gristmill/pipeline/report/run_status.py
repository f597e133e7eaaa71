"""`pipeline status RUN_DIR`: where every stage stands, what failed, how to resume.

Read from the run directory (plan, completion files, task logs) and, for Slurm runs, from
`scontrol` about the submitted jobs. Works the same for local runs, without the job column.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gristmill.pipeline.rundir import LocalRunDir, layout


@dataclass
class StageStatus:
    label: str
    tasks: int
    completed: int
    job: str | None = None
    job_states: dict[str, int] = field(default_factory=dict)
    failed_tasks: dict[int, str] = field(default_factory=dict)  # rank → tail of its log
    state: str = ""
    query_error: str = ""  # what scontrol said instead of the job's state, if it did not answer


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _failed_tasks(folder: Path, tasks: int) -> dict[int, str]:
    """Tasks that started (a log exists) but did not complete, with the tail of their log."""
    failed = {}
    done = {p.name for p in (folder / "completions").glob("*")} if (folder / "completions").is_dir() else set()
    for rank in range(tasks):
        name = f"{rank:05d}"
        log = folder / "logs" / f"task_{name}.log"
        if name not in done and log.is_file():
            failed[rank] = _tail(log)
    return failed


def _read_states(st: StageStatus) -> None:
    """The job's state counts into `st.job_states`; where scontrol gives no answer, its error into
    `st.query_error` (the stage's state is then unknown, not read as failed from its files)."""
    from gristmill.pipeline.execution.slurm_state import SlurmQueryFailed, job_states

    try:
        st.job_states = dict(job_states(st.job))
    except SlurmQueryFailed as e:
        st.query_error = str(e)


def _unknown(st: StageStatus) -> str:
    return f"unknown: Slurm did not answer ({st.query_error}); run `pipeline status` again"


def stage_statuses(run_dir: Path) -> list[StageStatus]:
    import json

    from gristmill.pipeline.execution.slurm_state import is_active

    plan = json.loads((run_dir / "plan.json").read_text())
    jobs = LocalRunDir(run_dir).read_jobs()
    out: list[StageStatus] = []
    upstream_failed = False
    for stage in plan["stages"]:
        folder = run_dir / stage["label"]
        done = len(layout.completed_ranks(LocalRunDir(folder).entries("completions"), stage["tasks"]))
        st = StageStatus(stage["label"], stage["tasks"], done, jobs.get(stage["label"]))
        if st.job and st.job != "-1":
            _read_states(st)
        active = is_active(st.job_states)
        if st.completed >= st.tasks:
            st.state = "complete"
        elif st.query_error:
            st.state = _unknown(st)
        elif active:
            st.state = "running" if "RUNNING" in st.job_states else "pending"
            if "PENDING" in st.job_states and upstream_failed:
                st.state = "pending (upstream failed)"
        else:
            st.failed_tasks = _failed_tasks(folder, st.tasks)
            if upstream_failed and not st.failed_tasks:
                st.state = "cancelled: a stage it depends on failed"
            elif st.failed_tasks:
                st.state = f"failed: {len(st.failed_tasks)} task(s)"
            elif st.job or st.completed:
                st.state = "incomplete"
            else:
                st.state = "not started"
        if st.state.startswith(("failed", "cancelled", "incomplete")):
            upstream_failed = True
        out.append(st)
    if "train" in jobs:
        out.append(_train_status(run_dir, jobs["train"], upstream_failed))
    return out


def _train_status(run_dir: Path, job: str, upstream_failed: bool) -> StageStatus:
    from gristmill.pipeline.execution.slurm_state import is_active

    st = StageStatus("train", 1, int(LocalRunDir(run_dir).training_complete()), job)
    if job != "-1":
        _read_states(st)
    logs = sorted((run_dir / "train").glob("slurm-*.out"))
    if st.completed:
        st.state = "complete"
    elif st.query_error:
        st.state = _unknown(st)
    elif is_active(st.job_states):
        st.state = "running" if "RUNNING" in st.job_states else "pending"
    elif upstream_failed:
        st.state = "cancelled: a stage it depends on failed"
    else:
        st.state = "failed: training did not finish"
        if logs:
            st.failed_tasks = {0: _tail(logs[-1])}
    return st


def resume_command(run_dir: Path) -> str:
    argv = LocalRunDir(run_dir).read_command()
    if not argv:
        return f"pipeline run {run_dir / 'config.yaml'} --run-dir {run_dir}"
    return " ".join(shlex.quote(a) for a in argv)
