"""The pipeline on a real one-node Ray cluster on 127.0.0.1, started once for this module.

`ray start --head --block` runs in its own session with 2 CPUs, a short temporary directory
(Ray's socket paths must fit AF_UNIX's 107 bytes, which a path under pytest's tmp_path does
not), its own token (token authentication is on by default; `~/.ray/auth_token` is shared by
every user of the machine) and free ports, and is stopped by its pid (`ray stop` would stop every
Ray cluster of the machine, by process name). Runs on it must equal local runs byte for byte,
resume like local runs, fail with one line, and write the token nowhere.

Every test here is in the xdist group "ray" (one worker, one cluster at a time; the benchmark's
smoke check, which starts its own, is in it too). Faults are made deterministic from outside
(a task process stopped with SIGSTOP cannot finish before the fault lands), so the runs stay
small: the real sample, 2 tasks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gristmill.compat.ray import GCS_WAIT_ENV
from gristmill.config import ConfigError, from_dict
from gristmill.pipeline.rundir import layout
from gristmill.pipeline.runner import StageFailed, run

from ..faults import FAIL_TASK_ENV, KILL_TASK_ENV
from .test_worker_faults import Command, files_bytes, one_line
from .test_worker_faults import config as curate_config

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

REPO = Path(__file__).resolve().parents[2]
START_S = 180  # ray start on a busy 2-core machine takes ~10 s
#: after the curate stage of test_worker_faults' configuration: exact dedup's 3 stages and
#: tokenize's 6 (a vocabulary trained on the run's documents, shuffled shards)
LATER_STEPS = [
    {"exact_dedup": {"granularity": "paragraph", "capacity": 100000, "min_doc_words": 50}},
    {"tokenize": {"tokenizer": {"train": {"vocab_size": 512}}, "shard_tokens": 32768, "val_fraction": 0.05}},
]


def _completed(stage_folder: Path) -> int:
    return len(layout.completed_ranks(p.name for p in (stage_folder / "completions").iterdir()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[3]) == sid:
                    pids.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return pids


@dataclass
class Cluster:
    address: str
    token: str
    pid: int = 0  # `ray start --block`: its session holds the cluster's processes


@pytest.fixture(scope="module")
def ray_cluster(request):
    """A one-node Ray cluster (2 CPUs, a 200 MB object store); its token and auth mode are set
    in this process's environment while the module runs, so runs here and commands started from
    here connect to it. The module's local run is made while the cluster starts."""
    with started_cluster(lambda: request.getfixturevalue("local_run")) as cluster:
        yield cluster


@contextmanager
def started_cluster(meanwhile=lambda: None):
    """A Ray cluster of its own for the block (the module's, or one a test may break)."""
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("GRISTMILL_REQUIRE_DATA") == "1":
            pytest.fail("ray is not installed (the `ray` extra; `make test` installs it)")
        pytest.skip("ray is not installed (pip install -e '.[ray]')")
    temp = Path(tempfile.mkdtemp(prefix="gm-ray-", dir="/tmp"))
    token = secrets.token_hex(16)
    (temp / "auth_token").write_text(token)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(temp / "auth_token")}
    env = {
        **os.environ,
        **auth,
        # the machine is shared: Ray's memory monitor would kill our tasks for others' memory
        "RAY_memory_monitor_refresh_ms": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    port = _free_port()
    # every port Ray would otherwise take at a fixed number, free ones
    ports = ["--port", port, "--ray-client-server-port", _free_port(), "--dashboard-port", _free_port()]
    ports += ["--dashboard-agent-listen-port", _free_port(), "--runtime-env-agent-port", _free_port()]
    log = temp / "start.log"
    with open(log, "w") as out:
        head = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--num-cpus", "2"]
            + ["--temp-dir", str(temp), "--include-dashboard", "false", "--object-store-memory", "200000000"]
            + ["--disable-usage-stats", *map(str, ports)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    saved = {k: os.environ.get(k) for k in auth}
    try:
        meanwhile()  # `ray start` spends most of its ~10 s waiting
        deadline = time.monotonic() + START_S
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None, f"ray start exited with {head.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"ray start not up in {START_S} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        os.environ.update(auth)
        yield Cluster(f"127.0.0.1:{port}", token, head.pid)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        for pid in _session_pids(head.pid):  # what did not stop with it (only ours: its session)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


def config(run_dir: Path, wet_files, lid_model, executor: dict, later_steps: bool = True, copies: int = 1) -> dict:
    cfg = curate_config(run_dir, wet_files, lid_model, workers=2, copies=copies)
    cfg["executor"] = executor
    if later_steps:
        cfg["steps"] += LATER_STEPS
    return cfg


def on_ray(cluster: Cluster, **ray) -> dict:
    return {"type": "ray", "tasks": 2, "ray": {"address": cluster.address, "max_retries": 1, **ray}}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, wet_files, lid_model) -> Path:
    """The uninterrupted local run every Ray run here is compared with."""
    run_dir = tmp_path_factory.mktemp("local") / "run"
    run(from_dict(config(run_dir, wet_files, lid_model, {"type": "local", "tasks": 2, "workers": 2})))
    return run_dir


def _without_times(node):
    if isinstance(node, dict):
        return {k: _without_times(v) for k, v in node.items() if "time" not in k}
    if isinstance(node, list):
        return [_without_times(v) for v in node]
    return node


def written(run_dir: Path) -> dict[str, object]:
    """What a run wrote that must not depend on where it ran: every file of its stages and
    tokens, stats without their timings; not logs, usage, the executor's description."""
    out = {}
    for p in sorted(run_dir.rglob("*")):
        rel = p.relative_to(run_dir)
        if not p.is_file() or rel.parts[0] in ("config.yaml", "command.json"):
            continue
        if {"logs", "usage"} & set(rel.parts) or p.name in ("executor.json", ".gristmill.lock"):
            continue
        if p.suffix == ".json" and ("stats" in rel.parts or p.name == "stats.json"):
            data = _without_times(json.loads(p.read_text()))
            data.pop("run_dir", None) if isinstance(data, dict) else None
            out[str(rel)] = data
        else:
            out[str(rel)] = p.read_bytes()
    return out


def files_with(folder: Path, secret: str) -> list[str]:
    """Files under `folder` whose bytes contain `secret`."""
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def holders(folder: Path) -> list[int]:
    """Pids of every process (anywhere: Ray's workers are not the command's) with a file under
    `folder` open."""
    prefix = str(folder.resolve()) + "/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            targets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(t.startswith(prefix) for t in targets):
            found.append(int(entry.name))
    return found


def task_process(run_dir: Path, rank: int, running=lambda: True, other_than=()) -> int | None:
    """The pid of the process running task `rank` of the curate stage (it holds its log open),
    once it runs (not one of `other_than`: an earlier attempt's); None if `running()` turns
    false first."""
    logs = run_dir / "01_curate" / "logs"
    log = f"task_{rank:05d}.log"
    while running():
        for pid in [p for p in holders(logs) if p not in other_than] if logs.is_dir() else []:
            try:
                if any(os.readlink(fd).endswith(log) for fd in Path(f"/proc/{pid}/fd").iterdir()):
                    return pid
            except OSError:
                continue
        time.sleep(0.02)
    return None


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def ray_worker_of(task: int) -> int:
    """The Ray worker running task process `task`: its parent, or its zygote's parent where the
    worker forked it from its task zygote (a process whose command line runs `_zygote_main`)."""
    pid = parent(task)
    if b"_zygote_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
        pid = parent(pid)
    return pid


def no_task_process_left(run_dir: Path) -> list[int]:
    for _ in range(100):  # a cancelled worker takes a moment to go, and its task with it
        left = holders(run_dir)
        if not left:
            return []
        time.sleep(0.1)
    return left


def test_a_run_on_ray_writes_what_the_local_run_writes_also_when_a_ray_worker_is_killed(
    tmp_path, wet_files, lid_model, local_run, ray_cluster, capfd
):
    """Filters, exact dedup, token shards: 10 stages on Ray, the same bytes as locally. Midway
    through curate task 0, its Ray worker gets SIGKILL (the OOM killer's way): the task's
    process dies with it, Ray runs the task again, and the run still ends byte-identical."""
    run_dir = tmp_path / "ray"
    cfg = from_dict(config(run_dir, wet_files, lid_model, on_ray(ray_cluster)))
    killed: dict = {}
    done = threading.Event()

    def kill_worker_of_task_0():
        task = task_process(run_dir, 0, running=lambda: not done.is_set())
        if task is None:
            return
        os.kill(task, signal.SIGSTOP)  # it cannot finish before its worker is gone
        worker = ray_worker_of(task)
        killed["forked"] = parent(task) != worker  # by the worker's task zygote, not exec'd by it
        killed["cmdline"] = Path(f"/proc/{worker}/cmdline").read_bytes()
        killed["at"] = time.time()
        os.kill(worker, signal.SIGKILL)

    killer = threading.Thread(target=kill_worker_of_task_0)
    killer.start()
    gcs_wait = os.environ.get(GCS_WAIT_ENV)
    try:
        run(cfg)
    finally:
        done.set()
        killer.join()
    assert os.environ.get(GCS_WAIT_ENV) == gcs_wait  # set for ray.init alone, not for later commands
    out = capfd.readouterr()
    assert killed["cmdline"].startswith(b"ray::01_curate:task_00000"), killed  # a Ray worker, running task 0
    assert killed["forked"], killed  # the worker's zygote forked the task's process
    plan = json.loads((run_dir / "plan.json").read_text())["stages"]
    assert len(plan) == 11  # curate, 3 exact dedup, 7 tokenize phases
    expected, got = written(local_run), written(run_dir)
    assert any(k.startswith("tokens/") and k.endswith(".arrow") for k in got)
    assert sorted(got) == sorted(expected)
    assert [k for k in expected if got[k] != expected[k]] == []
    # task 0 of curate ran again after the kill: its usage is the new run's
    assert json.loads((run_dir / "01_curate" / "usage" / "task_00000.json").read_text())["start"] > killed["at"]
    for stage in plan:  # every task of every stage: its usage record and its log
        folder = run_dir / stage["label"]
        usage = sorted((folder / "usage").glob("task_*.json"))
        assert len(usage) == stage["tasks"], folder
        for f in usage:
            record = json.loads(f.read_text())
            assert record["cpu_s"] > 0 and record["wall_s"] > 0 and record["max_rss_mb"] > 50, (f, record)
        assert len(list((folder / "logs").glob("task_*.log"))) == stage["tasks"]
    assert files_with(run_dir, ray_cluster.token) == []
    assert ray_cluster.token not in out.out + out.err
    assert no_task_process_left(run_dir) == []


def test_a_task_process_killed_on_every_attempt_fails_the_stage_in_one_line_and_a_rerun_redoes_only_it(
    tmp_path, wet_files, lid_model, local_run, ray_cluster
):
    """The fault hook kills task 1's process with SIGKILL after 20 documents, on every attempt:
    retried once, then the stage fails in one line naming the task; task 0 runs to its end,
    and the re-run runs task 1 alone."""
    run_dir = tmp_path / "run"
    cfg = config(run_dir, wet_files, lid_model, on_ray(ray_cluster), later_steps=False)
    cmd = Command(tmp_path, cfg, env={KILL_TASK_ENV: "1:SIGKILL:20"})
    assert cmd.wait() == 1, cmd.output()
    out = one_line(cmd.output())
    log = (run_dir / "01_curate" / "logs" / "task_00001.log").resolve()
    assert "failed stage 01_curate: task 1 was killed by SIGKILL (killed: out of memory?) on node " in out, out
    assert f", also on its 1 retry; log: {log}. 1 of 2 tasks did not complete; re-run the same command" in out, out
    assert out.count("running it again (retry 1 of 1)") == 1, out  # the retry, in one warning line
    assert out.count("failed stage") == 1 and "Traceback" not in out, out
    assert ray_cluster.token not in cmd.output()
    assert no_task_process_left(run_dir) == [] and cmd.leftovers() == []
    stage = run_dir / "01_curate"
    assert _completed(stage) == 1 and not (stage / "completions" / "00001").exists()
    kept = (stage / "output" / "00000.parquet").stat().st_mtime_ns
    kept_usage = (stage / "usage" / "task_00000.json").read_bytes()

    run(from_dict(cfg))
    assert (stage / "output" / "00000.parquet").stat().st_mtime_ns == kept  # task 0 not run again
    assert (stage / "usage" / "task_00000.json").read_bytes() == kept_usage
    assert (stage / "usage" / "task_00001.json").is_file()
    assert files_bytes(stage) == files_bytes(local_run / "01_curate")
    assert files_with(run_dir, ray_cluster.token) == []


def test_a_ray_worker_killed_on_every_attempt_fails_the_stage_in_one_line(tmp_path, wet_files, lid_model, ray_cluster):
    """Task 0's Ray worker gets SIGKILL on its first run and on Ray's retry (max_retries 1)."""
    run_dir = tmp_path / "run"
    cfg = config(run_dir, wet_files, lid_model, on_ray(ray_cluster), later_steps=False)
    cmd = Command(tmp_path, cfg)
    tasks, workers = [], []
    while len(workers) < 2:
        task = task_process(run_dir, 0, running=lambda: cmd.proc.poll() is None, other_than=tasks)
        if task is None:
            break
        os.kill(task, signal.SIGSTOP)
        tasks.append(task)
        workers.append(ray_worker_of(task))
        os.kill(workers[-1], signal.SIGKILL)
    assert cmd.wait() == 1, cmd.output()
    assert len(set(workers)) == 2, (workers, cmd.output())
    out = one_line(cmd.output())
    log = (run_dir / "01_curate" / "logs" / "task_00000.log").resolve()
    assert "failed stage 01_curate: task 0 lost its Ray worker (" in out, out
    assert "also on its 1 retry: " in out and f"; log: {log}. 1 of 2 tasks did not complete" in out, out
    assert ".;" not in out  # Ray's message, its full stop dropped, then the stage's line goes on
    assert out.count("failed stage") == 1 and "Traceback" not in out, out
    assert _completed(run_dir / "01_curate") == 1  # task 1 ran to its end
    assert no_task_process_left(run_dir) == [] and cmd.leftovers() == []


def test_a_task_that_raises_fails_the_stage_in_one_line_after_the_others_end(
    tmp_path, wet_files, lid_model, ray_cluster, monkeypatch
):
    monkeypatch.setenv(FAIL_TASK_ENV, "1")  # GRISTMILL_* variables reach the tasks
    cfg = config(tmp_path / "run", wet_files, lid_model, on_ray(ray_cluster), later_steps=False)
    with pytest.raises(StageFailed) as failed:
        run(from_dict(cfg))
    log = (tmp_path / "run" / "01_curate" / "logs" / "task_00001.log").resolve()
    assert str(failed.value) == (
        "stage 01_curate: task 1 failed: RuntimeError: injected failure of task 1 (GRISTMILL_FAIL_TASK)"
        f" on node {socket.gethostname()}; log: {log}. 1 of 2 tasks did not complete;"
        " re-run the same command to finish the missing tasks."
    )
    assert _completed(tmp_path / "run" / "01_curate") == 1  # task 0 ran to its end


def test_sigterm_cancels_the_stage_tasks_and_a_rerun_completes(tmp_path, wet_files, lid_model, ray_cluster):
    run_dir = tmp_path / "run"
    # copies of the larger sample, so that both tasks work for seconds: with the 43-record file
    # one task could end before it was seen running on a loaded machine
    cfg = config(run_dir, wet_files, lid_model, on_ray(ray_cluster), later_steps=False, copies=4)
    cmd = Command(tmp_path, cfg)
    tasks = [task_process(run_dir, rank, running=lambda: cmd.proc.poll() is None) for rank in (0, 1)]
    assert None not in tasks, cmd.output()
    for pid in tasks:  # both at work, and neither can finish before the signal
        os.kill(pid, signal.SIGSTOP)
    os.kill(cmd.proc.pid, signal.SIGTERM)
    code = cmd.wait()
    out = one_line(cmd.output())
    assert code == 128 + signal.SIGTERM, out
    assert "interrupted (SIGTERM) stage 01_curate: running tasks stopped, 0 of 2 tasks complete" in out, out
    assert "Traceback" not in out
    assert no_task_process_left(run_dir) == []  # ray.cancel(force=True) reached them, stopped as they were
    assert cmd.leftovers() == []
    run(from_dict(cfg))
    local = tmp_path / "local"
    run(from_dict({**cfg, "run_dir": str(local), "executor": {"type": "local", "tasks": 2, "workers": 2}}))
    assert files_bytes(run_dir / "01_curate") == files_bytes(local / "01_curate")


@pytest.mark.parametrize("how", ["nothing listens", "a wrong token"])
def test_an_unreachable_cluster_is_one_line_and_exit_2(tmp_path, wet_files, lid_model, ray_cluster, how):
    address, env = (f"127.0.0.1:{_free_port()}", {}) if how == "nothing listens" else (ray_cluster.address, {})
    if how == "a wrong token":
        env = {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "wrong"), "RAY_AUTH_MODE": "token"}
        (tmp_path / "wrong").write_text("not-the-token")
    cluster = Cluster(address, ray_cluster.token)
    cfg = config(tmp_path / "run", wet_files, lid_model, on_ray(cluster, connect_timeout_s=2), later_steps=False)
    cmd = Command(tmp_path, cfg, env=env)
    assert cmd.wait() == 2, cmd.output()
    lines = [line for line in cmd.output().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: executor.ray.address: "), lines
    assert ("cannot reach" if how == "nothing listens" else "InvalidAuthToken") in lines[0], lines
    assert "not-the-token" not in lines[0] and ray_cluster.token not in lines[0]
    assert not (tmp_path / "run" / "01_curate").exists()  # nothing ran


def test_a_stage_no_node_has_room_for_is_refused_before_it_runs(tmp_path, wet_files, lid_model, ray_cluster):
    cfg = config(tmp_path / "run", wet_files, lid_model, on_ray(ray_cluster), later_steps=False)
    cfg["executor"]["ray"]["stages"] = {"curate": {"memory_gb": 4096}}
    with pytest.raises(ConfigError, match=r"stage 01_curate: a task asks Ray for 1 CPUs and 4096\.00 GB of memory"):
        run(from_dict(cfg))
    assert not (tmp_path / "run" / "01_curate").exists()


def test_ray_crawl_yaml_is_the_demo_on_ray():
    """configs/ray-crawl.yaml runs configs/crawl.yaml's steps, output and training, on Ray."""
    demo, on_ray = (yaml.safe_load((REPO / "configs" / name).read_text()) for name in ("crawl.yaml", "ray-crawl.yaml"))
    assert on_ray["executor"]["type"] == "ray" and on_ray["run_dir"] != demo["run_dir"]
    assert {k: v for k, v in on_ray.items() if k not in ("executor", "run_dir")} == {
        k: v for k, v in demo.items() if k not in ("executor", "run_dir")
    }
    cfg = from_dict(on_ray)
    assert cfg.executor.ray.address == "auto" and cfg.executor.tasks == demo["executor"]["tasks"]


def test_a_run_directory_on_object_storage_is_refused_on_ray(tmp_path, wet_files, lid_model):
    """Ray's tasks write their stage folders in place: one line, before anything runs."""
    cfg = config(tmp_path / "run", wet_files, lid_model, {"type": "ray", "tasks": 2}, later_steps=False)
    cfg["run_dir"] = "s3://bucket/runs/crawl"
    with pytest.raises(ConfigError, match=r"executor.type: ray with a run directory on object storage \(s3://"):
        from_dict(cfg)


def test_a_killed_raylet_fails_the_stage_in_one_line(tmp_path, wet_files, lid_model):
    """SIGKILL of the raylet of the node the command runs on, mid-stage (a cluster of its own:
    this one is broken for good). Ray's core worker would end the driver a minute later from
    C++, with Ray's lines alone; the stage fails first with gristmill's line, naming the cause."""
    with started_cluster() as cluster:
        run_dir = tmp_path / "run"
        cmd = Command(tmp_path, config(run_dir, wet_files, lid_model, on_ray(cluster), later_steps=False))
        task = task_process(run_dir, 0, running=lambda: cmd.proc.poll() is None)
        assert task is not None, cmd.output()
        os.kill(task, signal.SIGSTOP)  # the stage cannot end before the raylet is gone
        (raylet,) = [
            p for p in _session_pids(cluster.pid) if b"/raylet/raylet" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        os.kill(raylet, signal.SIGKILL)
        assert cmd.wait() == 1, cmd.output()
        out = one_line(cmd.output())
        assert re.search(
            r"failed stage 01_curate: task [01] could not be followed: the raylet of the Ray node this command runs"
            r" on is gone \(nothing answers on /tmp/gm-ray-\S+/raylet\); start Ray on this node again and re-run:"
            r" completed tasks are kept; log: ",
            out,
        ), out
        assert out.count("failed stage") == 1 and "Traceback" not in out, out
