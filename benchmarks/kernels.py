"""Each fused kernel against torch.compile of its PyTorch reference and against Liger-Kernel's
kernel, forward + backward, at the model presets' shapes. Needs a CUDA GPU; Liger is optional
(`pip install liger-kernel`, benchmark-only).

    python benchmarks/kernels.py [--sizes 125m,1b] [--tokens 16384] [--ops rms,rope]

Prints milliseconds per fwd+bwd and the ratios `compile / ours` and `liger / ours` (> 1: ours
is faster), twice: wall time per call (`triton.testing.do_bench`, L2 flushed before each call),
and GPU time — calls queued behind a sleep kernel and run back to back, as inside a training
step. An op of ~0.1 ms (RMSNorm) is bound by host launch overhead when timed alone, which swings
its wall ratio from run to run; in a training step the host runs ahead of the GPU and only the
GPU time counts.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from gristmill.trainer.kernels.cross_entropy import cross_entropy_reference, fused_linear_cross_entropy  # noqa: E402
from gristmill.trainer.kernels.rms_norm import rms_norm_reference, rms_norm_triton  # noqa: E402
from gristmill.trainer.kernels.rope import rope_qkv_reference, rope_qkv_triton, rope_tables  # noqa: E402
from gristmill.trainer.kernels.swiglu import swiglu_reference, swiglu_triton  # noqa: E402

SHAPES = {  # dim, heads, ffn, as in configs/train/
    "125m": (768, 12, 2048),
    "350m": (1024, 16, 2816),
    "1b": (2048, 16, 5632),
}
VOCAB = 32000


def bench(fn, inputs, rep_ms=200) -> tuple[float, float]:
    """(wall ms, queued GPU ms) of one fwd+bwd, with a fixed random upstream gradient."""
    import triton.testing

    xs = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    outs = fn(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [torch.randn_like(o) for o in outs]

    def step():
        for x in xs:
            x.grad = None
        o = fn(*xs)
        torch.autograd.backward(o if isinstance(o, tuple) else (o,), grads)

    wall = triton.testing.do_bench(step, warmup=25, rep=rep_ms)
    return wall, queued_ms(step)


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
    args = p.parse_args()
    try:
        from liger_kernel.transformers import functional as liger
    except ImportError:
        liger = None
        print("liger-kernel not installed: its column is skipped")
    dev, bf = "cuda", torch.bfloat16
    T = 2048
    B = args.tokens // T
    rows = []
    for size in args.sizes.split(","):
        # fresh compiles per size: with the previous size's graphs cached, dynamo recompiles with
        # dynamic shapes and the reference's kernels get slower than a static compile
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
        W = (torch.randn(VOCAB, dim, device=dev) / dim**0.5).to(bf)
        tgt = torch.randint(0, VOCAB, (N,), device=dev)

        cases = {
            "rms_norm+residual": (
                lambda x, r, w: rms_norm_triton(x, w, 1e-5, r),
                lambda x, r, w: rms_norm_reference(x, w, 1e-5, r),
                (lambda x, r, w: liger.liger_fused_add_rms_norm(x, r, w, 1e-5, in_place=False)) if liger else None,
                [x, r, w],
            ),
            "swiglu": (
                swiglu_triton,
                swiglu_reference,
                (lambda gu: liger.liger_swiglu(*gu.chunk(2, -1))) if liger else None,
                [gu],
            ),
            # the fused q/k/v projection's output → rotated q, k and v (a view in both ours and
            # the reference). Liger rotates q and k only.
            "rope(qkv)": (
                lambda qkv: rope_qkv_triton(qkv, cos, sin, heads, heads),
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
                lambda h, W, t: fused_linear_cross_entropy(h, W, t, 1e-4, impl="triton"),
                lambda h, W, t: cross_entropy_reference(h, W, t, 1e-4),
                (lambda h, W, t: liger.liger_fused_linear_cross_entropy(h, W, t, lse_square_scale=1e-4))
                if liger
                else None,
                [h, W, tgt],
            ),
        }
        for name, (ours, ref, lig, inputs) in cases.items():
            if args.ops and not any(o in name for o in args.ops.split(",")):
                continue
            torch.cuda.synchronize()
            results = {}
            for label, fn in (("ours", ours), ("eager", ref), ("compile", torch.compile(ref)), ("liger", lig)):
                if fn is None:
                    continue
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                ms, gms = bench(fn, inputs)
                results[label] = (ms, gms, (torch.cuda.max_memory_allocated() - base) / 2**20)
            rows.append((size, name, results))
            o, og, omib = results["ours"]
            line = f"{size:5s} {name:22s} ours {o:7.3f} ms / GPU {og:7.3f} ms ({omib:6.0f} MiB)"
            for label in ("eager", "compile", "liger"):
                if label in results:
                    ms, gms, mib = results[label]
                    line += f" | {label} {ms:7.3f} / {gms:7.3f} ms ({mib:6.0f} MiB) ×{ms / o:4.2f} / ×{gms / og:4.2f}"
            print(line, flush=True)
    print("ratios: other / ours, wall / GPU time (> 1: ours faster); MiB: peak extra memory during fwd+bwd")


if __name__ == "__main__":
    main()
