"""The pipeline on a real one-node Ray cluster, started once for the test session.

`ray start --head --block` runs in its own session with a short temporary directory (Ray's
socket paths must fit AF_UNIX's 107 bytes, which a path under pytest's tmp_path does not), its
own token (token authentication is on by default; `~/.ray/auth_token` is shared by every user
of the machine) and free ports, and is stopped by its pid (`ray stop` would stop every Ray
cluster of the machine, by process name). Runs on it must equal local runs byte for byte,
resume like local runs, and fail with one line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gristmill.config import ConfigError, from_dict
from gristmill.core.parquet_io import FAIL_TASK_ENV
from gristmill.pipeline import run_dir as rd
from gristmill.pipeline.executors import KILL_TASK_ENV
from gristmill.pipeline.runner import run
from gristmill.pipeline.stats import funnel

from .test_run import config as demo_config
from .test_worker_faults import Command, files_bytes, one_line
from .test_worker_faults import config as fault_config

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

START_S = 180  # ray start on a busy 2-core machine takes ~10 s


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


@pytest.fixture(scope="session")
def ray_cluster():
    """Address of a one-node Ray cluster (2 CPUs, a 200 MB object store); the token and auth
    mode are set in this process's environment, so runs here and commands started from here
    connect to it."""
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("GRISTMILL_REQUIRE_DATA") == "1":
            pytest.fail("ray is not installed (the `ray` extra; `make test` installs it)")
        pytest.skip("ray is not installed (pip install -e '.[ray]')")
    temp = Path(tempfile.mkdtemp(prefix="gm-ray-", dir="/tmp"))
    token = temp / "auth_token"
    token.write_text(secrets.token_hex(16))
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    port = _free_port()
    env = {
        **os.environ,
        **auth,
        # the machine is shared: Ray's memory monitor would kill our tasks for others' memory
        "RAY_memory_monitor_refresh_ms": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    log = temp / "start.log"
    # every port Ray would otherwise take at a fixed number, free ones
    ports = ["--port", port, "--ray-client-server-port", _free_port(), "--dashboard-port", _free_port()]
    ports += ["--dashboard-agent-listen-port", _free_port(), "--runtime-env-agent-port", _free_port()]
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
        deadline = time.monotonic() + START_S
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None, f"ray start exited with {head.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"ray start not up in {START_S} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        os.environ.update(auth)
        yield f"127.0.0.1:{port}"
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


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory, wet_files, lid_model):
    """Uninterrupted local runs of test_worker_faults' small and long configurations."""
    root = tmp_path_factory.mktemp("local")
    run(from_dict(fault_config(root / "small", wet_files, lid_model, workers=2)))
    run(from_dict(fault_config(root / "long", wet_files, lid_model, workers=2, copies=8)))
    return {"small": files_bytes(root / "small" / "01_curate"), "long": files_bytes(root / "long" / "01_curate")}


def on_ray(cfg: dict, address: str, **ray) -> dict:
    cfg["executor"] = {"type": "ray", "tasks": 2, "ray": {"address": address, "max_retries": 1, **ray}}
    return cfg


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


def task_process(cmd: Command, rank: int) -> int:
    """The pid of the process running task `rank` of the curate stage (it holds its log open)."""
    logs = cmd.run_dir / "01_curate" / "logs"
    log = f"task_{rank:05d}.log"
    while cmd.proc.poll() is None:
        for pid in holders(logs) if logs.is_dir() else []:
            try:
                if any(os.readlink(fd).endswith(log) for fd in Path(f"/proc/{pid}/fd").iterdir()):
                    return pid
            except OSError:
                continue
        time.sleep(0.05)
    pytest.fail(f"the command ended before task {rank} was seen running:\n{cmd.output()}")


def no_task_process_left(run_dir: Path) -> list[int]:
    for _ in range(100):  # a cancelled worker takes a moment to go, and its task with it
        left = holders(run_dir)
        if not left:
            return []
        time.sleep(0.1)
    return left


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
        if not p.is_file() or rel.parts[0] in ("config.yaml", "command.json", "train"):
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


def test_demo_run_on_ray_equals_the_local_run(tmp_path, wet_files, lid_model, ray_cluster):
    """Filters, exact and near dedup, token shards: every stage on Ray, the same bytes."""
    steps = [
        {"exact_dedup": {"granularity": "paragraph", "capacity": 100000, "min_doc_words": 50}},
        {"near_dedup": {"threshold": 0.8}},
        {"tokenize": {"tokenizer": {"train": {"vocab_size": 512}}, "shard_tokens": 32768, "val_fraction": 0.05}},
    ]
    local = demo_config(tmp_path / "local", wet_files, lid_model, output={"dropped_sample": 0.2})
    local["steps"] += steps
    ray_cfg = on_ray(json.loads(json.dumps(local)), ray_cluster)
    ray_cfg["run_dir"] = str(tmp_path / "ray")
    run(from_dict(local))
    merged = run(from_dict(ray_cfg))
    plan = json.loads((tmp_path / "ray" / "plan.json").read_text())["stages"]
    assert len(plan) >= 15  # curate, 3 exact dedup, 6 near dedup, 6 tokenize phases
    expected, got = written(tmp_path / "local"), written(tmp_path / "ray")
    assert any(k.startswith("tokens/") and k.endswith(".arrow") for k in got)
    assert sorted(got) == sorted(expected)
    assert [k for k in expected if got[k] != expected[k]] == []
    assert funnel(merged)[0].docs_out == 566 + 43
    for stage in plan:  # every task of every stage: its usage record and its log
        folder = tmp_path / "ray" / stage["label"]
        usage = sorted((folder / "usage").glob("task_*.json"))
        assert len(usage) == stage["tasks"], folder
        for f in usage:
            record = json.loads(f.read_text())
            assert record["cpu_s"] > 0 and record["wall_s"] > 0 and record["max_rss_mb"] > 50, (f, record)
        assert len(list((folder / "logs").glob("task_*.log"))) == stage["tasks"]


def test_a_task_that_raises_fails_the_stage_in_one_line_then_only_it_reruns(
    tmp_path, wet_files, lid_model, local_runs, ray_cluster
):
    """The other task runs to its end: the re-run has task 1 alone to do."""
    cfg = on_ray(fault_config(tmp_path / "run", wet_files, lid_model, workers=2), ray_cluster)
    cmd = Command(tmp_path, cfg, env={FAIL_TASK_ENV: "1"})
    assert cmd.wait() == 1, cmd.output()
    out = one_line(cmd.output())
    log = (tmp_path / "run" / "01_curate" / "logs" / "task_00001.log").resolve()
    assert (
        "failed stage 01_curate: task 1 failed: RuntimeError: injected failure of task 1 (GRISTMILL_FAIL_TASK)" in out
    )
    assert f"log: {log}. 1 of 2 tasks did not complete; re-run the same command" in out, out
    assert out.count("failed stage") == 1 and "Traceback" not in out, out
    assert cmd.leftovers() == []
    stage = tmp_path / "run" / "01_curate"
    assert rd.completed_tasks(stage) == 1 and not (stage / "completions" / "00001").exists()
    kept = {p.name: p.stat().st_mtime_ns for p in (stage / "output").iterdir()}
    kept_usage = (stage / "usage" / "task_00000.json").read_bytes()

    again = Command(tmp_path, cfg, name="rerun")
    assert again.wait() == 0, again.output()
    assert "resuming" in again.output()
    assert (stage / "output" / "00000.parquet").stat().st_mtime_ns == kept["00000.parquet"]  # task 0 not rerun
    assert (stage / "usage" / "task_00000.json").read_bytes() == kept_usage
    assert (stage / "usage" / "task_00001.json").is_file()
    assert files_bytes(stage) == local_runs["small"]


def test_a_killed_task_process_is_retried_then_fails_in_one_line_and_resumes(
    tmp_path, wet_files, lid_model, local_runs, ray_cluster
):
    """The fault hook kills task 1's process after 20 documents, on every attempt."""
    cfg = on_ray(fault_config(tmp_path / "run", wet_files, lid_model, workers=2), ray_cluster)
    cmd = Command(tmp_path, cfg, env={KILL_TASK_ENV: "1:SIGKILL:20"})
    assert cmd.wait() == 1, cmd.output()
    out = one_line(cmd.output())
    log = (tmp_path / "run" / "01_curate" / "logs" / "task_00001.log").resolve()
    assert "task 1 was killed by SIGKILL (killed: out of memory?) on node " in out, out
    assert f", also on its 1 retry; log: {log}" in out, out
    assert out.count("running it again (retry 1 of 1)") == 1, out  # the retry, in one warning line
    assert out.count("failed stage") == 1 and "Traceback" not in out, out
    assert no_task_process_left(tmp_path / "run") == []
    again = Command(tmp_path, cfg, name="rerun")
    assert again.wait() == 0, again.output()
    assert files_bytes(tmp_path / "run" / "01_curate") == local_runs["small"]


def test_a_ray_worker_killed_mid_task_is_retried_by_ray(tmp_path, wet_files, lid_model, local_runs, ray_cluster):
    """SIGKILL to the Ray worker running task 0 (the OOM killer's way): its task process dies
    with it, Ray runs the task again, the run completes with a local run's output."""
    cfg = on_ray(fault_config(tmp_path / "run", wet_files, lid_model, workers=2, copies=8), ray_cluster)
    cmd = Command(tmp_path, cfg)
    task = task_process(cmd, 0)
    worker = int(Path(f"/proc/{task}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
    assert Path(f"/proc/{worker}/cmdline").read_bytes().startswith(b"ray::"), "not a Ray worker"
    os.kill(worker, signal.SIGKILL)
    assert cmd.wait() == 0, cmd.output()
    assert files_bytes(tmp_path / "run" / "01_curate") == local_runs["long"]
    assert len(list((tmp_path / "run" / "01_curate" / "usage").glob("task_*.json"))) == 2


def test_sigterm_cancels_the_stage_tasks_and_a_rerun_completes(tmp_path, wet_files, lid_model, local_runs, ray_cluster):
    cfg = on_ray(fault_config(tmp_path / "run", wet_files, lid_model, workers=2, copies=8), ray_cluster)
    cmd = Command(tmp_path, cfg)
    task_process(cmd, 0), task_process(cmd, 1)  # both tasks are working
    os.kill(cmd.proc.pid, signal.SIGTERM)
    code = cmd.wait()
    out = one_line(cmd.output())
    assert code == 128 + signal.SIGTERM, out
    assert "interrupted (SIGTERM) stage 01_curate: running tasks stopped" in out, out
    assert "Traceback" not in out
    assert no_task_process_left(tmp_path / "run") == []  # ray.cancel(force=True) reached them
    assert cmd.leftovers() == []
    again = Command(tmp_path, cfg, name="rerun")
    assert again.wait() == 0, again.output()
    assert files_bytes(tmp_path / "run" / "01_curate") == local_runs["long"]


@pytest.mark.parametrize("how", ["nothing listens", "a wrong token"])
def test_an_unreachable_cluster_is_one_line_and_exit_2(tmp_path, wet_files, lid_model, ray_cluster, how):
    address, env = (f"127.0.0.1:{_free_port()}", {}) if how == "nothing listens" else (ray_cluster, {})
    if how == "a wrong token":
        env = {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "wrong"), "RAY_AUTH_MODE": "token"}
        (tmp_path / "wrong").write_text("not-the-token")
    cfg = on_ray(fault_config(tmp_path / "run", wet_files, lid_model, workers=2), address, connect_timeout_s=3)
    cmd = Command(tmp_path, cfg, env=env)
    assert cmd.wait() == 2, cmd.output()
    lines = [line for line in cmd.output().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: executor.ray.address: "), lines
    assert ("cannot reach" if how == "nothing listens" else "InvalidAuthToken") in lines[0], lines
    assert not (tmp_path / "run" / "01_curate").exists()  # nothing ran


def test_a_stage_no_node_has_room_for_is_refused_before_it_runs(tmp_path, wet_files, lid_model, ray_cluster):
    cfg = on_ray(fault_config(tmp_path / "run", wet_files, lid_model, workers=2), ray_cluster)
    cfg["executor"]["ray"]["stages"] = {"curate": {"memory_gb": 4096}}
    with pytest.raises(ConfigError, match=r"stage 01_curate: a task asks Ray for 1 CPUs and 4096\.00 GB of memory"):
        run(from_dict(cfg))
    assert not (tmp_path / "run" / "01_curate").exists()
