"""tests/cli_process.py: a command forked from the warm zygote answers as a fresh interpreter does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cli_process import pipeline
from tests.conftest import REPO
from tests.faults import KILL_TASK_ENV


def _fresh(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gristmill.cli", *args], capture_output=True, text=True, **kw)


def test_same_exit_status_and_output_as_a_fresh_interpreter(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("input: {paths: [x]}\nsteps:\n  - langid: {min_score: high}\n")
    env = {**os.environ, "COLUMNS": "77"}
    for args in (["--help"], ["nonsense"], ["validate", "bad.yaml"], ["stats", "nowhere"]):
        ours, theirs = pipeline(*args, cwd=tmp_path, env=env), _fresh(*args, cwd=tmp_path, env=env)
        assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.returncode, theirs.stdout, theirs.stderr), args
    assert pipeline("validate", "bad.yaml", cwd=tmp_path).returncode == 2  # the case above is one that fails


def test_environment_working_directory_and_check(tmp_path):
    (tmp_path / "c.yaml").write_text("input: {paths: ['${WHERE}/*.wet.gz']}\nsteps: [c4_lines]\n")
    res = pipeline("validate", "c.yaml", cwd=tmp_path, env={**os.environ, "WHERE": str(REPO)})
    assert res.returncode == 0 and res.stderr.startswith("ok c.yaml: 1 steps"), res.stderr
    unset = pipeline("validate", "c.yaml", cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "WHERE"})
    assert unset.returncode == 2 and "environment variable WHERE is not set" in unset.stderr, unset.stderr
    with pytest.raises(subprocess.CalledProcessError) as e:
        pipeline("validate", "missing.yaml", cwd=tmp_path, check=True)
    assert e.value.returncode == 2 and "missing.yaml" in e.value.stderr
    assert pipeline("--help", text=False).stdout.startswith(b"usage: pipeline")


def test_timeout_kills_the_command_and_the_zygote_serves_the_next(tmp_path, wet_files):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"run_dir: {tmp_path / 'run'}\ninput: {{paths: ['{wet_files[1]}']}}\nsteps: [c4_lines]\n")
    # the task stops itself (SIGSTOP) after its first page: the run waits for it forever
    with pytest.raises(subprocess.TimeoutExpired):
        pipeline("run", cfg, timeout=4, env={**os.environ, KILL_TASK_ENV: "0:SIGSTOP:1"})
    assert pipeline("--help").returncode == 0  # the zygote serves the next command


def test_a_dead_zygote_is_replaced():
    from tests import cli_process

    assert pipeline("--help").returncode == 0
    dead = cli_process._zygote
    dead.proc.kill()
    dead.proc.wait()
    res = pipeline("--help")
    assert res.returncode == 0 and res.stdout.startswith("usage: pipeline")
    assert cli_process._zygote is not dead and cli_process._zygote.pid != dead.pid
