"""Resume a checkpoint on a different number of GPUs and check that the loss continues as before.

    python benchmarks/resume_world_size.py --size 1b --from-gpus 4 --to-gpus 2,4 --tokens runs/crawl/tokens
    python benchmarks/resume_world_size.py --smoke

1. `pipeline train` (torchrun, `--from-gpus` processes) runs `--steps` steps with one checkpoint
   at `--resume-at`: the uninterrupted run.
2. For each `--to-gpus` count: a fresh output directory gets that checkpoint (hard links) and
   `pipeline train` resumes it there with that many processes, to `--steps`.
3. Prints the losses of steps resume-at+1 … steps side by side and the largest difference.

The global batch is the same in every run (`--global-batch`; fewer GPUs accumulate more
micro-batches), so every run sees the same samples in the same order (the data state is one
global counter). Equal world sizes give a noise floor for the GPU's non-deterministic kernels;
on CPU the trainer's own test asserts bitwise equality (2 ranks → 1).

Processes are GPUs where there are GPUs, CPU processes (gloo) elsewhere. `--smoke`: the `tiny`
preset, 2 processes → 1, 4 steps resumed at 2, a small synthetic token directory (seconds;
checks that the benchmark still runs on any machine; with one GPU the processes run on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from train_throughput import SMOKE_VOCAB, synthetic_tokens  # noqa: E402

from gristmill.trainer.config import load as load_config  # noqa: E402
from gristmill.trainer.launch import launch  # noqa: E402


def losses(out: Path) -> dict[int, float]:
    """Training loss per step from `metrics.jsonl` (validation records carry `val_loss` only)."""
    return {r["step"]: r["loss"] for r in map(json.loads, open(out / "metrics.jsonl")) if "loss" in r}


def run(cfg, out: Path, nproc: int) -> float:
    t0 = time.perf_counter()
    rc = launch(cfg, out, nproc)
    if rc != 0:
        raise SystemExit(f"pipeline train with {nproc} processes into {out} failed (exit {rc})")
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="1b", help="train preset")
    p.add_argument("--from-gpus", type=int, default=4)
    p.add_argument("--to-gpus", default="2", help="comma-separated process counts to resume on")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--resume-at", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--tokens", default=None, help="token directory (default: synthetic random tokens)")
    p.add_argument("--work", default=None, help="where runs go (default: a temporary directory, removed)")
    p.add_argument("--set", action="append", default=[], help="extra train-config overrides")
    p.add_argument("--smoke", action="store_true", help="tiny preset, 2 → 1 processes, 4 steps: checks that it runs")
    args = p.parse_args()
    n_tokens, vocab = 4_000_000, {}
    if args.smoke:
        args.size, args.from_gpus, args.to_gpus, args.steps, args.resume_at = "tiny", 2, "1", 4, 2
        args.global_batch, n_tokens, vocab = 4, 200_000, {"vocab": SMOKE_VOCAB}
        if torch.cuda.device_count() == 1:  # two ranks need two GPUs: the ranks run on CPU (gloo)
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
            print("one GPU: the smoke run's 2 processes run on CPU")
    if not 0 < args.resume_at < args.steps:
        p.error("--resume-at must lie strictly between 0 and --steps")
    to_gpus = [int(n) for n in args.to_gpus.split(",")]
    for n in [args.from_gpus, *to_gpus]:
        if args.global_batch % n:
            p.error(f"--global-batch {args.global_batch} is not a multiple of {n} processes")

    work = Path(args.work or tempfile.mkdtemp(prefix="gristmill-resume-"))
    tokens = Path(args.tokens) if args.tokens else synthetic_tokens(work / "tokens", n_tokens, **vocab)
    overrides = [
        f"data.tokens={tokens}",
        f"steps={args.steps}",
        f"data.global_batch={args.global_batch}",
        f"checkpoint.every={args.resume_at}",
        "checkpoint.keep=2",
        "eval.batches=0",
        "log.progress=false",
        "log.tensorboard=false",
        "schedule.warmup_steps=2",
        *args.set,
    ]
    cfg = load_config(args.size, overrides)
    cfg.data.micro_batch = min(cfg.data.micro_batch, args.global_batch // max(args.from_gpus, *to_gpus))

    base = work / f"from-{args.from_gpus}"
    secs = run(cfg, base, args.from_gpus)
    print(f"{args.size}: {args.steps} steps on {args.from_gpus} processes in {secs:.0f} s", flush=True)
    ckpt = base / "checkpoints" / f"step-{args.resume_at:08d}"
    if not ckpt.is_dir():
        raise SystemExit(f"no checkpoint at {ckpt}")
    ref = losses(base)

    table = {}
    for n in to_gpus:
        out = work / f"resume-on-{n}"
        shutil.rmtree(out, ignore_errors=True)
        # hard links: DCP writes new files, never rewrites, so the uninterrupted run's stay intact
        shutil.copytree(ckpt, out / "checkpoints" / ckpt.name, copy_function=os.link)
        secs = run(cfg, out, n)
        got = losses(out)
        missing = [s for s in range(args.resume_at + 1, args.steps + 1) if s not in got]
        if min(got) != args.resume_at + 1 or missing:
            raise SystemExit(f"resume on {n}: expected steps {args.resume_at + 1}…{args.steps}, got {sorted(got)}")
        table[n] = got
        print(
            f"resumed step {args.resume_at} on {n} processes, {args.steps - args.resume_at} steps in {secs:.0f} s",
            flush=True,
        )

    print(f"\nstep  {args.from_gpus}-process run  " + "  ".join(f"resumed on {n:<2d} (Δ)        " for n in to_gpus))
    for s in range(args.resume_at + 1, args.steps + 1):
        cells = "  ".join(f"{table[n][s]:.6f} ({table[n][s] - ref[s]:+.1e})" for n in to_gpus)
        print(f"{s:4d}  {ref[s]:.6f}     {cells}")
    print(f"loss before resume: step 1 {ref[1]:.4f} → step {args.resume_at} {ref[args.resume_at]:.4f}")
    for n in to_gpus:
        worst = max(abs(table[n][s] - ref[s]) / abs(ref[s]) for s in table[n])
        print(f"resume {args.from_gpus} → {n} processes: max relative loss difference {worst:.2e}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
