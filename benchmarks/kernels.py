"""Each fused kernel against torch.compile of its PyTorch reference and against Liger-Kernel's
kernel, forward + backward, at the model presets' shapes. Needs a CUDA GPU; Liger is optional
(`pip install liger-kernel`, benchmark-only).

    python benchmarks/kernels.py [--sizes 125m,1b] [--tokens 16384] [--ops rms,rope] [--smoke]

Prints milliseconds per fwd+bwd and the ratios `compile / ours` and `liger / ours` (> 1: ours
is faster), twice: wall time per call (`triton.testing.do_bench`, L2 flushed before each call),
and GPU time — calls queued behind a sleep kernel and run back to back, as inside a training
step. An op of ~0.1 ms (RMSNorm) is bound by host launch overhead when timed alone, which swings
its wall ratio from run to run; in a training step the host runs ahead of the GPU and only the
GPU time counts.

"Ours" is what the model calls (`Kernels`): the Triton kernels on a GPU. `--smoke`: the `tiny`
preset's shapes, 512 tokens, a 4096 vocabulary, short timings (seconds; checks that the benchmark
still runs, its figures mean nothing). Without a GPU the smoke run takes the CPU path: ours is
then what the trainer runs on CPU (the PyTorch references, the chunked linear + cross-entropy),
fp32, timed by the host's clock, against the eager references; no torch.compile (its CPU build
would be all a smoke run measures) and no Liger (Triton).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from gristmill.trainer.kernels import Kernels
from gristmill.trainer.kernels.cross_entropy import cross_entropy_reference
from gristmill.trainer.kernels.rms_norm import rms_norm_reference
from gristmill.trainer.kernels.rope import rope_qkv_reference, rope_tables
from gristmill.trainer.kernels.swiglu import swiglu_reference

SHAPES = {  # dim, heads, ffn, as in configs/train/
    "tiny": (64, 4, 192),
    "125m": (768, 12, 2048),
    "350m": (1024, 16, 2816),
    "1b": (2048, 16, 5632),
}
VOCAB = 32000


def bench(fn, inputs, rep_ms=200) -> tuple[float, float]:
    """(wall ms, queued GPU ms) of one fwd+bwd, with a fixed random upstream gradient; on CPU
    (wall ms of the host's clock, NaN)."""
    xs = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    outs = fn(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [torch.randn_like(o) for o in outs]

    def step():
        for x in xs:
            x.grad = None
        o = fn(*xs)
        torch.autograd.backward(o if isinstance(o, tuple) else (o,), grads)

    if not xs[0].is_cuda:
        return host_ms(step, rep_ms), math.nan
    import triton.testing

    wall = triton.testing.do_bench(step, warmup=25, rep=rep_ms)
    return wall, queued_ms(step)


def host_ms(step, rep_ms: float) -> float:
    """Median wall ms of calls run for about `rep_ms` (at least 3), after one warm-up call."""
    step()
    times, end = [], time.perf_counter() + rep_ms / 1000
    while len(times) < 3 or time.perf_counter() < end:
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def queued_ms(step, calls: int = 40, repeats: int = 7) -> float:
    """GPU time per call with the host out of the way: a sleep kernel holds the GPU while the host
    queues `calls` calls, then the calls run back to back, as they do inside a training step
    (where the host runs ahead). Median of `repeats` timings; inter-kernel gaps are included, so
    an extra launch costs what it costs on the GPU."""
    for _ in range(3):
        step()
    cycles = 10**7
    times = []
    while len(times) < repeats:
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            step()
        queued = not start.query()  # the sleep still running: every call was queued in time
        end.record()
        torch.cuda.synchronize()
        # the host was slower than the sleep: sleep longer and time again (up to ~0.15 s: an op that
        # waits for the GPU itself cannot be queued, and its time is its wall time)
        if not queued and cycles < 2**28:
            cycles *= 2
            continue
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="125m,350m,1b")
    p.add_argument("--tokens", type=int, default=16384, help="tokens per call (micro-batch × seq_len)")
    p.add_argument("--ops", default="", help="comma-separated substrings of the op names to run (default: all)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, short timings; on CPU without a GPU")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    vocab, T, rep_ms = VOCAB, 2048, 200
    if args.smoke:
        args.sizes, args.tokens, vocab, T, rep_ms = "tiny", 512, 4096, 128, 20
    elif not cuda:
        p.error("no CUDA GPU: the figures are GPU figures (--smoke runs the CPU path at tiny sizes)")
    liger = None
    if not cuda:
        print("CPU (no GPU): ours is the trainer's CPU path (PyTorch references, chunked linear + CE), fp32;")
        print("torch.compile and liger-kernel skipped: their columns are CUDA figures")
    else:
        try:
            from liger_kernel.transformers import functional as liger
        except ImportError:
            print("liger-kernel not installed: its column is skipped")
    # what the model calls: Triton on a GPU, the references and the chunked CE on CPU
    ours = Kernels("triton" if cuda else "reference", fused_ce=True)
    dev, bf = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    B = args.tokens // T
    rows = []
    for size in args.sizes.split(","):
        # fresh compiles per size: with the previous size's graphs cached, dynamo recompiles with
        # dynamic shapes and the reference's kernels get slower than a static compile
        if cuda:
            torch._dynamo.reset()
        dim, heads, ffn = SHAPES[size]
        hd = heads and dim // heads
        N = B * T
        x = torch.randn(B, T, dim, device=dev, dtype=bf)
        r = torch.randn(B, T, dim, device=dev, dtype=bf)
        w = 1 + 0.1 * torch.randn(dim, device=dev, dtype=bf)
        gu = torch.randn(B, T, 2 * ffn, device=dev, dtype=bf)
        qkv = torch.randn(B, T, 3 * heads, hd, device=dev, dtype=bf)
        cos, sin = rope_tables(T, hd, 10000.0, dev)
        h = torch.randn(N, dim, device=dev, dtype=bf)
        W = (torch.randn(vocab, dim, device=dev) / dim**0.5).to(bf)
        tgt = torch.randint(0, vocab, (N,), device=dev)

        cases = {
            "rms_norm+residual": (
                lambda x, r, w: ours.rms_norm(x, w, 1e-5, r),
                lambda x, r, w: rms_norm_reference(x, w, 1e-5, r),
                (lambda x, r, w: liger.liger_fused_add_rms_norm(x, r, w, 1e-5, in_place=False)) if liger else None,
                [x, r, w],
            ),
            "swiglu": (
                ours.swiglu,
                swiglu_reference,
                (lambda gu: liger.liger_swiglu(*gu.chunk(2, -1))) if liger else None,
                [gu],
            ),
            # the fused q/k/v projection's output → rotated q, k and v (a view in both ours and
            # the reference). Liger rotates q and k only.
            "rope(qkv)": (
                lambda qkv: ours.rope_qkv(qkv, cos, sin, heads, heads),
                lambda qkv: rope_qkv_reference(qkv, cos, sin, heads, heads),
                (
                    lambda qkv: liger.liger_rope(
                        *(t.transpose(1, 2) for t in qkv.split(heads, 2)[:2]),
                        torch.cat([cos, cos], -1)[None].to(bf),
                        torch.cat([sin, sin], -1)[None].to(bf),
                    )
                )
                if liger
                else None,
                [qkv],
            ),
            "linear+cross_entropy": (
                lambda h, W, t: ours.linear_cross_entropy(h, W, t, 1e-4),
                lambda h, W, t: cross_entropy_reference(h, W, t, 1e-4),
                (lambda h, W, t: liger.liger_fused_linear_cross_entropy(h, W, t, lse_square_scale=1e-4))
                if liger
                else None,
                [h, W, tgt],
            ),
        }
        for name, (mine, ref, lig, inputs) in cases.items():
            if args.ops and not any(o in name for o in args.ops.split(",")):
                continue
            results = {}
            compiled = torch.compile(ref) if cuda else None
            for label, fn in (("ours", mine), ("eager", ref), ("compile", compiled), ("liger", lig)):
                if fn is None:
                    continue
                if not cuda:
                    results[label] = (*bench(fn, inputs, rep_ms), math.nan)
                    continue
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                ms, gms = bench(fn, inputs, rep_ms)
                results[label] = (ms, gms, (torch.cuda.max_memory_allocated() - base) / 2**20)
            rows.append((size, name, results))
            o, og, omib = results["ours"]
            if cuda:
                line = f"{size:5s} {name:22s} ours {o:7.3f} ms / GPU {og:7.3f} ms ({omib:6.0f} MiB)"
            else:
                line = f"{size:5s} {name:22s} ours {o:7.3f} ms"
            for label in ("eager", "compile", "liger"):
                if label in results:
                    ms, gms, mib = results[label]
                    if cuda:
                        line += (
                            f" | {label} {ms:7.3f} / {gms:7.3f} ms ({mib:6.0f} MiB) ×{ms / o:4.2f} / ×{gms / og:4.2f}"
                        )
                    else:
                        line += f" | {label} {ms:7.3f} ms ×{ms / o:4.2f}"
            print(line, flush=True)
    if cuda:
        print("ratios: other / ours, wall / GPU time (> 1: ours faster); MiB: peak extra memory during fwd+bwd")
    else:
        print("ratios: other / ours, wall time of the host (> 1: ours faster)")


if __name__ == "__main__":
    main()
