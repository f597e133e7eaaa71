"""The pipeline as Slurm job arrays on a real one-node cluster (../shared/tools/slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gristmill.config import from_dict
from gristmill.core.parquet_io import FAIL_TASK_ENV
from gristmill.pipeline.runner import StageFailed, run
from gristmill.pipeline.status import stage_statuses

from . import test_planner  # noqa: F401  (defines and registers the `keep_longest` step)

# one cluster: under xdist (`--dist loadgroup`) every Slurm test runs on one worker, one at a time
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm_cluster(shared_data):
    script = shared_data.parent / "tools" / "slurm" / "start-local-slurm.sh"
    if not script.is_file():
        pytest.fail(f"{script} missing") if os.environ.get("GRISTMILL_REQUIRE_DATA") == "1" else pytest.skip(
            f"{script} missing"
        )
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster runs as root")
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"could not start Slurm: {res.stderr[-2000:]}"
    return "debug"


def _cfg(run_dir, wet_files, lid_model, executor, steps=None):
    return from_dict(
        {
            "run_dir": str(run_dir),
            "executor": executor,
            "input": {"paths": [str(p) for p in wet_files]},
            "steps": steps
            or [{"langid": {"model": str(lid_model)}}, "gopher_quality", "gopher_repetition", "c4_lines"],
            "output": {"dropped_sample": 0.5},
        }
    )


def _outputs(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.parquet"))}


SLURM = {"type": "slurm", "tasks": 2, "slurm": {"partition": "debug", "time": "00:10:00", "mem_per_cpu_gb": 1}}


def test_slurm_run_equals_local_run(tmp_path, wet_files, lid_model, slurm_cluster):
    run(_cfg(tmp_path / "local", wet_files, lid_model, {"type": "local", "tasks": 2, "workers": 2}))
    run(_cfg(tmp_path / "slurm", wet_files, lid_model, SLURM), wait=True)
    jobs = json.loads((tmp_path / "slurm" / "slurm_jobs.json").read_text())
    assert list(jobs) == ["01_curate"] and jobs["01_curate"].isdigit()
    assert (tmp_path / "slurm" / "01_curate" / "slurm_logs").is_dir()
    local, slurm = _outputs(tmp_path / "local" / "01_curate"), _outputs(tmp_path / "slurm" / "01_curate")
    assert local and local == slurm
    assert [s.state for s in stage_statuses(tmp_path / "slurm")] == ["complete"]


def test_failed_task_cancels_downstream_and_rerun_finishes_only_it(
    tmp_path, wet_files, lid_model, slurm_cluster, monkeypatch
):
    steps = [{"langid": {"model": str(lid_model), "languages": None}}, "keep_longest", "c4_lines"]
    cfg = _cfg(tmp_path / "run", wet_files, lid_model, SLURM, steps)
    # the jobs unpickle the test's global step: make the repo importable there (sbatch exports env)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(FAIL_TASK_ENV, "1")
    with pytest.raises(StageFailed):
        run(cfg, wait=True)
    statuses = {s.label: s for s in stage_statuses(tmp_path / "run")}
    assert statuses["01_curate"].completed == 1
    assert statuses["01_curate"].state == "failed: 1 task(s)"
    assert "injected failure of task 1" in statuses["01_curate"].failed_tasks[1]
    assert statuses["02_keep_longest"].state.startswith("cancelled")
    assert statuses["03_filter"].state.startswith("cancelled")
    out = subprocess.run(
        [sys.executable, "-m", "gristmill.cli", "status", str(tmp_path / "run")], capture_output=True, text=True
    )
    assert out.returncode == 1 and "injected failure" in out.stdout and "resume with:" in out.stdout

    task0 = (tmp_path / "run" / "01_curate" / "output" / "00000.parquet").stat().st_mtime_ns
    monkeypatch.delenv(FAIL_TASK_ENV)
    merged = run(cfg, wait=True)
    ranks = json.loads((tmp_path / "run" / "01_curate" / "ranks_to_run.json").read_text())
    assert ranks == [1]  # only the failed task was resubmitted
    assert (tmp_path / "run" / "01_curate" / "output" / "00000.parquet").stat().st_mtime_ns == task0
    assert [s.state for s in stage_statuses(tmp_path / "run")] == ["complete"] * 3
    # and the result equals an uninterrupted local run
    local_cfg = _cfg(tmp_path / "local", wet_files, lid_model, {"type": "local", "tasks": 2, "workers": 1}, steps)
    local = run(local_cfg)
    for stage in ("01_curate", "02_keep_longest", "03_filter"):
        assert _outputs(tmp_path / "run" / stage) == _outputs(tmp_path / "local" / stage), stage
    assert [s["tasks_completed"] for s in merged["stages"]] == [s["tasks_completed"] for s in local["stages"]]


def _wait_for(predicate, timeout=300, poll=1.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


def _release_requeue_hold(job: str) -> None:
    """A requeued job may start again only after Slurm's credential lifetime (slurm.conf
    `AuthInfo=cred_expire`, 120 s by default): let it start now. The test is about the job
    requeueing itself and resuming, not about the cluster's hold."""
    state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True).stdout.split()
    if state == ["PENDING", "BeginTime"]:
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)


def test_training_job_resumes_after_scancel_and_after_preemption(tmp_path, wet_files, lid_model, slurm_cluster):
    """curate → tokenize → 2 CPU processes under `srun torchrun`: killed and resubmitted, then
    preempted (SIGUSR1: checkpoint, requeue); each time it resumes from its last checkpoint."""
    from gristmill.pipeline import run_dir as rd
    from gristmill.pipeline.slurm_state import wait_until_gone

    run_dir = tmp_path / "run"
    cfg = from_dict(
        {
            "run_dir": str(run_dir),
            "executor": SLURM,
            "input": {"paths": [str(p) for p in wet_files]},
            "steps": [{"langid": {"model": str(lid_model)}}],
            "output": {"dropped_sample": 0},
            "tokenize": {"tokenizer": {"train": {"vocab_size": 1024}}, "shard_tokens": 100000, "val_fraction": 0.05},
            "train": {
                "preset": "tiny",
                "steps": 80,
                "nproc": 2,
                "preempt_grace_s": 10,
                "set": ["checkpoint.every=5", "checkpoint.keep=50", "log.progress=false", "log.tensorboard=false"],
            },
        }
    )
    ckpts = run_dir / "train" / "checkpoints"

    def saved_steps() -> list[int]:  # finished checkpoints (a `.tmp` one is being written)
        return [int(p.name[5:]) for p in ckpts.glob("step-*") if p.name[5:].isdigit()]

    run(cfg)  # submit and return
    first = rd.read_jobs(run_dir)["train"]
    assert _wait_for(lambda: ckpts.is_dir() and saved_steps(), timeout=600)
    subprocess.run(["scancel", first], check=True)
    wait_until_gone([first])
    assert not rd.training_complete(run_dir)
    killed_at = max(saved_steps())
    assert killed_at < 80
    assert [s.state for s in stage_statuses(run_dir)][-1] == "failed: training did not finish"

    run(cfg)  # resubmits the training job only: the data stages are complete
    jobs = rd.read_jobs(run_dir)
    assert [jobs[k] for k in jobs if k != "train"] == ["-1"] * (len(jobs) - 1)
    second = jobs["train"]
    log = run_dir / "train" / f"slurm-{second}.out"
    assert _wait_for(lambda: log.is_file() and "resumed from" in log.read_text(), timeout=300)
    assert _wait_for(lambda: max(saved_steps()) > killed_at + 5)
    subprocess.run(["scancel", "--signal=USR1", "--batch", second], check=True)
    wait_until_gone([second], poll_s=1, on_poll=lambda: _release_requeue_hold(second))
    text = log.read_text()
    assert "SIGUSR1: checkpoint and requeue" in text and "preempted: checkpoint of step" in text
    assert "(restart 1)" in text and text.count("resumed from") == 2
    assert rd.training_complete(run_dir)
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    assert summary["steps"] == 80
    assert [s.state for s in stage_statuses(run_dir)][-1] == "complete"
