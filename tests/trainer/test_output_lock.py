"""Two trainings into one output directory: the second is refused in one line naming the first,
which goes on alone (metrics.jsonl has one writer)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from gristmill.cli import main as cli_main
from gristmill.dirlock import LockHeld, hold, read_holder


def _train(out, tokens, steps: int) -> list[str]:
    """`pipeline train`'s arguments."""
    return [
        "train",
        "tiny",
        "--out",
        str(out),
        "--set",
        f"data.tokens={tokens}",
        "--set",
        f"steps={steps}",
        "--set",
        "data.seq_len=32",
        "--set",
        "checkpoint.every=2",
        "--set",
        "log.progress=false",
        "--set",
        "log.tensorboard=false",
        "--set",
        "eval.batches=0",
    ]


def _records(metrics) -> list[dict]:
    text = metrics.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]  # whole lines only


def _wait_for(predicate, proc, what: str) -> None:
    for _ in range(1200):  # a bound on a hang, not a timing assertion
        if predicate():
            return
        assert proc.poll() is None, f"the first training ended before {what}: {proc.communicate()}"
        time.sleep(0.1)
    pytest.fail(f"never saw {what}")


def test_second_training_into_the_same_directory_is_refused(token_dir, tmp_path, capsys):
    out = tmp_path / "out"
    # far more steps than it will run: it is still training when the second one starts
    first = subprocess.Popen(
        [sys.executable, "-m", "gristmill.cli", *_train(out, token_dir, 100_000)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        metrics = out / "metrics.jsonl"
        _wait_for(lambda: metrics.is_file() and len(_records(metrics)) >= 3, first, "three steps logged")
        # the second command runs in this process (the `pipeline` entry point, without another
        # interpreter's start-up): to the first one's lock it is another process all the same
        capsys.readouterr()
        code = cli_main(_train(out, token_dir, 4))
        second = capsys.readouterr()
        assert code == 2, second.out + second.err
        lines = second.err.strip().splitlines()
        assert len(lines) == 1, second.err
        assert lines[0].startswith(f"error: training output {out} is in use by pid {first.pid}"), lines[0]
        # the first one is still the only writer, and still training
        assert read_holder(out)["pid"] == first.pid
        _wait_for(lambda: len(_records(metrics)) >= 6, first, "three more steps logged")
    finally:
        first.send_signal(signal.SIGTERM)  # passed on to torchrun, which stops the rank
        first.communicate(timeout=120)
    steps = [r["step"] for r in _records(metrics)]
    assert steps == list(range(1, len(steps) + 1))
    assert read_holder(out) == {}  # released when the first one ended


def test_pipeline_hook_trains_only_while_it_holds_the_train_folder(token_dir, tmp_path):
    from gristmill.config import TrainSection
    from gristmill.trainer.launch import after_pipeline

    run_dir = tmp_path / "run"
    shutil.copytree(token_dir, run_dir / "tokens")
    section = TrainSection(preset="tiny", steps=2, set=["data.seq_len=32", "log.progress=false", "eval.batches=0"])
    with hold(run_dir / "train", "training output"):
        with pytest.raises(LockHeld, match=rf"training output {run_dir / 'train'} is in use by pid {os.getpid()}"):
            after_pipeline(section, run_dir, Console(stderr=True))
    assert not (run_dir / "train" / "train_config.yaml").exists()
