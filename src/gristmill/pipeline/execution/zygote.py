"""Task processes forked from a pre-imported zygote instead of started as fresh interpreters.

A local task used to be a fresh `python -c` that imported gristmill, datatrove (→ fsspec,
huggingface_hub), pyarrow and numpy before reading a byte: ~0.6 CPU s per task, thousands of
times in a test run, six times in a small pipeline run. The zygote is one fresh interpreter per
supervising process that imports all of that once (`PRELOAD`) and then forks a child per task
(the forkserver pattern):

- It is started with the supervisor's interpreter, `sys.path` and environment and is reused
  while those stay the same (`_key`): a module may read the environment at import, so a changed
  variable (a test's `monkeypatch.setenv`, storage settings) starts a new zygote and retires
  the old one. Only `VOLATILE_ENV` is left out of the comparison (pytest rewrites it per test;
  nothing reads it at import). The child gets the request's environment and working directory.
- It forks only while single-threaded (a fork copies one thread; a lock held by another thread
  at that moment stays held forever in the child): OpenBLAS's and Arrow's jemalloc's threads are
  pinned off in its environment (`PINNED_ENV`), and every fork checks /proc/self/task.
- Each child is its own process group (the supervisor's `killpg` stops it with its
  descendants), dies with the zygote (PR_SET_PDEATHSIG), and the zygote dies with the
  supervisor (PR_SET_PDEATHSIG, and EOF on its socket): a supervisor killed by SIGKILL leaves no
  task running. The supervisor cannot wait for a grandchild: the zygote reaps its children and
  reports each wait status; `ForkedProcess` is the supervisor's Popen-like handle of one
  (`pid`, `poll()`, `returncode` negative for a signal).
- The task's status pipe and the supervisor's stdout/stderr travel with each request
  (SCM_RIGHTS over a unix socket pair). The zygote keeps its copy of the status pipe open until
  it has sent the child's exit status, so a supervisor woken by the pipe's EOF finds the status
  already waiting.
- A child's VmHWM starts at its own resident set: the kernel resets the high-water mark at fork,
  so a task's `max_rss_mb` (`usage.py`) is its own, as with exec.

`GRISTMILL_TASK_START=exec` keeps the fresh-interpreter start. A zygote that cannot start, will
not fork or dies turns this process back to exec after one warning line; tasks that died with
it are run again by the executor (`ForkedProcess.lost`).
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

START_ENV = "GRISTMILL_TASK_START"  # "fork" (default) or "exec"
#: what `_task_main` and unpickling a crawl stage's executor import (with the step modules,
#: `core.step.STEP_MODULES`), and the libraries the steps load lazily in `run` (cheap once numpy
#: is in). A module that fails to import is skipped: the task meets the same error in its own log.
PRELOAD = (
    "numpy",
    "pyarrow",
    "pyarrow.parquet",
    # pyarrow imports pandas the first time it builds an array from a Python list (to ask whether
    # the list is a pandas object) and pyarrow.dataset (which pq.read_table uses): 0.35 CPU s in
    # every task that writes or reads a table, were they imported after the fork
    "pandas",
    "pyarrow.dataset",
    "dill",
    "datatrove.executor.local",
    "gristmill.pipeline.execution.executors",
    "gristmill.pipeline.execution.task",
)
PRELOAD_LIBRARIES = ("fasttext", "kenlm", "tokenizers", "tiktoken")
#: fsspec's object-storage filesystems: imported by the zygote as well when the supervisor has
#: imported them (its run reads or writes a store), since every task of such a run imports one
#: (s3fs with aiobotocore: 0.17 CPU s a task, of the ~0.4 that a task on S3 spends before its
#: first byte); never otherwise, a local run's tasks need none. Importing one starts no thread.
PRELOAD_IF_IMPORTED = ("s3fs", "gcsfs", "adlfs")
#: set in the zygote's own environment so that importing numpy and pyarrow starts no thread;
#: the children keep the libraries as imported (single-threaded BLAS per task, Arrow's default
#: memory pool is mimalloc), and see the request's environment.
PINNED_ENV = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
#: environment variables that change between requests without mattering to any import
VOLATILE_ENV = frozenset({"PYTEST_CURRENT_TEST"})
REPLY_TIMEOUT_S = 120.0  # the first request waits for the zygote's imports (seconds on a busy machine)
_MAX_MESSAGE = 1 << 20
_WAIT_POLL_S = 0.05  # ForkedProcess.wait: how often it asks for the status
_RLIMITS = (resource.RLIMIT_AS, resource.RLIMIT_DATA, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE)

_ZYGOTE_CMD = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from gristmill.pipeline.execution.zygote import _zygote_main; _zygote_main()"
)


class ZygoteUnavailable(RuntimeError):
    """The zygote could not start, refused to fork, or died; `str()` says which."""


def mode() -> str:
    """How tasks start: `fork` (from the zygote) or `exec` (a fresh interpreter each)."""
    value = os.environ.get(START_ENV, "fork").strip().lower() or "fork"
    if value not in ("fork", "exec"):
        _warn_once(f"{START_ENV}={value!r} is neither 'fork' nor 'exec': tasks are forked")
        return "fork"
    return value


def _umask() -> str:
    try:
        with open("/proc/self/status") as f:
            return next((line.split()[1] for line in f if line.startswith("Umask:")), "")
    except OSError:
        return ""


def _key() -> tuple:
    """What a zygote's imports may depend on (and what a child inherits from it rather than from
    the request: umask, resource limits); a request is served by a zygote started with the same."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k not in VOLATILE_ENV))
    return (sys.executable, tuple(sys.path), env, _umask(), tuple(resource.getrlimit(r) for r in _RLIMITS))


def _threads() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            names.append(tid)
    return names


def _pinned(env) -> dict[str, str]:
    """`env` with `PINNED_ENV` over it; a jemalloc configuration of the user's is kept, the pin last (it wins)."""
    out = {**env, **PINNED_ENV}
    if env.get("JE_ARROW_MALLOC_CONF"):
        out["JE_ARROW_MALLOC_CONF"] = f"{env['JE_ARROW_MALLOC_CONF']},{PINNED_ENV['JE_ARROW_MALLOC_CONF']}"
    return out


def preload() -> tuple[str, ...]:
    from gristmill.core.step import STEP_MODULES

    stores = tuple(m for m in PRELOAD_IF_IMPORTED if m in sys.modules)
    return (*PRELOAD, *STEP_MODULES, *PRELOAD_LIBRARIES, *stores)


def die_with_parent(parent: int) -> None:
    """Linux: this process gets SIGKILL when its parent dies, even by SIGKILL."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


# --- the supervisor's side -------------------------------------------------------------------


class ForkedProcess:
    """A task forked by the zygote, as the supervisor sees it: what `subprocess.Popen` offers the
    executors (`pid`, `poll()`, `wait()`, `returncode`: the exit code, or minus the signal that
    killed it)."""

    def __init__(self, zygote: Zygote, pid: int):
        self.pid, self.returncode, self._zygote = pid, None, zygote
        #: the task died because the zygote did (PR_SET_PDEATHSIG), not by anything of its own
        self.lost = False
        try:  # to see the process gone when no status will come (the zygote died)
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        status = self._zygote.exit_status(self.pid)
        if status is not None:
            self.returncode = os.waitstatus_to_exitcode(status)
        elif self._zygote.dead:
            try:
                os.killpg(self.pid, signal.SIGKILL)  # PR_SET_PDEATHSIG's SIGKILL, and its descendants
            except (ProcessLookupError, PermissionError):
                pass
            if self._pidfd is None or select.select([self._pidfd], [], [], 0)[0]:
                self.returncode, self.lost = -signal.SIGKILL, True
                self._zygote.forget(self.pid)
        if self.returncode is not None and self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return self.returncode

    def wait(self) -> int:
        """Block until the task has exited (the zygote reaps it and reports its status: polled)."""
        while self.poll() is None:
            time.sleep(_WAIT_POLL_S)
        return self.returncode


class Zygote:
    """One zygote process and the supervisor's end of its socket."""

    def __init__(self, key: tuple | None = None, modules: tuple[str, ...] | None = None):
        self.key = key if key is not None else _key()
        self.dead = self.retired = self.closed = False
        self._exits: dict[int, int] = {}  # pid → wait status, reported and not yet asked for
        self._running: set[int] = set()
        self._next_id = 0
        self._lock = threading.RLock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # PR_SET_PDEATHSIG follows the thread that forked: a zygote started from another thread
        # would die with that thread. There, EOF on the socket (at the supervisor's death) alone ends it.
        tied = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _ZYGOTE_CMD,
                    json.dumps(sys.path),
                    str(theirs.fileno()),
                    str(os.getpid() if tied else 0),
                    json.dumps(list(preload() if modules is None else modules)),
                ],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                process_group=0,  # not in the terminal's group: Ctrl-C is the supervisor's to handle
                env=_pinned(os.environ),
            )
        except OSError as e:
            ours.close()
            raise ZygoteUnavailable(f"the task zygote could not start: {e}") from e
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self._sock = ours

    def spawn(
        self,
        target: str,
        args: list[str],
        pass_fds: tuple[int, ...] = (),
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ForkedProcess:
        """Fork a child that calls `target` ("module:function") as `function(*pass_fds, *args)`
        with the fds it was given (numbered anew in the child), in `cwd` and `env` (default: this
        process's working directory and environment); the function is expected to end the
        process (`os._exit`)."""
        with self._lock:
            if self.dead or self.retired:
                raise ZygoteUnavailable(f"the task zygote (pid {self.pid}) is gone")
            self._next_id += 1
            request = {
                "id": self._next_id,
                "target": target,
                "args": args,
                "cwd": os.getcwd() if cwd is None else cwd,
                "env": dict(os.environ) if env is None else env,
            }
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()], [_fd_or_null(1), _fd_or_null(2), *pass_fds])
            except OSError as e:
                self.dead = True
                raise ZygoteUnavailable(f"the task zygote (pid {self.pid}) took no request: {e}") from e
            try:
                reply = self._wait_reply(self._next_id)
            except BaseException:
                # interrupted (SIGTERM, Ctrl-C) or timed out: a child may be forked that no one
                # would supervise. Closing ends the zygote and, with it, its children.
                self.close()
                raise
            if "error" in reply:
                self.close()
                raise ZygoteUnavailable(f"the task zygote (pid {self.pid}) refused to fork: {reply['error']}")
            self._running.add(reply["pid"])
            return ForkedProcess(self, reply["pid"])

    def exit_status(self, pid: int) -> int | None:
        """The wait status of child `pid` if the zygote has reported it (each is given out once)."""
        with self._lock:
            self._read(block_s=0)
            status = self._exits.pop(pid, None)
            if status is not None:
                self.forget(pid)
            return status

    def forget(self, pid: int) -> None:
        with self._lock:
            self._running.discard(pid)
            if self.retired and not self._running:
                self.close()

    def retire(self) -> None:
        """Take no more requests; close once the running children are reported."""
        with self._lock:
            self.retired = True
            if not self._running:
                self.close()

    def close(self) -> None:
        """End the zygote (it kills the children it still has) and reap it."""
        with self._lock:
            self.dead = self.retired = self.closed = True
            if self._sock.fileno() != -1:
                self._sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _wait_reply(self, request_id: int) -> dict:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            for msg in self._read(block_s=max(0.0, deadline - time.monotonic())):
                if msg.get("id") == request_id:
                    return msg
            if self.dead:
                try:  # its socket closes a moment before it has exited
                    how = f"exit status {self.proc.wait(timeout=5)}"
                except subprocess.TimeoutExpired:
                    how = "its socket closed"
                raise ZygoteUnavailable(f"the task zygote (pid {self.pid}) died ({how})")
            if time.monotonic() >= deadline:
                raise ZygoteUnavailable(f"the task zygote (pid {self.pid}) did not answer in {REPLY_TIMEOUT_S:.0f} s")

    def _read(self, block_s: float) -> list[dict]:
        """Messages waiting on the socket (waiting up to `block_s` for the first); exit reports
        are filed, the rest returned. EOF marks the zygote dead."""
        replies: list[dict] = []
        if self.dead:
            return replies
        wait = block_s
        while True:
            if not select.select([self._sock], [], [], wait)[0]:
                return replies
            wait = 0
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                self.dead = True
                return replies
            msg = json.loads(data)
            if "status" in msg:
                self._exits[msg["pid"]] = msg["status"]
            else:
                replies.append(msg)


def _fd_or_null(fd: int) -> int:
    """`fd` if open, else /dev/null's (a supervisor without stdout still gets its tasks started)."""
    try:
        os.fstat(fd)
        return fd
    except OSError:
        return _devnull()


_DEVNULL: int | None = None


def _devnull() -> int:
    global _DEVNULL
    if _DEVNULL is None:
        _DEVNULL = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    return _DEVNULL


_shared: Zygote | None = None
_given_up: str | None = None
_shared_lock = threading.Lock()


def shared() -> Zygote | None:
    """This process's zygote for its current interpreter, path and environment, started if need
    be (an older one is retired); None when tasks start with exec (`mode()`, or given up)."""
    global _shared
    if mode() != "fork" or not sys.platform.startswith("linux"):
        return None
    with _shared_lock:
        if _given_up is not None:
            return None
        key = _key()
        if _shared is not None and _shared.key != key:
            _shared.retire()
            _shared = None
        if _shared is not None and _shared.closed:  # closed on purpose (an interrupted request)
            _shared = None
        if _shared is not None and (_shared.dead or _shared.proc.poll() is not None):
            zygote, _shared = _shared, None
            zygote.close()
            _give_up(f"the task zygote (pid {zygote.pid}) died (exit status {zygote.proc.returncode})")
            return None
        if _shared is None:
            try:
                _shared = Zygote(key)
            except ZygoteUnavailable as e:
                _give_up(str(e))
                return None
            _close_at_exit()
        return _shared


_atexit_registered = False


def _forget_after_fork() -> None:
    """In a process forked from one that has a zygote: the socket is the parent's to use."""
    global _shared
    if _shared is not None:
        _shared._sock.close()  # this process's copy only: the parent's end stays open
        _shared = None


os.register_at_fork(after_in_child=_forget_after_fork)


def _close_at_exit() -> None:
    """At this process's exit, end its zygote and wait for it: nothing lingers after a command,
    and its CPU time and its tasks' count in this process's children (`time`, `getrusage`)."""
    global _atexit_registered
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(reset)


def give_up(why: str) -> None:
    """Start tasks with exec from now on in this process, after one warning line saying why."""
    global _shared
    with _shared_lock:
        zygote, _shared = _shared, None
        _give_up(why)
    if zygote is not None:
        zygote.close()


def _give_up(why: str) -> None:
    global _given_up
    if _given_up is None:
        _given_up = why
        _warn_once(f"{why}; task processes start as fresh interpreters from now on ({START_ENV}=exec)")


_warned: set[str] = set()


def _warn_once(line: str) -> None:
    from loguru import logger

    if line not in _warned:
        _warned.add(line)
        logger.warning(line)


def reset() -> None:
    """Forget the zygote and any earlier failure (it is closed); the next task starts a new one."""
    global _shared, _given_up
    with _shared_lock:
        zygote, _shared, _given_up = _shared, None, None
    if zygote is not None:
        zygote.close()


# --- the zygote's side -----------------------------------------------------------------------


def _zygote_main() -> None:
    """Entry point of the zygote process: import, then serve fork requests until EOF."""
    sock_fd, supervisor, preload = int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    if supervisor:
        die_with_parent(supervisor)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its children get Python's default back
    sock = socket.socket(fileno=sock_fd)
    for name in preload:
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001, S110 - a missing optional module: the task reports its own error
            pass
    try:
        _serve(sock)
    finally:
        os._exit(0)  # nothing to tidy: no atexit work of the imported modules


def _serve(sock: socket.socket) -> None:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    children: dict[int, tuple[int, list[int]]] = {}  # pidfd → (pid, fds held until it is reported)
    try:
        while True:
            for fd, _ in poller.poll():
                if fd != sock.fileno():
                    pid, held = children.pop(fd)
                    poller.unregister(fd)
                    _, status = os.waitpid(pid, 0)
                    sock.send(json.dumps({"pid": pid, "status": status}).encode())
                    for f in (fd, *held):
                        os.close(f)
                    continue
                msg, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 16)
                if not msg:  # the supervisor closed its end or died
                    return
                request = json.loads(msg)
                threads = _threads()
                if len(threads) != 1:
                    for f in fds:
                        os.close(f)
                    sock.send(json.dumps({"id": request["id"], "error": f"{len(threads)} threads: {threads}"}).encode())
                    continue
                own = [sock.fileno(), *children, *(f for _, held in children.values() for f in held)]
                try:
                    pid = _fork(request, fds, own)
                except OSError as e:  # EAGAIN, ENOMEM: the supervisor starts tasks another way
                    for f in fds:
                        os.close(f)
                    sock.send(json.dumps({"id": request["id"], "error": f"fork: {e}"}).encode())
                    continue
                os.close(fds[0])
                os.close(fds[1])
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, fds[2:])
                poller.register(pidfd, select.POLLIN)
                sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())
    except OSError:
        return  # the supervisor is gone (EPIPE): end, and the children with us
    finally:
        for pid, _ in children.values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _fork(request: dict, fds: list[int], own: list[int]) -> int:
    zygote = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        try:
            os.setpgid(pid, pid)  # also here: the pid is handed out only once its group exists
        except OSError:
            pass  # the child did it first, or already exited
        return pid
    try:  # the child: never returns into the zygote's loop
        os.setpgid(0, 0)
        die_with_parent(zygote)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for f in own:
            os.close(f)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.close(fds[0])
        os.close(fds[1])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "numpy" in sys.modules:  # every task its own stream, as in a fresh interpreter (`random` reseeds itself)
            sys.modules["numpy"].random.seed()
        module, _, function = request["target"].partition(":")
        getattr(importlib.import_module(module), function)(*fds[2:], *request["args"])
    except BaseException:  # noqa: BLE001 - the child's own stderr is the task's
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)
