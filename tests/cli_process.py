"""`pipeline ...` as a process of its own, forked from a warm one: what `subprocess.run([python,
"-m", "gristmill.cli", ...], capture_output=True, text=True)` gives, without its imports.

The suite runs the command line ~200 times. Each fresh interpreter spent 0.5–1.5 CPU s importing
gristmill, datatrove, pyarrow and pandas before doing anything: a fifth of the suite's CPU time on
a 2-core machine. `pipeline()` forks each command from a zygote (`gristmill.pipeline.execution.zygote`,
the one that starts local tasks) that imported all of that once per test worker. The command is
still its own process: own pid and process group, the test's environment and working directory,
its stdout and stderr captured, its exit status what `python -m gristmill.cli` would return
(`SystemExit`, an uncaught exception's traceback and 1, atexit handlers run). What it does not
cover, the tests that need it keep a real interpreter: that the entry point imports (tests/test_cli.py),
what importing pulls in (tests/pipeline/test_planner.py: no torch at planning), signals sent to a
command or to its terminal's process group (tests/pipeline/test_worker_faults.py), what the
interpreter reads when it starts (PYTHONHASHSEED: tests/tokenize/test_tokens.py) and limits set
before it starts (RLIMIT_FSIZE). A variable set for a command is seen when the command reads it;
no gristmill module reads the environment at import.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from gristmill.pipeline.execution import zygote as task_zygote

#: what the commands import: the task zygote's list (steps, datatrove, pyarrow) and the command line
PRELOAD = (
    "gristmill.cli",
    "gristmill.pipeline.report.journey",
    "gristmill.pipeline.report.page",
    "gristmill.tokenize.cli",
)
_zygote: task_zygote.Zygote | None = None
_lock = threading.Lock()


def _runner() -> task_zygote.Zygote | None:
    global _zygote
    with _lock:
        if _zygote is not None and (_zygote.dead or _zygote.proc.poll() is not None):
            _zygote.close()
            _zygote = None
        if _zygote is None:
            try:
                _zygote = task_zygote.Zygote(modules=(*task_zygote.preload(), *PRELOAD, "tests.cli_process"))
            except task_zygote.ZygoteUnavailable:
                return None
            atexit.register(_zygote.close)
        return _zygote


def pipeline(
    *args,
    env: dict[str, str] | None = None,
    cwd=None,
    timeout: float | None = None,
    check: bool = False,
    input: str | bytes | None = None,  # noqa: A002 - subprocess.run's name
    text: bool = True,
) -> subprocess.CompletedProcess:
    """`pipeline ARGS` run to the end, as `subprocess.run(..., capture_output=True, text=True)`
    returns it (`TimeoutExpired` past `timeout`, `CalledProcessError` with `check`; bytes with
    `text=False`)."""
    argv = [str(a) for a in args]

    def fresh() -> subprocess.CompletedProcess:  # where no zygote serves: a fresh interpreter, as before
        return subprocess.run(
            [sys.executable, "-m", "gristmill.cli", *argv],
            env=env, cwd=cwd, timeout=timeout, check=check, input=input, capture_output=True, text=text,
        )  # fmt: skip

    zygote = _runner()
    if zygote is None:
        return fresh()
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if input is not None:
            stdin.write(input.encode() if isinstance(input, str) else input)
            stdin.seek(0)
        try:
            child = zygote.spawn(
                "tests.cli_process:_command",
                argv,
                pass_fds=(stdin.fileno(), out.fileno(), err.fileno()),
                cwd=os.fspath(cwd) if cwd is not None else None,
                env=dict(os.environ if env is None else env),
            )
        except task_zygote.ZygoteUnavailable:  # it refused to fork or died: the next call starts another
            return fresh()
        deadline = None if timeout is None else time.monotonic() + timeout
        while child.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.wait()
                raise subprocess.TimeoutExpired(["pipeline", *argv], timeout, _read(out, text), _read(err, text))
            time.sleep(0.02)
        res = subprocess.CompletedProcess(["pipeline", *argv], child.returncode, _read(out, text), _read(err, text))
    if check:
        res.check_returncode()
    return res


def _read(f, text: bool) -> str | bytes:
    f.seek(0)
    data = f.read()
    return data.decode() if text else data


def _command(stdin: int, out: int, err: int, *argv: str) -> None:
    """In the forked child: the command's fds in place, then `python -m gristmill.cli ARGV`."""
    for fd, to in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(fd, to)
        os.close(fd)
    tempfile.tempdir = None  # the zygote's choice, if it made one: TMPDIR is the request's
    import gristmill.cli

    sys.argv = [gristmill.cli.__file__, *argv]
    try:
        raise SystemExit(gristmill.cli.main())  # as `python -m gristmill.cli` ends: sys.exit(main())
    except SystemExit as e:  # what the interpreter makes of it
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: its traceback and exit status 1
        import traceback

        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
