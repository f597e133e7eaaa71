"""The pipeline as Slurm job arrays on a real one-node cluster (../shared/tools/slurm)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from gristmill.config import from_dict
from gristmill.pipeline.execution.executors import cluster_array_limit
from gristmill.pipeline.report.run_status import stage_statuses
from gristmill.pipeline.runner import StageFailed, run
from tests.cli_process import pipeline
from tests.faults import FAIL_TASK_ENV

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
    # every Slurm test runs on a cluster of small job arrays, so that a stage of 3 tasks is
    # several arrays, as a 4,000-task stage is on a cluster of MaxArraySize=1001
    env = {**os.environ, "SLURM_LOCAL_MAX_ARRAY_SIZE": str(MAX_ARRAY_SIZE)}
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, f"could not start Slurm: {res.stderr[-2000:]}"
    if cluster_array_limit() != MAX_ARRAY_SIZE:  # running since before, with another MaxArraySize
        _restart_when_idle(script, env)
    return "debug"


MAX_ARRAY_SIZE = 2  # the smallest that makes a stage of 3 tasks two arrays, one full and one not


def _restart_when_idle(script: Path, env: dict) -> None:
    """slurmctld reads MaxArraySize when it starts (`scontrol reconfigure` reports the new value
    but still takes arrays of the old size); stopping cancels every job, so wait for an empty
    queue first: the cluster is shared by whoever runs Slurm tests on this machine."""
    assert _wait_for(
        lambda: not subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip(), 600, poll=2.0
    )
    stop = script.with_name("stop-local-slurm.sh")
    subprocess.run(["bash", str(stop)], capture_output=True, text=True, timeout=300, check=True)
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, f"could not restart Slurm: {res.stderr[-2000:]}"
    assert cluster_array_limit() == MAX_ARRAY_SIZE


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
    out = pipeline("status", str(tmp_path / "run"))
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


def _wait_for(predicate, timeout=300, poll=0.25):
    """True once `predicate()` is, polled every `poll` seconds: a step of the test follows the
    job within a quarter second of what it waits for (a checkpoint, a line of its log)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


def _release_requeue_hold(job: str, released: set[str]) -> None:
    """A requeued job may start again only after Slurm's credential lifetime (slurm.conf
    `AuthInfo=cred_expire`, 120 s by default): let it start in 3 s instead, once (`released`).
    The test is about the job requeueing itself and resuming, not about the cluster's hold. Not
    at once: slurmd refuses a credential issued in the second its job's old one was revoked
    ("Job credential revoked", and the job fails), which a start within the same second met."""
    state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True).stdout.split()
    if state == ["PENDING", "BeginTime"] and job not in released:
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+3"], capture_output=True, check=True)
        released.add(job)


def test_training_job_resumes_after_scancel_and_after_preemption(tmp_path, wet_files, lid_model, slurm_cluster):
    """curate → tokenize → 2 CPU processes under `srun torchrun`: killed and resubmitted, then
    preempted (SIGUSR1: checkpoint, requeue); each time it resumes from its last checkpoint."""
    from gristmill.pipeline.execution.slurm_state import wait_until_gone
    from gristmill.pipeline.rundir import LocalRunDir

    # a checkpoint every 5 steps, the kill after the first, the preemption a checkpoint or two
    # after the resume (near step 17): 50 steps leave the signal some 30 steps to arrive in
    train_steps = 50
    run_dir = tmp_path / "run"
    cfg = from_dict(
        {
            "run_dir": str(run_dir),
            # one task a stage: here the data stages only feed the training job (their arrays
            # of several tasks are the other tests'), and each task is a job of its own
            "executor": {**SLURM, "tasks": 1},
            "input": {"paths": [str(p) for p in wet_files]},
            "steps": [{"langid": {"model": str(lid_model)}}],
            "output": {"dropped_sample": 0},
            "tokenize": {"tokenizer": {"train": {"vocab_size": 1024}}, "shard_tokens": 100000, "val_fraction": 0.05},
            "train": {
                "preset": "tiny",
                "steps": train_steps,
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
    first = LocalRunDir(run_dir).read_jobs()["train"]
    assert _wait_for(lambda: ckpts.is_dir() and saved_steps(), timeout=600)
    subprocess.run(["scancel", first], check=True)
    wait_until_gone([first], poll_s=0.25)
    assert not LocalRunDir(run_dir).training_complete()
    killed_at = max(saved_steps())
    assert killed_at < train_steps
    assert [s.state for s in stage_statuses(run_dir)][-1] == "failed: training did not finish"

    run(cfg)  # resubmits the training job only: the data stages are complete
    jobs = LocalRunDir(run_dir).read_jobs()
    assert [jobs[k] for k in jobs if k != "train"] == ["-1"] * (len(jobs) - 1)
    second = jobs["train"]
    log = run_dir / "train" / f"slurm-{second}.out"
    assert _wait_for(lambda: log.is_file() and "resumed from" in log.read_text(), timeout=300)
    assert _wait_for(lambda: max(saved_steps()) > killed_at + 5)
    subprocess.run(["scancel", "--signal=USR1", "--batch", second], check=True)
    released: set[str] = set()
    wait_until_gone([second], poll_s=0.25, on_poll=lambda: _release_requeue_hold(second, released))
    text = log.read_text()
    assert "SIGUSR1: checkpoint and requeue" in text and "preempted: checkpoint of step" in text
    assert "(restart 1)" in text and text.count("resumed from") == 2
    assert LocalRunDir(run_dir).training_complete()
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    assert summary["steps"] == train_steps
    assert [s.state for s in stage_statuses(run_dir)][-1] == "complete"


# --- stages wider than one job array -------------------------------------------------------------


def _wide_cfg(run_dir, wet_files, lid_model, executor):
    """curate (2 tasks: one per WET file) → exact dedup's hash, find and filter stages, each of
    `executor.tasks`: three wide stages in a chain, each depending on the one before."""
    steps = [{"langid": {"model": str(lid_model), "languages": None}}, {"exact_dedup": {"capacity": 100_000}}]
    return _cfg(run_dir, wet_files, lid_model, executor, steps)


def _job(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out.splitlines()[0]))


@pytest.fixture
def cancel_jobs_of(tmp_path):
    """Runs whose jobs are cancelled when the test ends, passed or failed: the cluster is shared."""
    runs: list[Path] = []
    yield runs.append
    ids = []
    for r in runs:
        if (r / "slurm_jobs.json").is_file():
            ids += [j for v in json.loads((r / "slurm_jobs.json").read_text()).values() for j in v.split(":")]
    ids = [j for j in ids if j != "-1"]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def test_wide_stage_is_several_arrays_each_waited_on_and_resumed(
    tmp_path, wet_files, lid_model, slurm_cluster, cancel_jobs_of
):
    """3 tasks a stage on a cluster of MaxArraySize 2 (the config says 1001: the cluster's limit
    wins): arrays of 2 and 1 tasks, submitted side by side; the next stage waits afterok on
    both. One task of the first array cancelled: everything after it is cancelled (afterok
    on the last array alone would have let it run), and a re-run submits that one task and the
    stages after it; the result equals a local run. Two arrays, one full and one not, are the
    smallest wide stage: every task is a Slurm job here and a local task in the reference run."""
    tasks = MAX_ARRAY_SIZE + 1
    executor = {**SLURM, "tasks": tasks, "slurm": {**SLURM["slurm"], "max_array_size": 1001}}
    cfg = _wide_cfg(tmp_path / "run", wet_files, lid_model, executor)
    cancel_jobs_of(tmp_path / "run")
    run(cfg)  # submits every stage and returns
    jobs = json.loads((tmp_path / "run" / "slurm_jobs.json").read_text())
    assert list(jobs) == ["01_curate", "02_exact_dedup_hash", "03_exact_dedup_find", "04_exact_dedup_filter"]
    arrays = {label: ids.split(":") for label, ids in jobs.items()}
    assert [len(a) for a in arrays.values()] == [1, 2, 2, 2]
    queued = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True).stdout.split("\n")
    print("\n".join(line for line in queued if line.split("_")[0] in {j for a in arrays.values() for j in a}))
    hash_arrays = arrays["02_exact_dedup_hash"]
    info = {j: _job(j) for a in list(arrays.values())[1:] for j in a}
    for label, before in zip(list(arrays)[1:], list(arrays)[:-1]):
        for j in arrays[label]:
            print(label, j, info[j]["ArrayTaskId"], info[j]["Dependency"])
            # every array of the stage before, afterok: "afterok:101_*(unfulfilled),afterok:102_*(...)"
            assert sorted(re.findall(r"afterok:(\d+)_\*", info[j]["Dependency"])) == sorted(arrays[before]), info[j]
    assert [info[j]["ArrayTaskId"] for j in hash_arrays] == ["0-1", "0"]
    assert all(info[j]["JobState"] == "PENDING" for j in hash_arrays)  # curate has not finished

    # cancel rank 1 of the hash stage (task 1 of its first array) while it waits for curate
    subprocess.run(["scancel", f"{hash_arrays[0]}_1"], check=True)
    from gristmill.pipeline.execution.slurm_state import wait_until_gone

    wait_until_gone([j for a in arrays.values() for j in a])
    run_dir = tmp_path / "run"
    statuses = {s.label: s for s in stage_statuses(run_dir)}
    assert statuses["01_curate"].state == "complete"
    assert statuses["02_exact_dedup_hash"].completed == tasks - 1
    assert statuses["02_exact_dedup_hash"].state == "incomplete"
    assert not (run_dir / "02_exact_dedup_hash" / "completions" / "00001").exists()
    for later in ("03_exact_dedup_find", "04_exact_dedup_filter"):
        assert statuses[later].completed == 0 and statuses[later].state.startswith("cancelled"), statuses[later]
    done = {p.name: p.stat().st_mtime_ns for p in (run_dir / "02_exact_dedup_hash" / "completions").iterdir()}

    merged = run(cfg, wait=True)  # resubmits what is missing
    assert json.loads((run_dir / "02_exact_dedup_hash" / "ranks_to_run.json").read_text()) == [1]
    rerun = json.loads((run_dir / "slurm_jobs.json").read_text())
    assert rerun["01_curate"] == "-1" and len(rerun["02_exact_dedup_hash"].split(":")) == 1
    assert [len(rerun[k].split(":")) for k in ("03_exact_dedup_find", "04_exact_dedup_filter")] == [2, 2]
    completions = run_dir / "02_exact_dedup_hash" / "completions"
    assert {n: (completions / n).stat().st_mtime_ns for n in done} == done  # the others did not run again
    assert [s.state for s in stage_statuses(run_dir)] == ["complete"] * 4

    local = run(_wide_cfg(tmp_path / "local", wet_files, lid_model, {"type": "local", "tasks": tasks, "workers": 2}))
    for stage in ("01_curate", "04_exact_dedup_filter"):
        assert _outputs(run_dir / stage) == _outputs(tmp_path / "local" / stage), stage
    assert _outputs(run_dir / "04_exact_dedup_filter")
    assert [s["tasks_completed"] for s in merged["stages"]] == [s["tasks_completed"] for s in local["stages"]]


def test_an_array_larger_than_the_cluster_takes_is_refused_in_one_line(tmp_path, wet_files, lid_model, slurm_cluster):
    """An executor built past the cluster's limit (as a config of 1001 would be without the
    cluster's limit applied): sbatch's refusal, in one line naming the stage and array."""
    from gristmill.pipeline.execution.executors import SlurmSubmitFailed, make_slurm_executor
    from gristmill.pipeline.planning.planner import plan

    cfg = _cfg(tmp_path / "run", wet_files, lid_model, {**SLURM, "tasks": 2})
    stage = plan(cfg)[0]
    stage.folder.mkdir(parents=True)
    ex = make_slurm_executor(stage, cfg.executor.slurm, None)
    assert ex.max_array_size == MAX_ARRAY_SIZE  # the config's 1001, limited to the cluster's
    ex.max_array_size = MAX_ARRAY_SIZE + 1
    ex.tasks = MAX_ARRAY_SIZE + 3
    with pytest.raises(SlurmSubmitFailed) as e:
        ex.launch_job()
    assert re.fullmatch(
        rf"stage gristmill-curate: sbatch refused array 1 of 2 \(--array=0-{MAX_ARRAY_SIZE}\): .*"
        r"Invalid job array specification",
        str(e.value),
    ), str(e.value)


def test_max_array_size_follows_the_cluster(slurm_cluster):
    from gristmill.config import ConfigError
    from gristmill.pipeline.execution.executors import array_size

    assert cluster_array_limit() == MAX_ARRAY_SIZE  # read from `scontrol show config`
    assert array_size(1001, MAX_ARRAY_SIZE) == MAX_ARRAY_SIZE  # the config's 1001: the cluster's 2
    assert array_size(1, MAX_ARRAY_SIZE) == 1  # a smaller setting stands
    assert array_size(1001, None) == 1001  # no scontrol: sbatch will say
    with pytest.raises(ConfigError, match=r"^executor\.type: slurm: this cluster takes no job arrays"):
        array_size(1001, 0)


@pytest.mark.parametrize("max_array", [5, 1001])
def test_sbatch_lines_of_a_crawl_wide_stage(max_array):
    """4,000 tasks a stage (configs/slurm-crawl.yaml): every rank in exactly one array task under
    datatrove's mapping (array k, task i → entry k·max_array + i of ranks_to_run.json), and the
    dependency on 800 arrays of the stage before well inside the kernel's limit of one argument."""
    from gristmill.pipeline.execution.executors import array_submissions

    tasks = 4000
    before = [str(10_000_000 + 7 * k) for k in range(-(-tasks // max_array))]  # 8-digit job ids
    dependency = "afterok:" + ":".join(before)
    arrays = array_submissions(tasks, max_array, dependency)
    assert len(arrays) == -(-tasks // max_array) == (800 if max_array == 5 else 4)
    ranks = []
    for k, args in enumerate(arrays):
        spec, export, dep = args
        first, last = map(int, re.fullmatch(r"--array=(\d+)-(\d+)", spec).groups())
        assert first == 0 and last < max_array  # indices below MaxArraySize
        assert export == f"--export=ALL,RUN_OFFSET={k}" and dep == f"--dependency={dependency}"
        ranks += [k * max_array + i for i in range(first, last + 1)]
    assert ranks == list(range(tasks))
    longest = max(len(a.encode()) for args in arrays for a in args)
    assert longest < 131072  # MAX_ARG_STRLEN: one argument of execve
    assert sum(len(a) + 1 for a in ["sbatch", "--parsable", *arrays[0]]) < os.sysconf("SC_ARG_MAX")
    print(f"{len(arrays)} arrays; --dependency on {len(before)} arrays: {len(arrays[0][2])} bytes")
