"""`pipeline train`: validate the train config, then start one process per device with torchrun
(`torch.distributed.run --standalone`): NCCL on visible GPUs, gloo on CPU. Also the hook that
trains after `pipeline run` when the crawl YAML has a `train:` section."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from gristmill.trainer.config import TrainConfig, from_dict
from gristmill.trainer.config import load as load_config

# A file whose appearance asks a training run to checkpoint and stop (a Slurm job's SIGUSR1 handler
# creates it); here, torch-free, so the pipeline can set it without importing the trainer.
PREEMPT_ENV = "GRISTMILL_PREEMPT_FILE"


def default_nproc(cfg: TrainConfig) -> int:
    if cfg.nproc:
        return cfg.nproc
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except ImportError:
        return 1


def launch(cfg: TrainConfig, out_dir: Path, nproc: int | None = None) -> int:
    """Writes `<out>/train_config.yaml` (resolved) and runs torchrun on it; returns its exit code."""
    resolved = write_resolved(cfg.model_copy(update={"out_dir": str(out_dir)}), out_dir)
    n = nproc or default_nproc(cfg)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           "-m", "gristmill.trainer.train", str(resolved), "--out", str(out_dir)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    return subprocess.call(cmd, env=env)


def train_command(config: str, overrides: list[str], out: str | None, nproc: int | None) -> int:
    cfg = load_config(config, overrides)
    return launch(cfg, Path(out or cfg.out_dir), nproc)


def after_pipeline(section, run_dir: Path, console) -> int | None:
    """Train into `<run_dir>/train/` on `<run_dir>/tokens/` (the crawl YAML's `train:` section).
    Returns the exit code, or None when there are no tokens yet."""
    tokens = run_dir / "tokens"
    if not (tokens / "manifest.json").is_file():
        console.print(f"train: skipped, no token shards at {tokens}/manifest.json (add a `tokenize:` section)")
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
