"""What a run believes about its Slurm jobs when scontrol lies by omission: a job passing between
states, a slurmctld too busy to answer. A `scontrol` of our own on PATH answers each call from a
script of replies (the real cluster cannot be made to hesitate on cue); the real one is in
test_slurm.py.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from gristmill.pipeline.execution.slurm_state import SlurmQueryFailed, job_states, wait_until_gone
from gristmill.pipeline.report.run_status import stage_statuses
from gristmill.pipeline.rundir import LocalRunDir

UNKNOWN = (1, "slurm_load_jobs error: Invalid job id specified")
BUSY = (1, "slurm_load_jobs error: Socket timed out on send/recv operation")


def _line(state: str, reason: str = "None") -> tuple[int, str]:
    return (0, f"JobId=12 JobName=train UserId=root(0) JobState={state} Reason={reason} Dependency=(null)")


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """`script(replies)`: scontrol answers call i with replies[i] (the last one from then on) and
    logs each call; returns the log."""

    def script(replies: list[tuple[int, str]]) -> Path:
        bin_dir, log = tmp_path / "bin", tmp_path / "calls"
        bin_dir.mkdir(exist_ok=True)
        (tmp_path / "replies.json").write_text(json.dumps(replies))
        exe = bin_dir / "scontrol"
        exe.write_text(
            f"""#!/usr/bin/env python3
import json, sys
calls = open({str(log)!r}, "a+")
calls.seek(0)
n = len(calls.read().splitlines())
calls.write(" ".join(sys.argv[1:]) + "\\n")
replies = json.load(open({str(tmp_path / "replies.json")!r}))
rc, text = replies[min(n, len(replies) - 1)]
print(text, file=sys.stdout if rc == 0 else sys.stderr)
sys.exit(rc)
"""
        )
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        return log

    return script


def test_a_job_between_states_or_a_silent_slurm_is_not_gone(scontrol):
    # running; a signal on its way (scancel --signal); requeueing; slurmctld too busy to answer;
    # pending again, held until its start time; then gone for good
    log = scontrol(
        [
            _line("RUNNING"),
            _line("SIGNALING"),
            _line("REQUEUE_FED"),
            BUSY,
            _line("PENDING", "BeginTime"),
            UNKNOWN,
        ]
    )
    wait_until_gone(["12"], poll_s=0.01)
    assert len(log.read_text().splitlines()) == 6  # it waited through every one of them


def test_a_held_or_ended_job_is_not_waited_for(scontrol):
    for state in ("REQUEUE_HOLD", "COMPLETED", "CANCELLED", "FAILED"):
        log = scontrol([_line(state)])
        log.unlink(missing_ok=True)
        wait_until_gone(["12"], poll_s=0.01)
        assert len(log.read_text().splitlines()) == 1, state


def test_a_slurm_that_never_answers_is_one_error_after_the_grace(scontrol):
    scontrol([BUSY])
    started = time.monotonic()
    with pytest.raises(SlurmQueryFailed, match="scontrol show job 12: slurm_load_jobs error: Socket timed out"):
        wait_until_gone(["12"], poll_s=0.01, give_up_s=0.2)
    assert time.monotonic() - started >= 0.2


def test_array_states_are_summed_and_an_unknown_array_counts_nothing(scontrol):
    scontrol([_line("RUNNING"), UNKNOWN])
    assert job_states("12:13") == {"RUNNING": 1}


def test_status_says_unknown_when_slurm_does_not_answer(scontrol, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "01_curate" / "completions").mkdir(parents=True)
    (run_dir / "01_curate" / "completions" / "00000").write_text("")
    (run_dir / "plan.json").write_text(json.dumps({"stages": [{"label": "01_curate", "tasks": 2}]}))
    LocalRunDir(run_dir).write_jobs({"01_curate": "12"})
    scontrol([BUSY])
    (st,) = stage_statuses(run_dir)
    assert st.completed == 1 and st.state == (
        "unknown: Slurm did not answer (scontrol show job 12: slurm_load_jobs error: Socket timed out on"
        " send/recv operation); run `pipeline status` again"
    )
    scontrol([UNKNOWN])  # gone, one task never completed: read from the files
    (st,) = stage_statuses(run_dir)
    assert st.state == "incomplete"
