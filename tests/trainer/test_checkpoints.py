"""Damaged checkpoints: each is caught by its checksums, skipped in one line, and the resume falls
back to the newest intact one and continues exactly; with none intact, one error. Also with two
ranks, which must take the same checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gristmill.trainer import checkpoint as ckpt
from gristmill.trainer.train import InputError, train

from .conftest import STEPS, losses, tiny_cfg

SHARD = "__0_0.distcp"  # rank 0's DCP data file: the weights and the optimizer moments


def _appended(out: Path, before: int) -> dict[int, float]:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()[before:]]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def _lines(out: Path) -> int:
    return len((out / "metrics.jsonl").read_text().splitlines())


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def test_every_checkpoint_lists_its_files_checksums(baseline):
    for _, path in ckpt.step_dirs(baseline / "checkpoints"):
        files = json.loads((path / ckpt.CHECKSUMS).read_text())["files"]
        assert sorted(files) == sorted(p.name for p in path.iterdir() if p.name != ckpt.CHECKSUMS)
        assert {SHARD, ".metadata", "meta.json"} <= set(files)
        assert ckpt.problem(path) is None
        assert not list(path.glob("*.tmp"))


@pytest.mark.parametrize(
    "damage, why",
    [
        (_truncate, rf"{SHARD} is [\d,]+ bytes, checksums\.json says [\d,]+ \(truncated or overwritten\)"),
        (_flip_byte, rf"{SHARD} sha256 mismatch"),
    ],
)
def test_damaged_newest_checkpoint_is_skipped_and_resume_is_exact(baseline, token_dir, tmp_path, capsys, damage, why):
    out = tmp_path / "run"
    shutil.copytree(baseline, out)
    damage(out / "checkpoints" / "step-00000006" / SHARD)
    before = _lines(out)
    capsys.readouterr()
    train(tiny_cfg(token_dir, STEPS), out)
    err = capsys.readouterr().err.splitlines()
    skipped = [line for line in err if line.startswith("checkpoint ")]
    assert len(skipped) == 1, err
    assert re.fullmatch(rf"checkpoint step-00000006: {why}; skipped", skipped[0]), skipped
    # resumed from step 3: steps 4..6 again, bitwise as the uninterrupted run had them
    again, full = _appended(out, before), losses(baseline)
    assert sorted(again) == [4, 5, 6]
    assert [again[s] for s in (4, 5, 6)] == [full[s] for s in (4, 5, 6)]
    # the damaged checkpoint was replaced by an intact one of the same step
    assert ckpt.problem(out / "checkpoints" / "step-00000006") is None


def test_checkpoint_without_checksums_is_incomplete(baseline, token_dir, tmp_path, capsys):
    """checksums.json is written last: a checkpoint without it is one whose save did not finish."""
    out = tmp_path / "run"
    shutil.copytree(baseline, out)
    (out / "checkpoints" / "step-00000006" / ckpt.CHECKSUMS).unlink()
    before = _lines(out)
    capsys.readouterr()
    train(tiny_cfg(token_dir, STEPS), out)
    assert "checkpoint step-00000006: no checksums.json" in capsys.readouterr().err
    assert sorted(_appended(out, before)) == [4, 5, 6]


def test_no_intact_checkpoint_is_one_error(baseline, token_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(baseline, out)
    _flip_byte(out / "checkpoints" / "step-00000006" / SHARD)
    _truncate(out / "checkpoints" / "step-00000003" / ".metadata")
    with pytest.raises(InputError, match=r"checkpoints: none of its 2 checkpoints is intact"):
        train(tiny_cfg(token_dir, STEPS), out)
    err = capsys.readouterr().err
    assert "checkpoint step-00000006: __0_0.distcp sha256 mismatch; skipped" in err
    assert "checkpoint step-00000003: .metadata is" in err
    # through the command: the skipped lines and one error, no traceback, exit code 2
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gristmill.cli",
            "train",
            "tiny",
            "--out",
            str(out),
            "--set",
            f"data.tokens={token_dir}",
            "--set",
            "data.seq_len=32",
            "--set",
            "log.progress=false",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 3 and lines[2].startswith("error: ") and "none of its 2 checkpoints is intact" in lines[2], (
        lines
    )
    assert "Traceback" not in res.stderr + res.stdout


def test_export_refuses_a_damaged_checkpoint_and_takes_the_intact_one(baseline, tmp_path, capsys):
    from gristmill.trainer.export import load_model

    out = tmp_path / "run"
    shutil.copytree(baseline, out)
    _flip_byte(out / "checkpoints" / "step-00000006" / SHARD)
    with pytest.raises(ckpt.CheckpointError, match=r"step-00000006: __0_0\.distcp sha256 mismatch"):
        load_model(out / "checkpoints" / "step-00000006")
    _, path = load_model(out)
    assert path.name == "step-00000003"
    assert "checkpoint step-00000006: __0_0.distcp sha256 mismatch; skipped" in capsys.readouterr().err


def test_two_ranks_take_the_same_checkpoint(token_dir, tmp_path, capfd):
    """Rank 1 hashes __0_0.distcp (files are dealt to ranks in name order): rank 0 must learn of
    the mismatch, report it once, and both ranks resume from step 3."""
    from gristmill.config import TrainSection
    from gristmill.trainer.launch import after_pipeline

    run_dir = tmp_path / "run"
    shutil.copytree(token_dir, run_dir / "tokens")
    section = TrainSection(
        preset="tiny",
        steps=STEPS,
        nproc=2,
        set=[
            "checkpoint.every=3",
            "checkpoint.keep=3",
            "eval.batches=0",
            "log.progress=false",
            "log.tensorboard=false",
            "data.seq_len=32",
            "fsdp_unit_layers=2",
        ],
    )
    console = Console(stderr=True)
    assert after_pipeline(section, run_dir, console) == 0
    out = run_dir / "train"
    names = sorted(json.loads((out / "checkpoints" / "step-00000006" / ckpt.CHECKSUMS).read_text())["files"])
    assert names.index(SHARD) % 2 == 1 and "__1_0.distcp" in names  # checked by rank 1 of 2
    first = losses(out)
    _flip_byte(out / "checkpoints" / "step-00000006" / SHARD)
    before = _lines(out)
    capfd.readouterr()
    assert after_pipeline(section, run_dir, console) == 0
    err = capfd.readouterr().err
    assert err.count("checkpoint step-00000006: __0_0.distcp sha256 mismatch; skipped") == 1, err
    again = _appended(out, before)
    assert sorted(again) == [4, 5, 6]
    assert [again[s] for s in (4, 5, 6)] == pytest.approx([first[s] for s in (4, 5, 6)], rel=1e-6)
