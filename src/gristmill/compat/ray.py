"""Ray internals gristmill leans on, in one place (the `ray` extra).

- Finding the cluster: `ray.init(address=...)` resolves "auto" (RAY_ADDRESS, else the
  `ray_current_cluster` file of the last `ray start`, else any GCS process on this machine) and
  lets RAY_ADDRESS win over an explicit address, in
  `ray._private.services.canonicalize_bootstrap_address_or_die`. We call it ourselves to learn
  the address before `ray.init` so that it can be checked with a plain TCP connect: `ray.init`
  on an address where nothing listens retries for minutes (measured with Ray 2.60: still
  retrying 127.0.0.1:1 after 2 minutes).
- The connect window: `ray._private.node.Node._init_gcs_client` tries `RAY_gcs_server_port_wait_time_s`
  times, a second apart (20 by default) before it gives up on a GCS that answers but refuses
  (a wrong token): we set it from the configured timeout when the environment does not.
- Token authentication (on by default for clusters started by Ray 2.60): `ray.init` switches
  itself to token mode when a token is available (~/.ray/auth_token, RAY_AUTH_TOKEN,
  RAY_AUTH_TOKEN_PATH) only for address "auto"; with an explicit address it connects without
  the token and is refused. `maybe_enable_token_auth_if_token_available` is what "auto" calls;
  we call it for every address (its "token authentication is enabled" warning silenced), and
  `_enable_token_auth` (which re-reads Ray's configuration) when RAY_AUTH_MODE=token was set
  after Ray was imported.
- The driver's raylet: `ray._private.worker.global_worker.node.raylet_socket_name`, the Unix
  socket of the raylet of the node the driver runs on. When that raylet dies, the driver's core
  worker notices only after about a minute and then ends the process from C++ with Ray's log
  lines alone (no Python exception, no atexit): `raylet_gone` probes the socket so that the
  executor can stop first with its own line.
- While `ray.init` connects, Ray's C++ client prints a warning line per failed attempt to
  stderr (fd 2, not Python's logging): we hold those lines back and show them only if the
  connection succeeded, so a failure is one line. The reason of a failure is the last line of
  the `__cause__` of the ConnectionError `ray.init` raises (a traceback as text).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import tempfile
from contextlib import contextmanager

#: Ray versions this module was written and tested for
WRITTEN_FOR = ("2.60",)

GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"


class Unreachable(ConnectionError):
    """No Ray cluster could be connected to; `str()` is one line saying why."""


def resolve_address(address: str) -> str:
    """host:port of the cluster `address` names ("auto", host:port; RAY_ADDRESS wins, as in
    `ray.init`), or the address itself for Ray Client (ray://)."""
    if address.startswith("ray://"):
        return address
    from ray._private.services import canonicalize_bootstrap_address_or_die

    try:
        return canonicalize_bootstrap_address_or_die(address)
    except ConnectionError as e:  # "auto" found nothing (or found several)
        raise Unreachable(" ".join(str(e).split())) from None
    except ValueError as e:
        raise Unreachable(f"not an address: {e}") from None


def check_reachable(address: str, timeout_s: float) -> None:
    """A TCP connect to the head (quick, unlike `ray.init`): Unreachable if nothing answers."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise Unreachable(f"{address}: expected host:port")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except TimeoutError:
        raise Unreachable(f"nothing answered at {hostport} within {timeout_s:g} s") from None
    except OSError as e:
        raise Unreachable(f"cannot reach {hostport}: {e.strerror or e}") from None


def _enable_token_auth_if_available() -> None:
    from ray._private.authentication import authentication_token_setup as setup
    from ray._raylet import AuthenticationMode, get_authentication_mode

    quiet = logging.getLogger(setup.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        mode = os.environ.get(setup.AUTH_MODE_ENV_VAR)
        if mode is None:
            setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        elif mode.lower() == "token" and get_authentication_mode() != AuthenticationMode.TOKEN:
            # set after Ray read its configuration (Ray imported earlier in this process)
            setup._enable_token_auth()
    finally:
        quiet.setLevel(level)


@contextmanager
def _stderr_held():
    """fd 2 goes to a temporary file; yields a function that returns what was written."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)

        def text() -> str:
            held.seek(0)
            return held.read().decode("utf-8", "replace")

        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextmanager
def _gcs_wait(timeout_s: float):
    """RAY_gcs_server_port_wait_time_s from the timeout while `ray.init` connects, unless the
    environment sets it; then as before (set for good, it would reach the commands started from
    this process and every later connect in it)."""
    own = GCS_WAIT_ENV not in os.environ
    if own:
        os.environ[GCS_WAIT_ENV] = str(max(1, math.ceil(timeout_s)))
    try:
        yield
    finally:
        if own:
            os.environ.pop(GCS_WAIT_ENV, None)


def _reason(error: BaseException) -> str:
    """The last line of the innermost cause's message (Ray puts a traceback text there)."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = (lines[-1] if lines else type(error).__name__).removeprefix("ray.exceptions.")
    return reason.split(". Ensure that")[0]  # the token hint is ours to give, once


def connect(address: str, timeout_s: float, runtime_env: dict | None = None) -> str:
    """`ray.init` on an existing cluster, or Unreachable (one line) within about `timeout_s`.
    Returns the address connected to."""
    import ray

    resolved = resolve_address(address)
    check_reachable(resolved, min(timeout_s, 5.0))
    _enable_token_auth_if_available()
    with _stderr_held() as held, _gcs_wait(timeout_s):
        try:
            ray.init(
                address=resolved,
                logging_level=logging.WARNING,
                log_to_driver=True,
                runtime_env=runtime_env,
            )
        except (ConnectionError, RuntimeError, ValueError) as e:
            reason = _reason(e)
            if "InvalidAuthToken" in reason:
                reason += " (give the cluster's token in ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)"
            raise Unreachable(f"cannot connect to the Ray cluster at {resolved}: {reason}") from None
        else:
            shown = held()
    if shown:
        sys.stderr.write(shown)
    return resolved


def raylet_gone() -> str | None:
    """The socket of this driver's raylet if nothing answers on it any more (the raylet died),
    else None (alive, or not known: Ray decides)."""
    try:
        from ray._private import worker

        path = worker.global_worker.node.raylet_socket_name
    except Exception:  # noqa: BLE001 - not connected, or another Ray's internals
        return None
    if not isinstance(path, str) or not path.startswith("/"):
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return path
        except OSError:
            return None
    return None
