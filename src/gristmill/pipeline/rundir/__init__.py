"""The run directory: one interface (`RunDir`), a local folder or a prefix on object storage.

`open_run_dir(location)` gives the one for a path or URL; what each kind cannot serve is declared
in `gristmill.core.run_dir_kinds`, which the config's validation asks before anything runs.
"""

from __future__ import annotations

import os

from gristmill.core import storage
from gristmill.pipeline.rundir.base import RunDir
from gristmill.pipeline.rundir.local import LocalRunDir
from gristmill.pipeline.rundir.store import StoreRunDir, local_view

__all__ = ["LocalRunDir", "RunDir", "StoreRunDir", "local_view", "open_run_dir"]


def open_run_dir(location: str | os.PathLike, config: storage.StorageConfig | None = None) -> RunDir:
    """The run directory at `location`; one on object storage is reached with `config` (the
    run's `storage:` settings; default: this process's)."""
    return StoreRunDir(str(location), config) if storage.is_url(str(location)) else LocalRunDir(location)
