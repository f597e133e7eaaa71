"""The plan's memory model (`gristmill.trainer.plan`, `pipeline train --plan`) against the peak
memory a training step really allocates, side by side.

    python benchmarks/train_memory.py [--sizes 125m,350m,1b,3b] [--micro 1,2,4,8] [--ac none,selective,full]

One process per size (so one size's cached blocks and compiled graphs do not sit under the
next one's peak). In it, for each activation-checkpointing mode, the trainer's own model and
optimizer (`train.build`: Triton kernels, per-block compile, master weights on one GPU) and its
step (forward, backward, `clip_and_guard`, the optimizer step, gradients set to None) run two
steps at each micro-batch (one micro-batch per optimizer step, seq 2048, vocabulary 32,000);
measured = `torch.cuda.max_memory_allocated` over those steps, predicted = `plan.memory(...)`'s
peak, and a micro-batch that runs out of memory is shown as such beside whether the model said
it fits. Prints one table: size, ac, micro-batch, predicted and measured GiB, their ratio.

Needs a GPU, except `--smoke`: the `tiny` preset on the CPU, where there is no allocator to
measure: it runs the same steps and prints the predictions (checks that the script still runs).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

VOCAB = 32000
SMOKE_VOCAB = 4096


def measure_size(size: str, micros: list[int], acs: list[str], vocab: int) -> list[dict]:
    """Predicted and measured peak of every (ac, micro-batch) of one size, in this process."""
    import torch

    from gristmill.trainer.config import load as load_config
    from gristmill.trainer.optim import clip_and_guard
    from gristmill.trainer.parallel import init_distributed
    from gristmill.trainer.plan import GPUS, GiB, gpu_kind, memory_for
    from gristmill.trainer.train import build, model_args

    d = init_distributed()
    cuda = d.device.type == "cuda"
    fast = ["compile=true", "kernels=triton"] if cuda else ["compile=false", "kernels=reference"]
    kind = GPUS.get(gpu_kind(torch.cuda.get_device_name())) if cuda else None
    rows = []
    for ac in acs:
        # no dynamo reset between modes or micro-batches: after the second micro-batch the blocks
        # are compiled with a dynamic batch size, so later ones compile nothing new
        first = micros[0]
        cfg = load_config(
            size,
            ["data.tokens=/nonexistent", f"ac={ac}", f"data.micro_batch={first}", f"data.global_batch={first}", *fast],
        )
        built = build(cfg, d, vocab)
        model, opt, autocast = built.model, built.optimizer, built.autocast
        margs = model_args(cfg, vocab)
        g = torch.Generator(device=d.device).manual_seed(0)
        for micro in micros:
            cfg.data.micro_batch = cfg.data.global_batch = micro
            predicted = memory_for(cfg, margs, 1).peak
            fits = kind is None or predicted <= kind.usable_gib * GiB
            row = {"size": size, "ac": ac, "micro_batch": micro, "predicted_gib": predicted / GiB, "fits": fits}
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            try:
                for _ in range(2):
                    x = torch.randint(0, vocab, (micro, cfg.data.seq_len + 1), device=d.device, generator=g)
                    with autocast:
                        loss = model(x[:, :-1], x[:, 1:])
                    loss.backward()
                    clip_and_guard(opt, 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    del loss
                if cuda:
                    torch.cuda.synchronize()
                    row["measured_gib"] = torch.cuda.max_memory_allocated() / GiB
            except torch.OutOfMemoryError:
                row["measured_gib"] = None
                row["oom"] = True
                opt.zero_grad(set_to_none=True)
            rows.append(row)
            print("ROW " + json.dumps(row), flush=True)
        del model, opt, built
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return rows


def cuda_available() -> bool:
    # torch is imported where it is used, not at the top: the parent process only starts one
    # process per size and reads their rows (~2 CPU s of imports saved there)
    import torch

    return torch.cuda.is_available()


def table(rows: list[dict]) -> list[str]:
    out = [
        "| size | ac | micro-batch | predicted GiB | measured GiB | predicted / measured |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r.get("measured_gib")
        if r.get("oom"):
            got, ratio = "out of memory", "said it fits" if r["fits"] else "said: does not fit"
        elif m is None:
            got, ratio = "n/a (CPU)", "n/a"
        else:
            got, ratio = f"{m:.2f}", f"{r['predicted_gib'] / m:.3f}" + ("" if r["fits"] else " (said: does not fit)")
        out.append(f"| {r['size']} | {r['ac']} | {r['micro_batch']} | {r['predicted_gib']:.2f} | {got} | {ratio} |")
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="125m,350m,1b,3b")
    p.add_argument("--micro", default="1,2,4,8")
    p.add_argument("--ac", default="none,selective,full")
    p.add_argument("--smoke", action="store_true", help="tiny preset on the CPU: predictions only")
    p.add_argument("--json", help="write all rows here")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the per-size child process
    args = p.parse_args()
    vocab = VOCAB
    if args.smoke:
        args.sizes, args.micro, vocab = "tiny", "1,2", SMOKE_VOCAB
    elif not cuda_available():
        p.error("no CUDA GPU: the figures are GPU figures (--smoke runs the CPU path at the tiny preset)")
    micros = [int(x) for x in args.micro.split(",")]
    acs = args.ac.split(",")
    if args.one:
        measure_size(args.one, micros, acs, vocab)
        return
    rows = []
    for size in args.sizes.split(","):
        cmd = [sys.executable, __file__, "--one", size, "--micro", args.micro, "--ac", args.ac]
        cmd += ["--smoke"] if args.smoke else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        got = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
        if proc.returncode:
            print(f"{size}: child exited {proc.returncode}; its last output:\n{proc.stderr[-3000:]}", flush=True)
        rows += got
        print("\n".join(table(got)[2:]), flush=True)
    print("\n".join(table(rows)))
    measured = [r for r in rows if r.get("measured_gib")]
    if measured:
        worst = max(measured, key=lambda r: abs(r["predicted_gib"] / r["measured_gib"] - 1))
        print(
            f"worst predicted/measured: {worst['predicted_gib'] / worst['measured_gib']:.3f}"
            f" ({worst['size']} ac {worst['ac']} micro-batch {worst['micro_batch']});"
            f" out of memory where predicted to fit: {sum(1 for r in rows if r.get('oom') and r['fits'])}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/inductor-cache")
    main()
