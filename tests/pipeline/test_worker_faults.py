"""A task process that dies (SIGKILL, a segfault), fails or is interrupted never hangs a run.

The command runs as a real subprocess in its own session, on the real WET sample; a generous
timeout is the hang detector. Afterwards no process of that session may be left (pool workers,
helper servers, a task's children), and re-running the command must give the output of an
uninterrupted run, byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gristmill.config import from_dict
from gristmill.pipeline.execution.task import describe_exit
from gristmill.pipeline.runner import run
from tests.faults import FAIL_TASK_ENV, KILL_TASK_ENV

HANG_S = 120  # far above any run here: reaching it means the run hung


def config(run_dir: Path, wet_files, lid_model, workers: int, copies: int = 1) -> dict:
    # `copies` repeats the 2014 file so that each task runs for seconds, long enough to be
    # killed from outside while it works. Copies under other names (the same file listed twice
    # is read once), in one place for every test: the `source` column, compared between a
    # resumed run and an uninterrupted one, holds their paths.
    paths = [str(p) for p in wet_files]
    if copies > 1:
        folder = Path(tempfile.gettempdir()) / "gristmill-test-wet-copies"
        folder.mkdir(exist_ok=True)
        for i in range(copies - 1):
            copy = folder / f"copy{i}-{wet_files[0].name}"
            if not copy.is_file() or copy.stat().st_size != wet_files[0].stat().st_size:
                shutil.copyfile(wet_files[0], copy.with_suffix(".tmp"))
                os.replace(copy.with_suffix(".tmp"), copy)
            paths.insert(i + 1, str(copy))
    return {
        "run_dir": str(run_dir),
        "executor": {"type": "local", "tasks": 2, "workers": workers},
        "input": {"paths": paths},
        "steps": [{"langid": {"model": str(lid_model)}}, {"gopher_quality": {}}, {"c4_lines": {}}],
        "output": {"dropped_sample": 0.5},
    }


def files_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.parquet"))}


def session_processes(sid: int) -> list[str]:
    """'pid cmdline' of every live process of session `sid` (the command's descendants)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ...
            if int(fields[3]) == sid and fields[0] != "Z":
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{entry.name} {cmdline}")
        except (OSError, ValueError):
            continue
    return found


def holders(sid: int, path: Path) -> list[int]:
    """Pids of session `sid` that have `path` open."""
    target = str(path)
    pids = []
    for line in session_processes(sid):
        pid = int(line.split()[0])
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    pids.append(pid)
                    break
            except OSError:
                continue
    return pids


class Command:
    """`pipeline run CONFIG` in its own session, output to a file."""

    def __init__(self, tmp_path: Path, cfg: dict, env: dict | None = None, name: str = "cmd"):
        self.cfg_path = tmp_path / f"{name}.yaml"
        self.cfg_path.write_text(json.dumps(cfg))
        self.log_path = tmp_path / f"{name}.log"
        self.run_dir = Path(cfg["run_dir"])
        # As a terminal's foreground job: Ctrl-C not ignored. A test process started in the
        # background by a shell ignores SIGINT, and an ignored signal stays ignored across exec
        # (the command would then rightly ignore Ctrl-C); one it handles is reset to the default.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "gristmill.cli", "run", str(self.cfg_path)],
                    env={**os.environ, "COLUMNS": "400", **(env or {})},
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        finally:
            signal.signal(signal.SIGINT, previous)

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run hung for {HANG_S} s:\n{self.output()}")
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def output(self) -> str:
        return self.log_path.read_text()

    def leftovers(self) -> list[str]:
        # Children get a moment to act on the signals that end them; then none may be left.
        for _ in range(50):
            left = session_processes(self.proc.pid)
            if not left:
                return []
            time.sleep(0.1)
        for line in left:  # don't leak them into later tests
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left

    def task_pid(self, rank: int) -> int:
        """The pid of the process running task `rank` (it holds the task's log file open)."""
        log = self.run_dir / "01_curate" / "logs" / f"task_{rank:05d}.log"
        while self.proc.poll() is None:
            pids = holders(self.proc.pid, log.resolve()) if log.exists() else []
            if pids:
                return pids[0]
            time.sleep(0.05)
        pytest.fail(f"the command ended before task {rank} was seen running:\n{self.output()}")

    def hold_both_tasks(self) -> None:
        """Tasks 0 and 1 seen working, then stopped (SIGSTOP), so that neither can finish before
        the signal a test sends next: on a loaded machine the test process can be descheduled
        for seconds between seeing the tasks and signalling, long enough for the run to end.
        The supervisor's stop sends SIGCONT after SIGTERM; PR_SET_PDEATHSIG's SIGKILL needs none."""
        for rank in (0, 1):
            os.kill(self.task_pid(rank), signal.SIGSTOP)


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def clean(tmp_path_factory, wet_files, lid_model):
    """Uninterrupted runs, in process, of the small and the long configuration."""
    root = tmp_path_factory.mktemp("clean")
    small = root / "small"
    run(from_dict(config(small, wet_files, lid_model, workers=2)))
    long = root / "long"
    run(from_dict(config(long, wet_files, lid_model, workers=2, copies=8)))
    return {"small": files_bytes(small / "01_curate"), "long": files_bytes(long / "01_curate")}


def _assert_resumes(cmd: Command, tmp_path: Path, expected: dict[str, bytes]) -> None:
    cfg = json.loads(cmd.cfg_path.read_text())
    again = Command(tmp_path, cfg, name="rerun")
    assert again.wait() == 0, again.output()
    assert "resuming" in again.output()
    assert again.leftovers() == []
    assert files_bytes(cmd.run_dir / "01_curate") == expected


def test_worker_killed_from_outside_fails_the_stage_then_resumes(tmp_path, wet_files, lid_model, clean):
    """The OOM killer's way: SIGKILL to the process running a task, mid-task, workers=2."""
    cmd = Command(tmp_path, config(tmp_path / "run", wet_files, lid_model, workers=2, copies=8))
    victim = cmd.task_pid(0)
    os.kill(victim, signal.SIGKILL)
    code = cmd.wait()
    out = one_line(cmd.output())
    assert code == 1, out
    log = (tmp_path / "run" / "01_curate" / "logs" / "task_00000.log").resolve()
    assert f"stage 01_curate: task 0 was killed by SIGKILL (killed: out of memory?); log: {log}" in out, out
    assert "re-run the same command" in out
    assert cmd.leftovers() == []
    assert not (tmp_path / "run" / "01_curate" / "completions" / "00000").exists()
    _assert_resumes(cmd, tmp_path, clean["long"])


@pytest.mark.parametrize(
    "workers,signame,words",
    [
        (1, "SIGSEGV", "was killed by SIGSEGV (segmentation fault in native code)"),
        (2, "SIGSEGV", "was killed by SIGSEGV (segmentation fault in native code)"),
        (1, "SIGKILL", "was killed by SIGKILL (killed: out of memory?)"),
        (2, "SIGBUS", "was killed by SIGBUS"),
    ],
)
def test_task_dying_by_signal_is_reported_then_resumes(tmp_path, wet_files, lid_model, clean, workers, signame, words):
    """A task that dies by a signal after 20 documents: with workers=1 too, the command survives
    it and reports it (it used to die with it, without a message)."""
    cmd = Command(
        tmp_path,
        config(tmp_path / "run", wet_files, lid_model, workers=workers),
        env={KILL_TASK_ENV: f"1:{signame}:20"},
    )
    code = cmd.wait()
    out = one_line(cmd.output())
    assert code == 1, out
    log = (tmp_path / "run" / "01_curate" / "logs" / "task_00001.log").resolve()
    assert f"stage 01_curate: task 1 {words}" in out and f"log: {log}" in out, out
    assert out.count("failed stage") == 1
    assert cmd.leftovers() == []
    assert not (tmp_path / "run" / "01_curate" / "completions" / "00001").exists()
    _assert_resumes(cmd, tmp_path, clean["small"])


def test_failed_task_names_its_error(tmp_path, wet_files, lid_model):
    cmd = Command(tmp_path, config(tmp_path / "run", wet_files, lid_model, workers=2), env={FAIL_TASK_ENV: "1"})
    code = cmd.wait()
    out = one_line(cmd.output())
    assert code == 1, out
    assert "task 1 failed: RuntimeError: injected failure of task 1 (GRISTMILL_FAIL_TASK)" in out, out
    assert cmd.leftovers() == []


@pytest.mark.parametrize("how", ["SIGTERM to the command", "Ctrl-C to the terminal's process group"])
def test_interrupted_run_leaves_no_process(tmp_path, wet_files, lid_model, clean, how):
    cmd = Command(tmp_path, config(tmp_path / "run", wet_files, lid_model, workers=2, copies=8))
    cmd.hold_both_tasks()  # both tasks were working
    if how.startswith("SIGTERM"):
        os.kill(cmd.proc.pid, signal.SIGTERM)
        expected, name = 128 + signal.SIGTERM, "SIGTERM"
    else:
        os.killpg(cmd.proc.pid, signal.SIGINT)
        expected, name = 128 + signal.SIGINT, "SIGINT"
    code = cmd.wait()
    out = one_line(cmd.output())
    assert cmd.leftovers() == [], out
    assert code == expected, out
    assert f"interrupted ({name}) stage 01_curate" in out, out
    assert "Traceback" not in out
    _assert_resumes(cmd, tmp_path, clean["long"])


def test_describe_exit_words():
    assert describe_exit(-9, "") == "was killed by SIGKILL (killed: out of memory?)"
    assert describe_exit(-11, "") == "was killed by SIGSEGV (segmentation fault in native code)"
    assert describe_exit(1, "ValueError: x") == "failed: ValueError: x"
    assert describe_exit(137, "") == "exited with code 137 without reporting an error"
    assert describe_exit(0, "") == "exited without marking itself complete"


def test_command_killed_by_sigkill_takes_its_tasks_with_it(tmp_path, wet_files, lid_model):
    """No handler runs on SIGKILL: the tasks die with their parent (PR_SET_PDEATHSIG)."""
    cmd = Command(tmp_path, config(tmp_path / "run", wet_files, lid_model, workers=2, copies=8))
    cmd.hold_both_tasks()
    os.kill(cmd.proc.pid, signal.SIGKILL)
    assert cmd.wait() == -signal.SIGKILL
    assert cmd.leftovers() == []
