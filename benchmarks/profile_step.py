"""Where a training step's GPU time goes: ours and the plain compiled reference of
`train_throughput.py`, same shape and micro-batch, under torch.profiler; plus SDPA's backends
timed on their own at the model's attention shape.

    python benchmarks/profile_step.py --size 125m [--set model.attention=flash] [--top 25]
    torchrun --nproc-per-node 2 --local-ranks-filter 0 benchmarks/profile_step.py --size 1b --only ours \
        --json fsdp.json --trace fsdp-trace.json

Prints, for each model, the step time (CUDA events, median) and the kernels with the most GPU
time over the profiled steps (name truncated, share of the step, calls per step). Needs a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import VOCAB, reference_step  # noqa: E402

from gristmill.trainer.config import load as load_config  # noqa: E402
from gristmill.trainer.optim import clip_and_guard  # noqa: E402
from gristmill.trainer.parallel import init_distributed  # noqa: E402
from gristmill.trainer.train import build, model_args  # noqa: E402


def ours_step_fn(cfg, d):
    built = build(cfg, d, VOCAB)
    model, opt, autocast = built.model, built.optimizer, built.autocast

    def step(x):
        with autocast:
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        clip_and_guard(opt, 1.0)  # as the trainer's loop does
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def kernel_times(prof, calls: int) -> list[tuple[float, float, str]]:
    """(ms per call, launches per call, kernel name) from a CUDA-activity torch.profiler run
    of `calls` calls, longest first."""
    rows = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0 and ev.key and not ev.key.startswith("ProfilerStep"):
            rows.append((t / calls / 1000, ev.count / calls, ev.key))
    return sorted(rows, reverse=True)


def profile(name, step, mb, seq, top, steps=6, prof_steps=3, json_path=None, trace_path=None):
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randint(0, VOCAB, (mb, seq + 1), device="cuda", generator=g) for _ in range(4)]
    for i in range(steps):
        step(xs[i % 4]).item()
    times = []
    for i in range(8):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(xs[i % 4])
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    ms = statistics.median(times)
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(prof_steps):
            step(xs[i % 4])
        torch.cuda.synchronize()
    rows = kernel_times(prof, prof_steps)
    busy = sum(r[0] for r in rows)
    if json_path:  # for diffing two runs kernel by kernel (e.g. one GPU against FSDP on two)
        import json

        Path(json_path).write_text(json.dumps({"ms_per_step": ms, "kernels": rows}))
    if trace_path:
        prof.export_chrome_trace(trace_path)
    print(
        f"\n== {name}: {ms:.2f} ms/step ({mb * seq / ms * 1000:,.0f} tok/s), kernels busy {busy:.2f} ms/step,"
        f" peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
        flush=True,
    )
    for t, n, key in rows[:top]:
        print(f"  {t:7.3f} ms {t / ms:6.1%} {n:5.0f}×  {key[:90]}")
    return ms


def sdpa_backends(B, H, T, D):
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (
        torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3)
    )
    do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    flops = 4 * B * H * T * T * D / 2 * 3.5  # causal: half; fwd 1 + bwd 2.5
    print(f"\nSDPA fwd+bwd B={B} H={H} T={T} D={D}:")
    for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):

        def run():
            with sdpa_kernel([be]):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(do)

        try:
            ms = triton.testing.do_bench(run, warmup=25, rep=200)
            print(f"  {be.name:22s} {ms:7.3f} ms  {flops / ms / 1e9:6.0f} TFLOP/s")
        except RuntimeError as e:
            print(f"  {be.name:22s} unavailable: {str(e).splitlines()[0][:80]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="125m")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--only", choices=["ours", "reference"])
    p.add_argument("--json", help="write ours' step time and kernel table here (rank 0)")
    p.add_argument("--trace", help="write ours' profiled steps as a Chrome trace here (rank 0)")
    args = p.parse_args()
    d = init_distributed()
    cfg = load_config(args.size, ["data.tokens=/nonexistent", "compile=true", "kernels=triton", *args.set])
    margs = model_args(cfg, VOCAB)
    mb, seq = cfg.data.micro_batch, cfg.data.seq_len
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} size {args.size} micro_batch {mb} seq {seq}")
    sdpa_backends(mb, margs.n_heads, seq, margs.head_dim)
    res = {}
    if args.only != "reference":
        torch.cuda.reset_peak_memory_stats()
        res["ours"] = profile(
            "ours",
            ours_step_fn(cfg, d),
            mb,
            seq,
            args.top,
            json_path=args.json if d.is_main else None,
            trace_path=args.trace if d.is_main else None,
        )
        torch.cuda.empty_cache()
    if args.only != "ours":
        torch.cuda.reset_peak_memory_stats()
        res["reference"] = profile("reference", reference_step(margs, seq, d), mb, seq, args.top)
    if len(res) == 2:
        print(f"\nratio ours/reference (tokens/s): {res['reference'] / res['ours']:.3f}")


if __name__ == "__main__":
    import os

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/inductor-cache")
    main()
