"""The files of a run directory on real filesystems: a finished run read from a read-only copy,
`--force` beside a user's file inside a stage folder, a disk that fills while gristmill writes.

Tests run as root, where `chmod` does not stop a write: read-only and full filesystems are real
mounts (a tmpfs remounted read-only, a tmpfs of a few hundred KB), unmounted after each test.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import string
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from datatrove.data import Document

from gristmill.config import from_dict
from gristmill.core.files import save_npy_atomic, write_text_atomic
from gristmill.core.messages import os_error_line as cli_error_line
from gristmill.core.parquet_io import ParquetWriter
from gristmill.pipeline.rundir import LocalRunDir, layout
from gristmill.tokenize.shards import BucketedWriter, finish_tokens
from tests.cli_process import pipeline

from .test_run import config


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return pipeline(*args, env={**os.environ, "COLUMNS": "200"}, cwd=cwd, timeout=300)


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
def demo_run(demo_run_dir) -> Path:
    """A finished demo run: filters, paragraph exact dedup, near dedup, token shards (the
    session's, pipeline conftest `demo_run_dir`: every test here reads it or works on a copy)."""
    return demo_run_dir


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


# --- a disk that fills ---------------------------------------------------------------------------


def _fill(disk: Path) -> None:
    """Fill the tmpfs to its last byte."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    # with 64 KiB writes, a last partial block may still fit: take it byte by byte
    with open(disk / "filler2", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


def _docs(n: int) -> list[Document]:
    rng = random.Random(0)  # incompressible text: the page does not fit after compression either
    return [
        Document(text="".join(rng.choice(string.ascii_letters) for _ in range(2000)), id=f"d{i}", metadata={})
        for i in range(n)
    ]


def _write_parquet(path: Path) -> None:
    writer = ParquetWriter()
    writer.bind(path.parent, {}, "zstd")
    for _ in writer.run(iter(_docs(300)), rank=0):
        pass


def _write_buckets(path: Path) -> None:
    w = BucketedWriter(path.parent, 0, 4, pa.uint16(), 0, 0, 0.0)
    w.write([f"d{i}" for i in range(2000)], ["x"] * 2000, [[1, 2, 3] * 100] * 2000)
    w.close()


def _finish_tokens(path: Path) -> None:
    tokenizer = path.parent.parent / "tokenizer.json"  # on another disk: only the copy fills this one
    tokenizer.write_bytes(b"{}" * 500_000)
    finish_tokens(
        path.parent,
        [],
        path,
        tokenizer_file=tokenizer,
        tokenizer_meta={},
        dtype=pa.uint16(),
        seed=0,
        val_fraction=0.0,
        shard_tokens=1,
    )


WRITERS = {
    # writer, the path its error must name (relative to the full disk)
    "write_text_atomic": (lambda p: write_text_atomic(p, "x" * 2_000_000), "stats.json"),
    "save_npy_atomic": (lambda p: save_npy_atomic(p, np.zeros(500_000)), "clusters.npy"),
    "parquet": (_write_parquet, "output/00000.parquet"),
    "token_buckets": (_write_buckets, None),  # one of the bucket files, whichever filled the disk
    "finish_tokens": (_finish_tokens, "tokens"),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_full_disk_names_the_file_and_leaves_no_tmp(name, tmpfs, tmp_path):
    disk = tmpfs("512k")
    _fill(disk)
    write, target = WRITERS[name]
    path = disk / (target or "buckets/x")
    path.parent.mkdir(parents=True, exist_ok=True)
    with pytest.raises(OSError) as e:
        write(path)
    assert e.value.errno == errno.ENOSPC, e.value
    where = str(e.value.filename)
    if target is None:
        assert where.startswith(str(disk / "buckets")) and where.endswith(".arrow"), where
    elif name == "finish_tokens":  # the copy's destination in the directory being built
        assert where == str(disk / "tokens.tmp" / "tokenizer.json"), where
    else:
        assert where == str(path), where
    assert cli_error_line(e.value) == f"No space left on device: {where}"
    assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]


def test_report_on_a_full_disk_names_the_file_and_leaves_no_tmp(demo_run, tmpfs):
    disk = tmpfs("512k")
    _fill(disk)
    res = _cli("report", demo_run, "-o", disk / "report.html")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == f"error: No space left on device: {disk / 'report.html'}"
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "filler2"]


def test_full_disk_during_a_run_names_the_file_and_leaves_no_tmp(tmpfs, tmp_path, wet_files, lid_model):
    disk = tmpfs("256k")  # room for the run's config and logs, not for its documents
    cfg = config(disk / "run", wet_files, lid_model, output={"dropped_sample": 1.0, "compression": "none"})
    cfg["executor"] = {"type": "local", "tasks": 1, "workers": 1}
    path = tmp_path / "full.yaml"
    path.write_text(json.dumps(cfg))
    res = _cli("run", path)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    failed = [ln for ln in res.stderr.splitlines() if ln.startswith("failed stage 01_curate")]
    assert len(failed) == 1, res.stderr[-2000:]
    # the file being written, not the stage folder
    assert re.search(rf"No space left on device: {re.escape(str(disk))}/run/01_curate/\S+\.(parquet|json);", failed[0])
    assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]


def test_run_on_a_disk_full_from_the_start_names_the_file(tmpfs, tmp_path, wet_files, lid_model):
    disk = tmpfs("256k")
    _fill(disk)
    path = tmp_path / "c.yaml"
    path.write_text(
        json.dumps(
            config(disk / "run", wet_files[1:], lid_model) | {"executor": {"type": "local", "tasks": 1, "workers": 1}}
        )
    )
    res = _cli("run", path)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [f"error: No space left on device: {disk / 'run' / '.gristmill.lock'}"]
    # the run directory's own files, once the lock is held
    with pytest.raises(OSError) as e:
        LocalRunDir(disk / "run").prepare(from_dict(json.loads(path.read_text())), False)
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(disk / "run" / layout.MARKER))
    assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]


def test_a_failed_task_leaves_no_partial_drop_sample(tmp_path):
    """A filter's sample of dropped documents is renamed into place only when its task finishes:
    a task that fails after some drops (here a later step raises) leaves neither the sample nor
    its `.tmp`, so a re-run's sample is never mistaken for, or mixed with, a partial one."""
    from gristmill.core.configlib import FilterConfig
    from gristmill.core.filter import Filter
    from gristmill.core.sinks import DroppedSampler

    class DropsOdd(Filter):
        step_name = "drops_odd"

        class Config(FilterConfig):
            pass

        def filter(self, doc, config):
            return True if int(doc.id) % 2 == 0 else (False, "odd")

    def later_step_fails(data):
        for i, doc in enumerate(data):
            if i == 3:
                raise RuntimeError("a later step failed")
            yield doc

    def run(step, n):
        docs = (Document(text=f"document {i}", id=str(i)) for i in range(n))
        return list(later_step_fails(step.run(docs, rank=0)))

    folder = tmp_path / "dropped" / "drops_odd"
    failing = DropsOdd()
    failing.dropped = DroppedSampler(folder, 1.0, {})
    with pytest.raises(RuntimeError, match="a later step failed"):
        run(failing, 20)
    assert failing.stats["dropped_odd"].total >= 3  # it had sampled drops when the task failed
    assert not folder.exists() or [p.name for p in folder.iterdir()] == []

    finished = DropsOdd()
    finished.dropped = DroppedSampler(folder, 1.0, {})
    docs = (Document(text=f"document {i}", id=str(i)) for i in range(6))
    assert [d.id for d in finished.run(docs, rank=0)] == ["0", "2", "4"]
    assert [p.name for p in folder.iterdir()] == ["00000.parquet"]
