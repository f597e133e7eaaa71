"""The run directory: one interface (`RunDir`), a local folder or a prefix on object storage.

`open_run_dir(location)` gives the one for a path or URL; `run_dir_kind(location)` its class,
whose `refusals(cfg)` the config's validation asks before anything runs.
"""

from __future__ import annotations

import os

from gristmill.core import storage
from gristmill.pipeline.rundir.base import RunDir
from gristmill.pipeline.rundir.local import LocalRunDir
from gristmill.pipeline.rundir.store import StoreRunDir, local_view

__all__ = ["LocalRunDir", "RunDir", "StoreRunDir", "local_view", "open_run_dir", "run_dir_kind"]


def run_dir_kind(location: str | os.PathLike) -> type[RunDir]:
    return StoreRunDir if storage.is_url(str(location)) else LocalRunDir


def open_run_dir(location: str | os.PathLike) -> RunDir:
    return run_dir_kind(location)(location)
