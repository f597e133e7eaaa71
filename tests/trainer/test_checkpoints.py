"""Damaged checkpoints: each is caught by its checksums, skipped in one line, and the resume falls
back to the newest intact one and continues exactly; with none intact, one error. Also with two
ranks, which must take the same checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from gristmill.trainer import checkpoint as ckpt
from gristmill.trainer.train import InputError, main, train
from tests.cli_process import pipeline

from .conftest import STEPS, losses, tiny_cfg, two_rank_section

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
    res = pipeline(
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


def test_two_ranks_take_the_same_checkpoint(two_rank_run, tmp_path, capfd):
    """Rank 1 hashes __0_0.distcp (files are dealt to ranks in name order): rank 0 must learn of
    the mismatch, report it once, and both ranks resume from step 3."""
    from gristmill.trainer.launch import after_pipeline

    run_dir = tmp_path / "run"
    shutil.copytree(two_rank_run, run_dir)  # STEPS steps on two ranks through the pipeline hook
    out = run_dir / "train"
    names = sorted(json.loads((out / "checkpoints" / "step-00000006" / ckpt.CHECKSUMS).read_text())["files"])
    assert names.index(SHARD) % 2 == 1 and "__1_0.distcp" in names  # checked by rank 1 of 2
    first = losses(out)
    _flip_byte(out / "checkpoints" / "step-00000006" / SHARD)
    before = _lines(out)
    capfd.readouterr()
    assert after_pipeline(two_rank_section(), run_dir, Console(stderr=True)) == 0
    err = capfd.readouterr().err
    assert err.count("checkpoint step-00000006: __0_0.distcp sha256 mismatch; skipped") == 1, err
    again = _appended(out, before)
    assert sorted(again) == [4, 5, 6]
    assert [again[s] for s in (4, 5, 6)] == pytest.approx([first[s] for s in (4, 5, 6)], rel=1e-6)


# --- checkpoints whose checksums match but whose contents do not fit the run ---------------------


def _reseal(path: Path) -> None:
    """checksums.json recomputed as `save` writes it, so that only the content checks can object."""
    sums = json.loads((path / ckpt.CHECKSUMS).read_text())
    for name in sums["files"]:
        data = (path / name).read_bytes()
        sums["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / ckpt.CHECKSUMS).write_text(json.dumps(sums))
    assert ckpt.problem(path) is None


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def _meta_says_step_10_to_the_12(out: Path, token_dir: Path) -> str:
    path = out / "checkpoints" / "step-00000006"
    meta = json.loads((path / "meta.json").read_text())
    meta["step"] = 10**12
    (path / "meta.json").write_text(json.dumps(meta))
    _reseal(path)
    return (
        r"step-00000006: meta\.json says step 1000000000000, but the directory is step-00000006 and"
        r" checksums\.json says step 6: meta\.json was edited"
    )


def _beyond_steps(out: Path, token_dir: Path) -> str:
    """A genuine checkpoint of step 6, and a config whose steps were lowered to 3."""
    return r"step-00000006: step 6 is beyond steps: 3 \(a checkpoint of a longer run\?"


def _meta_renamed_with_its_directory(out: Path, token_dir: Path) -> str:
    """step-00000003 presented as step 5: directory, meta.json and checksums.json all agree."""
    old, path = out / "checkpoints" / "step-00000003", out / "checkpoints" / "step-00000005"
    shutil.rmtree(out / "checkpoints" / "step-00000006")
    old.rename(path)
    meta = json.loads((path / "meta.json").read_text())
    meta["step"] = 5
    (path / "meta.json").write_text(json.dumps(meta))
    sums = json.loads((path / ckpt.CHECKSUMS).read_text())
    (path / ckpt.CHECKSUMS).write_text(json.dumps({**sums, "step": 5}))
    _reseal(path)
    return r"step-00000005: meta\.json says step 5, its scheduler state step 3: meta\.json was edited"


def _another_model_size(out: Path, token_dir: Path) -> str:
    shutil.rmtree(out)
    train(tiny_cfg(token_dir, 3, "model.dim=96"), out)
    return (
        r"step-00000003: parameter tok_embeddings\.weight has shape \[300, 96\] in the checkpoint, \[300, 64\] in"
        r" the model \(and 14 more differences\): a checkpoint of another model\?"
    )


def _more_layers(out: Path, token_dir: Path) -> str:
    """DCP loads the keys the model asks for: a deeper model's checkpoint loaded its first layers."""
    shutil.rmtree(out)
    train(tiny_cfg(token_dir, 3, "model.n_layers=3"), out)
    return (
        r"step-00000003: the checkpoint holds parameter layers\.2\.attention\.wo\.weight, the model has none of"
        r" that name \(and 5 more differences\): a checkpoint of another model\?"
    )


def _missing_key(out: Path, token_dir: Path) -> str:
    import pickle

    import torch.distributed.checkpoint as dcp

    path = out / "checkpoints" / "step-00000006"
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    del metadata.state_dict_metadata["app.model.layers.1.ffn_norm.weight"]
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    _reseal(path)
    return r"step-00000006: parameter layers\.1\.ffn_norm\.weight is missing from the checkpoint"


def _nan_weight(out: Path, token_dir: Path) -> str:
    """A NaN in the embedding row of a token the batches may never show (the loss stays finite),
    saved by the trainer itself: a checkpoint whose files are exactly those written."""
    import torch

    from gristmill.trainer.data import TokenStream
    from gristmill.trainer.parallel import init_distributed
    from gristmill.trainer.train import Trainer

    cfg = tiny_cfg(token_dir, STEPS)
    trainer = Trainer(cfg, d=init_distributed(), stream=TokenStream(token_dir, cfg.data.split), out_dir=out)
    with torch.no_grad():
        trainer.model.tok_embeddings.weight[299, 5] = float("nan")
    trainer.save()
    trainer.metrics.close()
    return (
        r"step-00000006: model\.tok_embeddings\.weight holds NaN or infinite values: training from it cannot"
        r" recover; resume from an earlier checkpoint"
    )


def _other_seq_len(out: Path, token_dir: Path) -> str:
    """Resumed with data.seq_len 16: the data loader's own check, raised inside DCP's load."""
    return r"step-00000006: checkpoint was trained with seq_len 32, config says 16"


CONTENT_FAULTS = [
    _meta_says_step_10_to_the_12,
    _beyond_steps,
    _meta_renamed_with_its_directory,
    _another_model_size,
    _more_layers,
    _missing_key,
    _nan_weight,
    _other_seq_len,
]


@pytest.mark.parametrize("fault", CONTENT_FAULTS, ids=lambda f: f.__name__.strip("_"))
def test_checkpoint_that_does_not_fit_the_run_is_one_line(baseline, token_dir, tmp_path, capsys, fault):
    """Checksums consistent, contents wrong: the rank stops with one line naming the checkpoint
    and what is wrong, exit code 2, before any step, and deletes nothing. Run through the rank's
    own entry point (`train.main`, what torchrun starts under `pipeline train`) in this process:
    that `pipeline train` passes the rank's line and exit code 2 on unchanged is checked through
    the command by test_no_intact_checkpoint_is_one_error."""
    out = tmp_path / "run"
    shutil.copytree(baseline, out)
    want = fault(out, token_dir)
    steps = 3 if fault is _beyond_steps else STEPS
    seq_len = 16 if fault is _other_seq_len else 32
    before, logged = _files(out / "checkpoints"), _lines(out)
    capsys.readouterr()
    code = main(
        [
            "tiny",
            "--out",
            str(out),
            *("--set", f"data.tokens={token_dir}", "--set", f"steps={steps}", "--set", f"data.seq_len={seq_len}"),
            *("--set", "checkpoint.every=3", "--set", "log.progress=false", "--set", "log.tensorboard=false"),
        ]
    )
    res = capsys.readouterr()
    assert code == 2, res.out + res.err
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: checkpoint {out}/checkpoints/"), res.err
    assert re.search(want, lines[0]), lines[0]
    assert "Traceback" not in res.out + res.err and "trained" not in res.out
    assert _lines(out) == logged  # no step trained
    assert _files(out / "checkpoints") == before


def test_export_refuses_a_checkpoint_whose_meta_names_another_model(baseline, tmp_path):
    from gristmill.trainer.export import load_model

    out = tmp_path / "run"
    shutil.copytree(baseline, out)
    path = out / "checkpoints" / "step-00000006"
    meta = json.loads((path / "meta.json").read_text())
    meta["model_args"]["n_layers"] = 1
    (path / "meta.json").write_text(json.dumps(meta))
    _reseal(path)
    with pytest.raises(
        ckpt.CheckpointError,
        match=r"step-00000006: the checkpoint holds parameter layers\.1\.attention\.wo\.weight, the model has"
        r" none of that name \(and 5 more differences\): a checkpoint of another model\?",
    ):
        load_model(path)
