"""The files of a run directory on real filesystems: a finished run read from a read-only copy,
`--force` beside a user's file inside a stage folder, a disk that fills while a task writes.

Tests run as root, where `chmod` does not stop a write: read-only and full filesystems are real
mounts (a tmpfs remounted read-only, a tmpfs of a few hundred KB), unmounted after each test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gristmill.config import from_dict
from gristmill.pipeline.runner import run

from .test_run import config


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gristmill.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        cwd=cwd,
        timeout=300,
    )


def _mount(*args: str) -> None:
    res = subprocess.run(["mount", *args], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount here (needs root): mount {' '.join(args)}: {res.stderr.strip()}")


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs of that size under tmp_path; all unmounted at teardown."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs-{len(mounted)}"
        where.mkdir()
        _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where))
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def _snapshot(root: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry under root: (mtime_ns, size, bytes of a file)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_mtime_ns, st.st_size, p.read_bytes() if p.is_file() else None)
    return out


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, wet_files, lid_model) -> Path:
    """A finished run like the demo's: filters, paragraph exact dedup, near dedup, token shards."""
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    cfg = config(run_dir, wet_files, lid_model, output={"dropped_sample": 0.2})
    cfg["steps"] += [
        {"exact_dedup": {"granularity": "paragraph", "capacity": 100000, "min_doc_words": 50}},
        {"near_dedup": {"threshold": 0.8}},
        {"tokenize": {"tokenizer": {"train": {"vocab_size": 512}}, "shard_tokens": 32768, "val_fraction": 0.05}},
    ]
    run(from_dict(cfg))
    return run_dir


def _read_everything(run_dir: Path, elsewhere: Path) -> None:
    """What a user reads a run with: every form of `pipeline stats`, `report`, the notebook API."""
    for args in ([], ["--json"], ["--stages"], ["--language", "en"]):
        res = _cli("stats", run_dir, *args)
        assert res.returncode == 0, (args, res.stderr[-2000:])
        assert "Traceback" not in res.stderr
    res = _cli("stats", run_dir, "--json")
    assert json.loads(res.stdout)["journey"][0]["docs_in"] == 566 + 43
    report = elsewhere / f"report-{uuid.uuid4().hex[:6]}.html"
    res = _cli("report", run_dir, "-o", report)
    assert res.returncode == 0, res.stderr[-2000:]
    assert report.read_text().count("<section") >= 5
    from gristmill import stats

    assert stats.load(run_dir).journey["docs_in"].iloc[0] == 566 + 43


def test_stats_and_report_read_a_read_only_copy_and_write_nothing(demo_run, tmpfs, tmp_path):
    disk = tmpfs("64m")
    copy = disk / "run"
    shutil.copytree(demo_run, copy, symlinks=True)
    before = _snapshot(copy)
    _mount("-o", "remount,ro", str(disk))
    with pytest.raises(OSError):  # it is read-only, even to root
        (copy / "probe").write_text("x")
    _read_everything(copy, tmp_path)
    assert _snapshot(copy) == before


def test_stats_and_report_leave_a_writable_run_untouched(demo_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(demo_run, copy, symlinks=True)
    # the run's merged files, as a reader of the directory that is not gristmill finds them
    for name in ("stats.json", "01_curate/stats.json", "01_curate/scores.json"):
        assert (copy / name).is_file(), name
    before = _snapshot(copy)
    _read_everything(copy, tmp_path)
    after = _snapshot(copy)
    assert after.keys() == before.keys()  # nothing created (no .tmp, no lock)
    changed = [name for name in before if before[name] != after[name]]
    assert changed == []  # not a byte, not an mtime


def test_force_keeps_and_names_a_users_files_inside_stage_folders(demo_run, tmp_path, wet_files, lid_model):
    run_dir = tmp_path / "run"
    shutil.copytree(demo_run, run_dir, symlinks=True)
    (run_dir / "01_curate" / "notes.txt").write_text("why 00_langid drops so much")
    (run_dir / "03_exact_dedup_find" / "my-analysis").mkdir()
    (run_dir / "03_exact_dedup_find" / "my-analysis" / "fp.ipynb").write_text("{}")
    (run_dir / "01_curate" / "output" / "stale.parquet").write_bytes(b"gristmill's folder: cleared whole")
    stages = [p.name for p in run_dir.iterdir() if p.name[:2].isdigit()]
    assert len(stages) >= 15  # curate, 3 exact dedup, 6 near dedup, 6 tokenize phases
    changed = config(run_dir, wet_files[1:], lid_model)
    changed["executor"] = {"type": "local", "tasks": 1, "workers": 1}
    changed["steps"] = changed["steps"][:1]
    cfg = tmp_path / "changed.yaml"
    cfg.write_text(json.dumps(changed))
    res = _cli("run", cfg, "--force")
    assert res.returncode == 0, res.stderr[-2000:]
    kept = [ln for ln in res.stderr.splitlines() if "--force kept" in ln]
    # every entry gristmill wrote in every kind of stage is known to it: only the user's are named
    assert len(kept) == 1 and kept[0].endswith(
        f"{run_dir}: --force kept what gristmill did not write: 01_curate/notes.txt, 03_exact_dedup_find/my-analysis"
    ), res.stderr[-2000:]
    assert (run_dir / "01_curate" / "notes.txt").read_text() == "why 00_langid drops so much"
    assert (run_dir / "03_exact_dedup_find" / "my-analysis" / "fp.ipynb").read_text() == "{}"
    assert sorted(p.name for p in (run_dir / "03_exact_dedup_find").iterdir()) == ["my-analysis"]
    assert not (run_dir / "01_curate" / "output" / "stale.parquet").exists()
    assert sorted(p.name for p in run_dir.iterdir() if p.name[:2].isdigit()) == ["01_curate", "03_exact_dedup_find"]
    assert not (run_dir / "tokens").exists()
