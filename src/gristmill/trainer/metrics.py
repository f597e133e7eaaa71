"""Training metrics: `metrics.jsonl` (one JSON object per logged step or validation),
TensorBoard (if the `tensorboard` package is installed — the `train` extra pins it), and a rich
progress bar on rank 0.

MFU = tokens/s × (6·N + 12·L·d·T) / peak, N = the weights of every matmul, the output head
included, tied or not (ModelArgs.flops_per_token), peak = dense bf16 FLOP/s of the GPU (or
nothing on CPU). FP8 runs are counted against the same bf16 peak: MFU stays comparable across
precisions.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16.items():
        if key in name:
            return value
    return None


class Metrics:
    def __init__(
        self,
        out_dir: Path,
        *,
        enabled: bool,
        total_steps: int,
        start_step: int,
        tensorboard: bool,
        progress: bool,
        flops_per_token: float,
        device: torch.device,
        world: int,
    ):
        self.enabled, self.device, self.world = enabled, device, world
        self.flops_per_token = flops_per_token
        self.peak = peak_flops(device)
        self.tb = self.bar = self._jsonl = None
        self._last_time, self._tokens = time.perf_counter(), 0
        self._paused_s = 0.0  # time since the last logged step spent outside training steps
        if not enabled:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(out_dir / "metrics.jsonl", "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:
                print(
                    "metrics: TensorBoard logging off — install the `tensorboard` package"
                    " (pip install -e '.[train]') or set log.tensorboard: false"
                )
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("[bold]train[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
            )
            self.task = self.bar.add_task("train", total=total_steps, completed=start_step, info="")
            self.bar.start()

    def add_tokens(self, n: int) -> None:
        self._tokens += n

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent in the block (validation, scoring, a checkpoint) is not training time: the
        tokens/s and MFU of the next logged step leave it out."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._paused_s += time.perf_counter() - started

    def log_step(self, step: int, loss: float, *, lr: float, grad_norm: float, extra: dict | None = None) -> dict:
        now = time.perf_counter()
        dt = max(now - self._last_time - self._paused_s, 1e-9)
        tps = self._tokens / dt  # all ranks' tokens
        rec = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": tps,
            "tokens_per_s_per_device": tps / self.world,
        }
        if self.peak:
            rec["mfu"] = tps / self.world * self.flops_per_token / self.peak
        if self.device.type == "cuda":
            rec["max_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        rec.update(extra or {})
        self._last_time, self._tokens, self._paused_s = now, 0, 0.0
        self._write(rec, step)
        if self.bar is not None:
            info = f"loss {loss:.4f} lr {lr:.2e} {tps:,.0f} tok/s" + (f" mfu {rec['mfu']:.1%}" if "mfu" in rec else "")
            self.bar.update(self.task, completed=step, info=info)
        return rec

    def log_eval(self, step: int, loss: float) -> dict:
        rec = {"step": step, "val_loss": loss, "val_ppl": math.exp(min(loss, 50.0))}
        self._write(rec, step)
        return rec

    def log_scores(self, step: int, tokens: int, scores: dict) -> dict:
        """A scoring of eval.tasks/eval.corpora (trainer.scores: keys `eval/<task>/<metric>`)."""
        rec = {"step": step, "tokens": tokens, **scores}
        self._write(rec, step)
        return rec

    def _write(self, rec: dict, step: int) -> None:
        if not self.enabled:
            return
        self._jsonl.write(json.dumps(rec) + "\n")
        self._jsonl.flush()
        if self.tb is not None:
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.tb is not None:
            self.tb.close()
        if self._jsonl is not None:
            self._jsonl.close()
