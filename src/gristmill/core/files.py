"""Files written whole or not at all: a temporary file renamed into place, so a process killed
mid-write (or a full disk) never leaves a half file that a re-run would take for finished work."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
