"""`pipeline train`: hold the output directory, check the config and the token shards, then start
one process per device with torchrun (`torch.distributed.run --standalone`, through
`trainer/torchrun.py`): NCCL on visible GPUs, gloo on CPU. Also the hook that trains after
`pipeline run` when the crawl YAML has a `train:` section.

This process stays alive while torchrun runs and holds `<out>/.gristmill.lock` (dirlock) the
whole time: a second training into the same directory stops at once naming this one, instead of
both writing checkpoints and metrics.jsonl. Data errors are found here, before any rank starts,
and are one line naming the file (the ranks trust the check: `--tokens-checked`).
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from gristmill.core.configlib import ConfigError
from gristmill.core.messages import os_error_line
from gristmill.dirlock import hold
from gristmill.trainer.config import TrainConfig, from_dict
from gristmill.trainer.config import load as load_config

# A file whose appearance asks a training run to checkpoint and stop (a Slurm job's SIGUSR1 handler
# creates it); here, torch-free, so the pipeline can set it without importing the trainer.
PREEMPT_ENV = "GRISTMILL_PREEMPT_FILE"

# exit codes of a rank (train.main), passed on by trainer/torchrun.py
EXIT_INPUT = 2  # token shards, checkpoints or config the run cannot use; one line printed
EXIT_NONFINITE = 3  # the loss went NaN/inf; the message names the checkpoint a re-run resumes from


def visible_gpus() -> int:
    """The GPUs a torchrun started from here would see, counted without importing torch (the
    pipeline's process stays torch-free): CUDA_VISIBLE_DEVICES when set, else NVIDIA's device
    files."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [d.strip() for d in env.split(",") if d.strip()]
        return len(ids[: ids.index("-1")] if "-1" in ids else ids)  # CUDA stops at an invalid id
    return len(glob.glob("/dev/nvidia[0-9]*"))


def default_nproc(cfg: TrainConfig) -> int:
    return cfg.nproc or max(1, visible_gpus())


def check_tokens(cfg: TrainConfig):
    """The token directory as training reads it, checked once: manifest, every shard of the
    training split (and of the validation split if evaluation uses it) present, its sha256 as
    the manifest says (unless `data.verify: false`), a readable Arrow file of the manifest's
    dtype and counts, every id below the vocabulary size, the tokenizer's sha256 and vocabulary
    as the manifest says (`TokenDir.check`, also run by `tokens inspect` and `tokens export`).
    Raises TokenShardError naming the file, or ConfigError naming the key. Returns the opened
    TokenDir."""
    from gristmill.tokenize.reader import TokenShardError, open_tokens

    try:
        tokdir = open_tokens(cfg.data.tokens, verify="lazy" if cfg.data.verify else False)
        manifest = tokdir.root / "manifest.json"
        if cfg.data.split not in tokdir.splits:
            raise ConfigError(
                f"data.split: {manifest} has no shards of split {cfg.data.split!r}"
                f" (it has: {', '.join(tokdir.splits) or 'none'})"
            )
        if cfg.model.vocab_size is not None and cfg.model.vocab_size < tokdir.vocab_size:
            raise ConfigError(
                f"model.vocab_size: {cfg.model.vocab_size} is smaller than the tokenizer's vocabulary"
                f" ({tokdir.vocab_size}, {manifest})"
            )
        tokdir.check(cfg.data.split)
        if cfg.eval.batches and cfg.data.val_split in tokdir.splits:
            tokdir.check(cfg.data.val_split)
    except OSError as e:  # unreadable (permissions, I/O error): still one line naming the file
        raise TokenShardError(os_error_line(e, cfg.data.tokens)) from None
    return tokdir


def launch(cfg: TrainConfig, out_dir: Path, nproc: int | None = None) -> int:
    """Holds `out_dir`, checks the token directory, writes `<out>/train_config.yaml` (resolved)
    and runs torchrun on it; returns its exit code (2: an input error the ranks reported in one
    line; 3: a non-finite loss). Raises LockHeld, TokenShardError or ConfigError before any rank starts."""
    with hold(out_dir, "training output"):
        check_tokens(cfg)
        resolved = write_resolved(cfg.model_copy(update={"out_dir": str(out_dir)}), out_dir)
        n = nproc or default_nproc(cfg)
        cmd = [
            sys.executable,
            "-m",
            "gristmill.trainer.torchrun",
            "--standalone",
            f"--nproc-per-node={n}",
            "-m",
            "gristmill.trainer.train",
            str(resolved),
            "--out",
            str(out_dir),
            "--tokens-checked",
        ]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
        return _run_to_the_end(cmd, env)


def _run_to_the_end(cmd: list[str], env: dict) -> int:
    """Runs `cmd` and waits for it, whatever signal this process gets: the lock must outlive the
    ranks. SIGTERM/SIGHUP are passed on (torchrun then stops its ranks and exits); Ctrl-C reaches
    torchrun and the ranks from the terminal, so here it only keeps waiting."""
    forward = {signal.SIGTERM, signal.SIGHUP}
    child: list[subprocess.Popen] = []
    early: list[int] = []  # a signal that came before the child existed

    def on_signal(signum, _frame):
        if signum in forward and child:
            child[0].send_signal(signum)
        elif signum in forward:
            early.append(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():  # Python sets handlers there only
        previous = {sig: signal.signal(sig, on_signal) for sig in (*forward, signal.SIGINT)}
    try:
        child.append(subprocess.Popen(cmd, env=env))
        for signum in early:
            child[0].send_signal(signum)
        return child[0].wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def train_command(config: str, overrides: list[str], out: str | None, nproc: int | None) -> int:
    cfg = load_config(config, overrides)
    return launch(cfg, Path(out or cfg.out_dir), nproc)


def after_pipeline(section, run_dir: Path, console) -> int | None:
    """Train into `<run_dir>/train/` on `<run_dir>/tokens/` (the crawl YAML's `train:` section).
    Returns the exit code, or None when there are no tokens yet."""
    tokens = run_dir / "tokens"
    if not (tokens / "manifest.json").is_file():
        console.print(f"train: skipped, no token shards at {tokens}/manifest.json (add a `tokenize` step)")
        return None
    cfg = pipeline_train_config(section, run_dir)
    console.print(f"train: preset {section.preset}, {cfg.steps} steps → {run_dir / 'train'}")
    return launch(cfg, run_dir / "train", section.nproc)


def pipeline_train_config(section, run_dir: Path) -> TrainConfig:
    """The train config of a crawl YAML's `train:` section: its preset on `<run_dir>/tokens/`."""
    data = {"preset": section.preset, "data": {"tokens": str(run_dir / "tokens")}}
    if section.steps is not None:
        data["steps"] = section.steps
    return from_dict(data, list(section.set), source="train").model_copy(update={"out_dir": str(run_dir / "train")})


def write_resolved(cfg: TrainConfig, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = out_dir / "train_config.yaml"
    resolved.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return resolved
