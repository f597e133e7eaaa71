"""A run directory in a local folder (or a shared filesystem every Slurm or Ray node mounts)."""

from __future__ import annotations

import os
import shutil
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from gristmill.core.files import write_text_atomic
from gristmill.core.messages import ConfigError
from gristmill.dirlock import hold
from gristmill.pipeline.report import journey as st
from gristmill.pipeline.rundir import layout
from gristmill.pipeline.rundir.base import RunDir

if TYPE_CHECKING:
    from gristmill.config import RunConfig
    from gristmill.core.step import Stage


class LocalRunDir(RunDir):
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    def entries(self, *parts: str) -> dict[str, str]:
        folder = self.path.joinpath(*parts)
        if not folder.is_dir():
            return {}
        out = {}
        for child in folder.iterdir():
            if child.is_symlink():  # never followed: what it points to is not the run's
                out[child.name] = layout.OTHER
            else:
                out[child.name] = layout.DIR if child.is_dir() else layout.FILE if child.is_file() else layout.OTHER
        return out

    def read_text(self, *parts: str) -> str | None:
        path = self.path.joinpath(*parts)
        return path.read_text() if path.is_file() else None

    def write_text(self, rel: str, text: str) -> None:
        path = self.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)

    def remove(self, rel: str) -> None:
        path = self.path / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()

    def lock(self, cfg: RunConfig, command: list[str] | None, force_lock: str | None) -> AbstractContextManager:
        if force_lock is not None:
            raise ConfigError(
                f"--force-lock: {self.path} is a local run directory, locked with flock, which the kernel "
                "releases when its holder dies: there is no lock to take over"
            )
        return hold(self.path, "run directory")

    def check_location(self) -> None:
        """Refuse places no run should write into (or `--force` clear): `/`, the home directory and
        its ancestors, a path that is a file, a folder holding files gristmill did not write."""
        run_dir = self.path
        where = Path(os.path.abspath(run_dir))
        home = Path(os.path.abspath(Path.home()))
        if where == Path(where.anchor) or where == home or where in home.parents:
            raise ConfigError(
                f"run_dir {run_dir}: refusing to use {where} as a run directory "
                "(the filesystem root, your home directory or one above it); name a folder of its own"
            )
        if where.exists() and not where.is_dir():
            raise ConfigError(f"run_dir {run_dir}: exists and is not a directory")
        for parent in where.parents:  # `runs/x` where `runs` is a file: say so, not NotADirectoryError
            if parent.exists():
                if not parent.is_dir():
                    raise ConfigError(f"run_dir {run_dir}: {parent} is a file, not a directory")
                break
        names = self.entries()
        foreign = sorted(n for n in names if n != layout.LOCK_NAME) if not layout.is_run_dir(names) else []
        if foreign:
            # Never suggest --force here: the directory holds files gristmill did not write.
            raise ConfigError(
                f"{run_dir} exists, is not empty and is not a gristmill run directory"
                f" (it holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''});"
                " choose a new or empty --run-dir"
            )

    def prepare(self, cfg: RunConfig, force: bool, inputs: list[dict] | None = None) -> bool:
        self.check_location()  # again under the lock: what another command may have put here
        return super().prepare(cfg, force, inputs)

    def merge_stage(self, stage: Stage) -> None:
        st.merge_stage(self.path / stage.label)

    def merge_run(self, stages: list[Stage]) -> dict:
        return st.merge_run(self.path)
