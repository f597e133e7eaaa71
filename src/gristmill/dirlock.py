"""An exclusive lock on a directory that gristmill writes (a run directory, a training output).

Two commands writing one directory at once interleave files and logs and die on each other's
renames, so the second one must stop at once with a message naming the first. The lock is
an `flock` on `<dir>/.gristmill.lock`: the kernel releases it when the holder dies (killed,
OOM, power loss of a node), so a lock left by a dead process is never mistaken for a live
one. The file also records who holds it (pid, host, command, since) for the message; that
text is informational only: the flock decides.

Child processes forked by the holder (datatrove's pool workers) inherit the descriptor and
keep the lock until they end, which is right: they are still writing.

On a filesystem without working `flock` (some NFS setups answer ENOLCK), the recorded pid is
checked instead: held if that pid runs on this host, stale (taken over, with a warning)
otherwise.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gristmill.core.files import naming

LOCK_NAME = ".gristmill.lock"


class LockHeld(RuntimeError):
    """Another live process holds the directory."""


def _describe(info: dict) -> str:
    if not info:
        return "another process (it recorded no details)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
    host = info.get("host", "?")
    where = "" if host == socket.gethostname() else f" on {host}"
    return f"pid {info.get('pid', '?')}{where} since {since} ({' '.join(info.get('command', []))})"


def read_holder(directory: Path) -> dict:
    try:
        return json.loads((Path(directory) / LOCK_NAME).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def hold(directory: str | os.PathLike, what: str = "directory") -> Iterator[Path]:
    """Hold `directory` exclusively for the `with` block; raise LockHeld if someone else does.

    `what` names the directory in the message ("run directory", "training output").
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    acquired = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(
                f"{what} {directory} is in use by {_describe(read_holder(directory))}; "
                "wait for it to finish, or use another directory"
            ) from None
        except OSError as e:
            if e.errno != errno.ENOLCK:
                raise
            info = read_holder(directory)
            if (
                info.get("host") == socket.gethostname()
                and info.get("pid") not in (None, os.getpid())
                and _pid_alive(int(info["pid"]))
            ):
                raise LockHeld(f"{what} {directory} is in use by {_describe(info)}") from None
            if info:
                print(f"warning: {path}: taking over a stale lock of {_describe(info)}", file=sys.stderr)
        acquired = True
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "command": sys.argv}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError as e:  # a full disk: say which (the lock itself is the flock, already held)
            raise naming(e, path) from None
        yield directory
    finally:
        if acquired:  # clear our record before the flock goes; never touch another holder's
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
        os.close(fd)
