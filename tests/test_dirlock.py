"""The directory lock: a second writer is refused naming the first; a dead holder's lock is free."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gristmill.dirlock import LOCK_NAME, LockHeld, hold, read_holder

HOLDER = """
import sys, time
from gristmill.dirlock import hold
with hold(sys.argv[1], "run directory"):
    print("held", flush=True)
    time.sleep(60)
"""


def _start_holder(directory):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    proc = _start_holder(tmp_path)
    try:
        with pytest.raises(LockHeld) as err:
            with hold(tmp_path, "run directory"):
                pass
        assert f"pid {proc.pid}" in str(err.value)
        assert str(tmp_path) in str(err.value)
        # the refused attempt must not erase the holder's record
        assert read_holder(tmp_path)["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_lock_of_a_killed_holder_is_taken_over(tmp_path):
    proc = _start_holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert read_holder(tmp_path)["pid"] == proc.pid  # the dead holder's record is still there
    with hold(tmp_path):
        assert read_holder(tmp_path)["pid"] == os.getpid()
    assert read_holder(tmp_path) == {}
    assert (tmp_path / LOCK_NAME).exists()


def test_forked_children_keep_the_lock_until_they_end(tmp_path):
    with hold(tmp_path):
        child = subprocess.Popen(["sleep", "30"], pass_fds=())  # exec'd children without the fd
        pid = os.fork()
        if pid == 0:  # a forked worker inherits the descriptor, as datatrove's pool workers do
            time.sleep(30)
            os._exit(0)
    try:
        with pytest.raises(LockHeld):
            with hold(tmp_path):
                pass
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with hold(tmp_path):  # the exec'd child, still running, never held it
            assert child.poll() is None
    finally:
        child.kill()
        child.wait()
