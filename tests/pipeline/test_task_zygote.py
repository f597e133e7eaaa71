"""Task processes forked from the zygote (gristmill.pipeline.execution.zygote).

The children run `_probe` below, which reports what it sees of its own process on the status
pipe; the executor tests run real `LocalExecutor` stages of a step that records its process.
The faults of a task (signals, exit codes, errors, a supervisor killed by SIGKILL) are
tests/pipeline/test_worker_faults.py's, which run the forked path by default.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import dill
import pytest
from datatrove.pipeline.base import PipelineStep

from gristmill.config import from_dict
from gristmill.pipeline.execution import zygote as task_zygote
from gristmill.pipeline.execution.executors import LocalExecutor, describe_exit, make_executor
from gristmill.pipeline.planning.planner import plan

REPO = Path(__file__).resolve().parents[2]
PROBE = f"{__name__}:_probe"


def _probe(status_fd: int, what: str = "", *args: str) -> None:
    """A task body: what this process is, as JSON on the status pipe (a line, then EOF)."""
    sig = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
    facts = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "pdeathsig": sig.value,
        "threads": len(os.listdir("/proc/self/task")),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "status_fd": status_fd,
        "fds": {f: _link(f"/proc/self/fd/{f}") for f in os.listdir("/proc/self/fd")},
        "sigint": str(signal.getsignal(signal.SIGINT)),
        "numpy_draw": __import__("numpy").random.randint(1 << 30),
    }
    if what == "rss":
        from gristmill.pipeline.execution.usage import _rss_mb

        facts["rss_mb"] = _rss_mb(resource.getrusage(resource.RUSAGE_SELF))
    elif what == "unpickle":
        before = set(sys.modules)
        with open(args[0], "rb") as f:
            dill.load(f)
        facts["imported"] = sorted({m.split(".")[0] for m in set(sys.modules) - before})
    elif what == "tables":  # what nearly every task does: an Arrow table from Python lists, written and read
        before = set(sys.modules)
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": ["a"], "text": ["b"]}), args[0])
        pq.read_table(args[0])
        facts["imported"] = sorted({m.split(".")[0] for m in set(sys.modules) - before})
    elif what == "modules":  # which of the named modules the task has without importing them
        facts["modules"] = [m for m in args if m in sys.modules]
    elif what == "burn":
        start = time.process_time()
        while time.process_time() - start < float(args[0]):
            pass
    elif what == "print":
        print("out of the task", flush=True)
        print("err of the task", file=sys.stderr, flush=True)
    status = os.fdopen(status_fd, "w")
    status.write(json.dumps(facts) + "\n")
    status.flush()
    if what == "sleep":
        time.sleep(float(args[0]))
    elif what == "exit":
        os._exit(int(args[0]))
    elif what == "signal":
        os.kill(os.getpid(), int(args[0]))
    elif what == "raise":
        raise ValueError("raised in the task")
    status.close()
    os._exit(0)


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _spawn(zygote: task_zygote.Zygote, what: str = "", *args: str) -> tuple[task_zygote.ForkedProcess, int]:
    r, w = os.pipe()
    try:
        proc = zygote.spawn(PROBE, [what, *args], (w,))
    finally:
        os.close(w)
    return proc, r


def _facts(r: int) -> dict:
    """The probe's line, without waiting for the pipe's EOF."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(r, 1 << 16)
        assert chunk, "the task closed its status pipe without a word"
        line += chunk
    return json.loads(line)


def _run(zygote: task_zygote.Zygote, what: str = "", *args: str) -> tuple[task_zygote.ForkedProcess, dict]:
    """Spawn the probe and read its facts to the pipe's EOF: by then its exit status is there."""
    proc, r = _spawn(zygote, what, *args)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    # the zygote holds its copy of the pipe until it has reported the child: EOF means the
    # status is waiting, as the executor's select loop expects (no poll-and-sleep)
    assert proc.poll() is not None
    return proc, json.loads(data) if data.strip() else {}


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def _poll_until_reported(proc: task_zygote.ForkedProcess, timeout: float = 10) -> None:
    """Poll the handle until the zygote has reported its exit (at most `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def _wait_gone(*pids: int, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not _gone(p)]


@pytest.fixture
def fresh_state():
    """Tests that break or replace the process's zygote start and end from a clean slate."""
    task_zygote.reset()
    yield
    task_zygote.reset()


def test_child_is_a_single_threaded_fork_in_its_own_group_with_the_requests_cwd_and_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(task_zygote.START_ENV, raising=False)
    zygote = task_zygote.shared()
    assert zygote is not None
    assert len(os.listdir(f"/proc/{zygote.pid}/task")) == 1  # numpy, pyarrow and the steps imported
    proc, facts = _run(zygote)
    assert proc.returncode == 0
    assert facts["ppid"] == zygote.pid and facts["pid"] == proc.pid
    assert facts["pgid"] == proc.pid  # its own group: the executor's killpg reaches it and its children
    assert facts["pdeathsig"] == signal.SIGKILL
    assert facts["threads"] == 1
    assert facts["cwd"] == str(tmp_path)
    assert facts["env"] == dict(os.environ)  # the request's, not the zygote's pinned one
    assert facts["sigint"] == str(signal.default_int_handler)  # the zygote ignores SIGINT, a task does not
    fds = facts["fds"]
    assert fds["0"] == "/dev/null"
    assert fds["1"] == os.readlink("/proc/self/fd/1") and fds["2"] == os.readlink("/proc/self/fd/2")
    # nothing of the zygote's: no socket, no pidfd, no other task's status pipe
    others = {f: link for f, link in fds.items() if f not in ("0", "1", "2", str(facts["status_fd"]))}
    assert len(others) <= 1 and not any("socket" in v or "pidfd" in v or "pipe" in v for v in others.values()), fds


def test_a_running_task_does_not_hold_another_tasks_status_pipe():
    zygote = task_zygote.shared()
    first, r1 = _spawn(zygote, "sleep", "30")
    try:
        first_facts = _facts(r1)
        second, second_facts = _run(zygote)
        own_pipe = first_facts["fds"][str(first_facts["status_fd"])]
        assert own_pipe.startswith("pipe:")
        assert own_pipe not in second_facts["fds"].values()
        assert first_facts["numpy_draw"] != second_facts["numpy_draw"]  # numpy reseeded in each child
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        os.close(r1)
    _poll_until_reported(first)
    assert first.returncode == -signal.SIGKILL and not first.lost


@pytest.mark.parametrize(
    "what,arg,code",
    [
        ("exit", "3", 3),
        ("signal", str(int(signal.SIGSEGV)), -signal.SIGSEGV),
        ("signal", str(int(signal.SIGKILL)), -signal.SIGKILL),
        ("signal", str(int(signal.SIGBUS)), -signal.SIGBUS),
        ("raise", "", 1),
    ],
)
def test_exit_status_reads_as_popens(what, arg, code):
    """The returncode the executor gets is Popen's: exit code, or minus the signal."""
    proc, _ = _run(task_zygote.shared(), what, arg)
    assert proc.returncode == code
    via_popen = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys\n"
            f"w = {what!r}; a = {arg!r}\n"
            "if w == 'exit': os._exit(int(a))\n"
            "if w == 'signal': os.kill(os.getpid(), int(a))\n"
            "if w == 'raise': raise ValueError('x')\n",
        ],
        capture_output=True,
    )
    assert proc.returncode == via_popen.returncode
    assert describe_exit(proc.returncode, "") == describe_exit(via_popen.returncode, "")


def test_task_output_goes_to_the_supervisors_current_stdout_and_stderr(capfd):
    with capfd.disabled():
        zygote = task_zygote.shared()  # started (or found) while fd 1 and 2 were the terminal's
    _run(zygote, "print")
    out, err = capfd.readouterr()
    assert "out of the task" in out and "err of the task" in err


def test_one_zygote_per_environment(monkeypatch, tmp_path):
    first = task_zygote.shared()
    assert task_zygote.shared() is first
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test (call)")  # rewritten by pytest per test
    assert task_zygote.shared() is first
    monkeypatch.setenv("GRISTMILL_TEST_ZYGOTE_VAR", "1")  # a module may read it at import
    second = task_zygote.shared()
    assert second is not first and second.pid != first.pid
    assert first.proc.wait(timeout=10) is not None  # retired with no task running: ended and reaped
    _, facts = _run(second)
    assert facts["env"]["GRISTMILL_TEST_ZYGOTE_VAR"] == "1" and facts["ppid"] == second.pid
    monkeypatch.syspath_prepend(str(tmp_path))
    third = task_zygote.shared()
    assert third is not second
    monkeypatch.undo()
    assert task_zygote.shared() not in (first, second, third)  # the environment of before: a new one again


def test_a_forked_supervisor_starts_its_own_zygote_and_leaves_the_parents_alone():
    """A process forked from the supervisor (multiprocessing's fork) must not talk on the
    parent's socket: it gets a zygote of its own, and its exit does not end the parent's."""
    parent_zygote = task_zygote.shared()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked child
        code = 1
        try:
            own = task_zygote.shared()
            _, facts = _run(own)
            os.write(w, json.dumps([own.pid, facts["ppid"]]).encode())
            code = 0
        finally:
            task_zygote.reset()
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        child_zygote, child_task_parent = json.loads(f.read())
    assert os.waitpid(pid, 0)[1] == 0
    assert child_zygote != parent_zygote.pid and child_task_parent == child_zygote
    assert task_zygote.shared() is parent_zygote and parent_zygote.proc.poll() is None
    _, facts = _run(parent_zygote)
    assert facts["ppid"] == parent_zygote.pid


def test_a_retired_zygote_keeps_its_running_task_to_the_end(monkeypatch):
    old = task_zygote.shared()
    task, r = _spawn(old, "sleep", "30")
    try:
        _facts(r)
        monkeypatch.setenv("GRISTMILL_TEST_ZYGOTE_VAR", "2")
        new = task_zygote.shared()
        assert new is not old
        assert old.proc.poll() is None and task.poll() is None  # the task still runs, supervised
    finally:
        os.killpg(task.pid, signal.SIGKILL)
        os.close(r)
    _poll_until_reported(task)
    assert task.returncode == -signal.SIGKILL
    assert old.proc.wait(timeout=10) is not None  # then the old zygote ends


def test_importing_numpy_and_pyarrow_starts_threads_unless_pinned():
    """Why the zygote pins OpenBLAS and jemalloc: without the pins it could not fork safely."""
    code = "import os, numpy, pyarrow; print(len(os.listdir('/proc/self/task')))"
    env = {k: v for k, v in os.environ.items() if k not in task_zygote.PINNED_ENV}
    unpinned = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    pinned = subprocess.run(
        [sys.executable, "-c", code], env={**env, **task_zygote.PINNED_ENV}, capture_output=True, text=True, check=True
    )
    assert int(unpinned.stdout) > 1
    assert int(pinned.stdout) == 1


def test_a_zygote_with_a_thread_refuses_to_fork(tmp_path, monkeypatch):
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    zygote = task_zygote.Zygote(modules=("starts_a_thread",))
    try:
        with pytest.raises(task_zygote.ZygoteUnavailable, match="refused to fork: 2 threads"):
            _spawn(zygote)
    finally:
        zygote.close()


def test_preload_holds_what_a_crawl_task_imports(tmp_path, monkeypatch, wet_files, lid_model):
    """Unpickling the executor of every stage of a crawl run (curate, exact and near dedup,
    tokenization), or writing and reading a table, imports nothing the zygote has not."""
    cfg = from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "executor": {"type": "local", "tasks": 2, "workers": 2},
            "input": {"paths": [str(p) for p in wet_files]},
            "steps": [
                {"url_filter": {}},
                {"langid": {"model": str(lid_model)}},
                {"c4_lines": {}},
                {"gopher_repetition": {}},
                {"gopher_quality": {}},
                {"exact_dedup": {"granularity": "paragraph"}},
                {"near_dedup": {"threshold": 0.8}},
                {"tokenize": {"tokenizer": {"train": {"vocab_size": 512}}}},
            ],
        }
    )
    zygote = task_zygote.shared()
    stages = plan(cfg)
    assert len(stages) > 10
    for i, stage in enumerate(stages):
        path = tmp_path / f"executor{i}.pik"
        with open(path, "wb") as f:
            dill.dump(make_executor(stage), f)
        _, facts = _run(zygote, "unpickle", str(path))
        assert facts["imported"] == [], stage.name
    # nor does running one: pyarrow imports pandas on its first table from Python lists, and
    # pq.read_table imports pyarrow.dataset (0.35 CPU s a task, were they not preloaded)
    _, facts = _run(zygote, "tables", str(tmp_path / "t.parquet"))
    assert facts["imported"] == []


def test_a_supervisor_on_object_storage_has_its_filesystem_preloaded(monkeypatch):
    """s3fs is imported by the zygote when the supervisor has imported it (a run on S3), and
    only then: a local run's tasks do not pay for it."""
    pytest.importorskip("s3fs")
    import s3fs  # noqa: F401  (what a supervisor that listed or wrote an s3:// URL has)

    assert "s3fs" in task_zygote.preload()
    zygote = task_zygote.Zygote()
    try:
        _, facts = _run(zygote, "modules", "s3fs", "aiobotocore.session")
        assert facts["modules"] == ["s3fs", "aiobotocore.session"]
    finally:
        zygote.close()
    monkeypatch.delitem(sys.modules, "s3fs")  # a supervisor that never reached a store
    assert not set(task_zygote.PRELOAD_IF_IMPORTED) & set(task_zygote.preload())


def test_a_tasks_peak_memory_is_its_own_not_the_zygotes(tmp_path, monkeypatch):
    """The kernel resets the high-water mark at fork: a zygote that once held 600 MB forks
    tasks whose recorded peak (usage.py's VmHWM) is their own."""
    (tmp_path / "held_a_lot.py").write_text(
        "held = bytearray(600 << 20)\n"
        "held[:: 1 << 12] = b'\\1' * len(held[:: 1 << 12])  # touch every page: resident\n"
        "del held  # a large block goes back to the OS at once\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    zygote = task_zygote.Zygote(modules=("numpy", "held_a_lot"))
    try:
        _, facts = _run(zygote, "rss")
        status = dict(line.split(":", 1) for line in Path(f"/proc/{zygote.pid}/status").read_text().splitlines())
        assert int(status["VmHWM"].split()[0]) > 600 << 10  # kB: the zygote's own peak
        assert int(status["VmRSS"].split()[0]) < 300 << 10
        assert facts["rss_mb"] < 300, facts["rss_mb"]
    finally:
        zygote.close()


def test_killing_the_zygote_kills_its_tasks(fresh_state, log_lines):
    zygote = task_zygote.shared()
    task, r = _spawn(zygote, "sleep", "60")
    _facts(r)
    os.close(r)
    os.kill(zygote.pid, signal.SIGKILL)
    _poll_until_reported(task)
    assert task.returncode == -signal.SIGKILL and task.lost
    assert _wait_gone(task.pid) == []
    assert task_zygote.shared() is None  # from now on tasks start with exec
    assert task_zygote.shared() is None
    assert len([line for line in log_lines if "task zygote" in line]) == 1, log_lines


# --- through the executor ---------------------------------------------------------------------


class RecordProcess(PipelineStep):
    """Writes which process ran the task (`<rank>-<pid>.json`: its parent), then sleeps."""

    name = "record process"

    def __init__(self, folder: str, sleep_s: float = 0.0):
        super().__init__()
        self.folder, self.sleep_s = folder, sleep_s

    def run(self, data, rank: int = 0, world_size: int = 1):
        facts = {"rank": rank, "pid": os.getpid(), "ppid": os.getppid()}
        (Path(self.folder) / f"{rank}-{os.getpid()}.json").write_text(json.dumps(facts))
        time.sleep(self.sleep_s)
        yield from ()


def _executor(folder: Path, records: Path, tasks: int = 2, sleep_s: float = 0.0) -> LocalExecutor:
    return LocalExecutor(
        pipeline=[RecordProcess(str(records), sleep_s)],
        tasks=tasks,
        workers=2,
        logging_dir=str(folder),
        skip_completed=True,
        storage_config=None,
    )


def _records(folder: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in folder.glob("*.json")), key=lambda r: (r["rank"], r["pid"]))


def test_stages_run_in_the_same_zygote_and_in_exec_mode_as_children(tmp_path, monkeypatch):
    monkeypatch.delenv(task_zygote.START_ENV, raising=False)
    records = tmp_path / "records"
    records.mkdir()
    _executor(tmp_path / "stage1", records).run()
    _executor(tmp_path / "stage2", records).run()
    zygote = task_zygote.shared()
    forked = _records(records)
    assert len(forked) == 4 and {r["ppid"] for r in forked} == {zygote.pid}
    monkeypatch.setenv(task_zygote.START_ENV, "exec")
    assert task_zygote.shared() is None
    for p in records.iterdir():
        p.unlink()
    _executor(tmp_path / "stage3", records).run()
    assert {r["ppid"] for r in _records(records)} == {os.getpid()}


def test_a_stage_survives_the_zygote_dying_under_it(tmp_path, fresh_state, log_lines):
    """Its tasks die with it; they run again with exec, and the stage completes."""
    records = tmp_path / "records"
    records.mkdir()
    executor = _executor(tmp_path / "stage", records, sleep_s=2)
    zygote = task_zygote.shared()

    def kill_the_zygote_once_both_tasks_run():
        if len(list(records.glob("*.json"))) == 2 and zygote.proc.poll() is None:
            os.kill(zygote.pid, signal.SIGKILL)

    executor.run(on_poll=kill_the_zygote_once_both_tasks_run)
    assert executor.get_incomplete_ranks(range(2)) == []
    runs = _records(records)
    assert [r["ppid"] for r in runs if r["ppid"] == zygote.pid] == [zygote.pid] * 2
    assert sorted(r["rank"] for r in runs if r["ppid"] == os.getpid()) == [0, 1]  # again, with exec
    warnings = [line for line in log_lines if "task zygote" in line]
    assert len(warnings) == 1 and "died" in warnings[0], log_lines


def test_a_zygote_that_cannot_start_leaves_exec_and_one_warning(tmp_path, monkeypatch, fresh_state, log_lines):
    monkeypatch.setattr(task_zygote, "_ZYGOTE_CMD", "import os; os._exit(3)")
    records = tmp_path / "records"
    records.mkdir()
    _executor(tmp_path / "stage1", records).run()
    _executor(tmp_path / "stage2", records).run()
    assert {r["ppid"] for r in _records(records)} == {os.getpid()}
    assert len(_records(records)) == 4
    warnings = [line for line in log_lines if "task zygote" in line]
    assert len(warnings) == 1 and "exit status 3" in warnings[0], log_lines


_SUPERVISOR = """
import os, sys, threading, time
sys.path[:0] = [{src!r}, {repo!r}]
from gristmill.pipeline.execution import zygote as task_zygote
from tests.pipeline.test_task_zygote import _spawn, _facts
zygote = None
def start():
    global zygote
    zygote = task_zygote.shared()
if {from_thread!r}:
    t = threading.Thread(target=start)
    t.start()
    t.join()  # PR_SET_PDEATHSIG would fire now, were it tied to this thread
    time.sleep(0.5)
else:
    start()
assert zygote.proc.poll() is None, "the zygote died with the thread that started it"
task, r = _spawn(zygote, "sleep", "60")
_facts(r)
print(zygote.pid, task.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("from_thread", [False, True])
def test_supervisor_killed_by_sigkill_leaves_no_zygote_and_no_task(from_thread):
    script = _SUPERVISOR.format(src=str(REPO / "src"), repo=str(REPO), from_thread=from_thread)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line, "the supervisor script ended before its task ran"
        zygote_pid, task_pid = map(int, line.split())
        assert not _gone(zygote_pid) and not _gone(task_pid)
        proc.kill()
        proc.wait()
        assert _wait_gone(zygote_pid, task_pid) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


_COUNTED = """
import json, os, resource, sys
sys.path[:0] = [{src!r}, {repo!r}]
from gristmill.pipeline.execution import zygote as task_zygote
from tests.pipeline.test_task_zygote import _run
_run(task_zygote.shared(), "burn", "1.0")
own = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps(own.ru_utime + own.ru_stime))
"""


def test_the_zygote_and_its_tasks_count_in_the_commands_children():
    """A command waits for its zygote at exit, so `time` and getrusage(RUSAGE_CHILDREN) of whoever
    started the command count the zygote's imports and the tasks it reaped (benchmarks rely on it)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run(
        [sys.executable, "-c", _COUNTED.format(src=str(REPO / "src"), repo=str(REPO))],
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    command_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert command_cpu - json.loads(res.stdout) >= 1.0  # the task's burn, reaped by the zygote
