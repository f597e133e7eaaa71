"""Where a training step's GPU time goes: ours and the plain compiled reference of
`train_throughput.py`, same shape and micro-batch, under torch.profiler; plus SDPA's backends
timed on their own at the model's attention shape.

    python benchmarks/profile_step.py --size 125m [--set model.attention=flash] [--top 25]
    torchrun --nproc-per-node 2 --local-ranks-filter 0 benchmarks/profile_step.py --size 1b --only ours \
        --json fsdp.json --trace fsdp-trace.json

Prints, for each model, the step time (CUDA events, median) and the kernels with the most GPU
time over the profiled steps (name truncated, share of the step, calls per step). Needs a GPU,
except `--smoke`: the `tiny` preset, a few steps (seconds; checks that the benchmark still runs,
its figures mean nothing). Without a GPU the smoke run takes the CPU path: the kernels' PyTorch
references, fp32, no torch.compile, host timers, the ops with the most CPU time, no SDPA backends.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import SMOKE_VOCAB, VOCAB, reference_step, sync  # noqa: E402

from gristmill.trainer.config import load as load_config  # noqa: E402
from gristmill.trainer.optim import clip_and_guard  # noqa: E402
from gristmill.trainer.parallel import init_distributed  # noqa: E402
from gristmill.trainer.train import build, model_args  # noqa: E402


def ours_step_fn(cfg, d, vocab):
    built = build(cfg, d, vocab)
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


def kernel_times(prof, calls: int, cuda: bool = True) -> list[tuple[float, float, str]]:
    """(ms per call, launches per call, kernel name) from a CUDA-activity torch.profiler run
    of `calls` calls, longest first; on CPU, ops and their own CPU time."""
    rows = []
    for ev in prof.key_averages():
        if cuda:
            t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        else:
            t = ev.self_cpu_time_total
        if t > 0 and ev.key and not ev.key.startswith("ProfilerStep"):
            rows.append((t / calls / 1000, ev.count / calls, ev.key))
    return sorted(rows, reverse=True)


def step_ms(step, x, device: torch.device) -> float:
    """One step's time: CUDA events on a GPU, the host's clock (the step runs there) on CPU."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        step(x)
        return (time.perf_counter() - t0) * 1000
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    step(x)
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)


def profile(name, step, mb, seq, vocab, top, device, steps=6, timed=8, prof_steps=3, json_path=None, trace_path=None):
    cuda = device.type == "cuda"
    g = torch.Generator(device=device).manual_seed(0)
    xs = [torch.randint(0, vocab, (mb, seq + 1), device=device, generator=g) for _ in range(4)]
    for i in range(steps):
        step(xs[i % 4]).item()
    ms = statistics.median(step_ms(step, xs[i % 4], device) for i in range(timed))
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    with tprofile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for i in range(prof_steps):
            step(xs[i % 4])
        sync(device)
    rows = kernel_times(prof, prof_steps, cuda)
    busy = sum(r[0] for r in rows)
    if json_path:  # for diffing two runs kernel by kernel (e.g. one GPU against FSDP on two)
        import json

        Path(json_path).write_text(json.dumps({"ms_per_step": ms, "kernels": rows}))
    if trace_path:
        prof.export_chrome_trace(trace_path)
    peak = f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if cuda else "n/a on CPU"
    print(
        f"\n== {name}: {ms:.2f} ms/step ({mb * seq / ms * 1000:,.0f} tok/s), {'kernels' if cuda else 'ops'} busy"
        f" {busy:.2f} ms/step, peak mem {peak}",
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
    p.add_argument("--smoke", action="store_true", help="tiny preset, a few steps; on CPU without a GPU")
    args = p.parse_args()
    steps, vocab = {"steps": 6, "timed": 8, "prof_steps": 3}, VOCAB
    if args.smoke:
        args.size, args.top, steps, vocab = "tiny", 10, {"steps": 1, "timed": 2, "prof_steps": 1}, SMOKE_VOCAB
    elif not torch.cuda.is_available():
        p.error("no CUDA GPU: the figures are GPU figures (--smoke runs the CPU path at tiny sizes)")
    d = init_distributed()
    cuda = d.device.type == "cuda"
    # on CPU (smoke runs) the kernels' PyTorch references, no compile: what the trainer runs there
    fast = ["compile=true", "kernels=triton"] if cuda else ["compile=false", "kernels=reference"]
    cfg = load_config(args.size, ["data.tokens=/nonexistent", *fast, *args.set])
    margs = model_args(cfg, vocab)
    mb, seq = cfg.data.micro_batch, cfg.data.seq_len
    name = torch.cuda.get_device_name() if cuda else "CPU (no GPU: fp32, reference kernels, no compile)"
    print(f"{name} torch {torch.__version__} size {args.size} micro_batch {mb} seq {seq}")
    if cuda:
        sdpa_backends(mb, margs.n_heads, seq, margs.head_dim)
    else:
        print("SDPA backends not timed: they are CUDA kernels")
    res = {}
    if args.only != "reference":
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        res["ours"] = profile(
            "ours",
            ours_step_fn(cfg, d, vocab),
            mb,
            seq,
            vocab,
            args.top,
            d.device,
            **steps,
            json_path=args.json if d.is_main else None,
            trace_path=args.trace if d.is_main else None,
        )
        if cuda:
            torch.cuda.empty_cache()
    if args.only != "ours":
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        res["reference"] = profile(
            "reference", reference_step(margs, seq, d), mb, seq, vocab, args.top, d.device, **steps
        )
    if len(res) == 2:
        print(f"\nratio ours/reference (tokens/s): {res['reference'] / res['ours']:.3f}")


if __name__ == "__main__":
    import os

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/inductor-cache")
    main()
