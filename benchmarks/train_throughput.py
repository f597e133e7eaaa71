"""Our trainer against a plain compiled PyTorch Llama of the same shape, in one invocation.

    python benchmarks/train_throughput.py [--sizes 125m,350m,1b] [--steps 20] [--smoke]
    torchrun --nproc-per-node 2 benchmarks/train_throughput.py     # any number of GPUs

Ours: `gristmill.trainer.train.train` itself (FSDP2 bf16/fp32-reduce, Triton kernels, fused
linear+CE, per-block compile, fused AdamW) on a synthetic token directory, once per `--variant`
(e.g. bf16 and fp8). Reference: the same shapes as a plain PyTorch Llama (nn.Linear with one
fused q/k/v projection, nn.RMSNorm, SDPA, full logits + F.cross_entropy), fp32 weights under
bf16 autocast, the whole model and its loss compiled as one graph,
`clip_grad_norm_(foreach=True)`, fused AdamW, DDP when world size > 1. Same micro-batch, seq
2048. Tokens/s is the median over the steps after warm-up; MFU = tokens/s/GPU × (6·N + 12·L·d·T)
/ peak for both, N every matmul's weights, the output head included (`ModelArgs.flops_per_token`).
`--write-calibration` keeps the figures for `pipeline train --plan`.

Needs a GPU, except `--smoke`: the `tiny` preset, 4 steps, a small token directory (seconds;
checks that the benchmark still runs, its figures mean nothing). Without a GPU the smoke run
takes the CPU path of both sides: the kernels' PyTorch references, fp32, no torch.compile (it
would time the compiler), the host's clock and no memory figures.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gristmill.trainer.config import load as load_config
from gristmill.trainer.metrics import peak_flops
from gristmill.trainer.parallel import init_distributed
from gristmill.trainer.train import model_args, train

VOCAB = 32000
SMOKE_VOCAB = 4096  # --smoke: at the tiny preset's width a 32k vocabulary is most of the step


def synthetic_tokens(root: Path, n_tokens: int, seed: int = 0, vocab: int = VOCAB) -> Path:
    """Random documents in the token-shard contract (one train shard, one val shard)."""
    import hashlib

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    # a tokenizer of `vocab` ids: the reader checks the manifest's sha256 and vocab_size against it
    (root / "tokenizer.json").write_text(Tokenizer(WordLevel({f"<{i}>": i for i in range(vocab)}, "<0>")).to_str())
    schema = pa.schema(
        [
            pa.field("tokens", pa.large_list(pa.field("item", pa.uint16(), nullable=False)), nullable=False),
            pa.field("id", pa.string()),
        ]
    )
    shards = []
    for split, n in (("train", n_tokens), ("val", n_tokens // 20)):
        lengths = rng.integers(200, 4000, size=n // 2000 + 1)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = rng.integers(2, vocab, size=int(offsets[-1]), dtype=np.uint16)
        arr = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
        name = f"{split}-00000.arrow"
        with pa.OSFile(str(root / name), "wb") as sink, pa.ipc.new_file(sink, schema) as w:
            w.write_batch(
                pa.record_batch([arr, pa.array([f"{split}-{i}" for i in range(len(lengths))])], schema=schema)
            )
        shards.append(
            {
                "path": name,
                "split": split,
                "documents": len(lengths),
                "tokens": int(offsets[-1]),
                "sha256": hashlib.sha256((root / name).read_bytes()).hexdigest(),
            }
        )
    manifest = {
        "format": "gristmill-tokens",
        "version": 1,
        "dtype": "uint16",
        "seed": seed,
        "shards": shards,
        "tokenizer": {
            "file": "tokenizer.json",
            "sha256": hashlib.sha256((root / "tokenizer.json").read_bytes()).hexdigest(),
            "vocab_size": vocab,
            "eos_id": 1,
            "bos_id": 1,
        },
        "splits": {s["split"]: {"shards": 1, "documents": s["documents"], "tokens": s["tokens"]} for s in shards},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


# --- the plain reference model ---------------------------------------------------------------


class RefBlock(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim, eps=1e-5)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)  # [q; k; v] in one matmul, as ours
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1, self.w3 = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    @staticmethod
    def rope(x, cos, sin):
        x1, x2 = x.chunk(2, -1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        h = self.n1(x)
        q, k, v = self.wqkv(h).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)  # (B, heads, T, hd) each
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.wo(o)
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class RefModel(nn.Module):
    def __init__(self, dim, layers, heads, ffn, vocab, seq):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(RefBlock(dim, heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.out = nn.Linear(dim, vocab, bias=False)
        hd = dim // heads
        inv = 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd)
        f = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", f.cos(), persistent=False)
        self.register_buffer("sin", f.sin(), persistent=False)
        for p in self.parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02)

    def head(self, x, targets):
        return F.cross_entropy(self.out(self.norm(x)).float().flatten(0, 1), targets.flatten())

    def forward(self, tokens, targets):
        x = self.emb(tokens)
        for block in self.layers:
            x = block(x, self.cos, self.sin)
        return self.head(x, targets)


_BASE = [0]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def start_memory() -> None:
    """Peak memory counts from here, less what is already allocated (earlier sizes' leftovers
    in a multi-size run)."""
    gc.collect()
    if not torch.cuda.is_available():
        return
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    _BASE[0] = torch.cuda.memory_allocated()


def peak_gib() -> float:
    """NaN on CPU (no allocator statistics)."""
    if not torch.cuda.is_available():
        return float("nan")
    return (torch.cuda.max_memory_allocated() - _BASE[0]) / 2**30


def reference_step(args_model, seq: int, d):
    """The compiled plain reference and its training step: `step(x) -> loss` on (B, seq + 1)
    tokens (bf16 autocast, clip_grad_norm_, fused AdamW; DDP when world size > 1). On CPU
    (smoke runs): fp32 and no compile, as our trainer runs there."""
    cuda = d.device.type == "cuda"
    vocab = args_model.vocab_size
    m = RefModel(args_model.dim, args_model.n_layers, args_model.n_heads, args_model.ffn_dim, vocab, seq).to(d.device)
    model = torch.compile(m) if cuda else m  # the whole model, loss included: one graph
    if d.world > 1:
        model = nn.parallel.DistributedDataParallel(m, device_ids=[d.device.index] if cuda else None)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    def step(x):
        with autocast:
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


OOM = {"tokens_per_s_per_gpu": float("nan"), "max_memory_gib": float("nan"), "oom": True}


def run_reference(args_model, micro_batch: int, seq: int, steps: int, warmup: int, d) -> dict:
    step = reference_step(args_model, seq, d)
    g = torch.Generator(device=d.device).manual_seed(d.rank)
    times = []
    for _ in range(steps):
        x = torch.randint(0, args_model.vocab_size, (micro_batch, seq + 1), device=d.device, generator=g)
        sync(d.device)
        t0 = time.perf_counter()
        try:
            step(x).item()
        except torch.OutOfMemoryError:  # a micro-batch the reference cannot hold: said so, the run goes on
            del step
            return OOM
        sync(d.device)
        times.append(time.perf_counter() - t0)
    tps = micro_batch * seq / statistics.median(times[warmup:])  # per GPU
    return {"tokens_per_s_per_gpu": tps, "max_memory_gib": peak_gib()}


def run_ours(
    size: str,
    tokens: Path,
    out: Path,
    steps: int,
    warmup: int,
    micro_batch: int | None,
    world: int,
    extra: list[str],
    cuda: bool = True,
) -> dict:
    overrides = [
        f"data.tokens={tokens}",
        f"steps={steps}",
        "checkpoint.enabled=false",
        "eval.batches=0",
        "log.progress=false",
        "log.tensorboard=false",
        "schedule.warmup_steps=0",
        # on CPU (smoke runs) the kernels' PyTorch references, no compile: what the trainer runs there
        f"kernels={'triton' if cuda else 'reference'}",
        f"compile={'true' if cuda else 'false'}",
        *extra,
    ]
    if micro_batch:
        overrides.append(f"data.micro_batch={micro_batch}")
    cfg = load_config(size, overrides)
    cfg.data.global_batch = cfg.data.micro_batch * world  # no accumulation: one micro-batch per step
    try:
        train(cfg, out)
    except torch.OutOfMemoryError:
        return {**OOM, "micro_batch": cfg.data.micro_batch, "cfg": cfg}
    recs = [json.loads(line) for line in open(out / "metrics.jsonl")] if (out / "metrics.jsonl").exists() else []
    steps = [r for r in recs if "tokens_per_s_per_device" in r]  # not the validation records
    tps = statistics.median(r["tokens_per_s_per_device"] for r in steps[warmup:]) if steps else 0.0
    return {
        "tokens_per_s_per_gpu": tps,
        "max_memory_gib": peak_gib(),
        "micro_batch": cfg.data.micro_batch,
        "cfg": cfg,
        "losses": [r["loss"] for r in recs if "loss" in r],
    }


def loss_report(size: str, name: str, losses: list[float], base_name: str, base: list[float]) -> str:
    """The loss of `name` against the first variant's over the same steps of the same data:
    the gap of the last 100 steps' means, and the largest gap of 50-step means along the way."""
    n = min(len(losses), len(base))
    if n < 2:
        return f"{size:5s} loss {name}/{base_name}: too few steps to compare"
    w = min(100, n)
    tail, tail_base = statistics.fmean(losses[n - w : n]), statistics.fmean(base[n - w : n])
    windows = [
        abs(statistics.fmean(losses[i : i + 50]) - statistics.fmean(base[i : i + 50])) for i in range(0, n - 49, 50)
    ] or [abs(tail - tail_base)]
    return (
        f"{size:5s} loss {name}/{base_name} over {n} steps: last {w} steps' mean {tail:.4f} vs {tail_base:.4f}"
        f" (gap {tail - tail_base:+.4f}, {(tail - tail_base) / tail_base:+.2%}); largest 50-step-mean gap"
        f" {max(windows):.4f}; step 1 {losses[0]:.4f} vs {base[0]:.4f}"
    )


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'NAME=KEY=VALUE,KEY=VALUE' → (NAME, ['KEY=VALUE', ...]); 'NAME=' has no overrides."""
    name, _, sets = text.partition("=")
    if not name:
        raise SystemExit(f"--variant {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...]")
    return name, [x for x in sets.split(",") if x]


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def write_calibration(path: Path, points: list[dict], device: str, cuda: bool) -> None:
    """Merges `points` into the calibration file at `path`: a point replaces an earlier one of
    the same GPU, preset, variant settings, GPU count, micro-batch, activation checkpointing and
    precision. The plan takes MFU from here (`trainer.plan`)."""
    from gristmill.trainer.plan import gpu_kind

    old = json.loads(path.read_text()) if path.is_file() else {"points": []}
    kind = gpu_kind(device) if cuda else "cpu"
    stamp = time.strftime("%Y-%m-%d")
    new = [{"gpu": kind, "device": device, "torch": torch.__version__, "measured": stamp, **p} for p in points]

    def key(p):
        return (p["gpu"], p["preset"], p["gpus"], p["micro_batch"], p["ac"], p["precision"], p.get("fp8_recipe"))

    latest = {key(p): p for p in new}  # of two runs with the same settings, the later
    merged = [p for p in old.get("points", []) if key(p) not in latest] + list(latest.values())
    merged.sort(key=lambda p: (p["gpu"], p["matmul_params"], p["precision"], p["ac"], p["micro_batch"], p["gpus"]))
    doc = {
        "about": "tokens/s and MFU of the trainer, measured by benchmarks/train_throughput.py"
        " --write-calibration; `pipeline train --plan` projects time from the nearest point",
        "points": merged,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"calibration: {len(latest)} points written to {path}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="125m,350m,1b")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument(
        "--smoke", action="store_true", help="tiny preset, 4 steps; on CPU without a GPU: checks that it runs"
    )
    p.add_argument("--micro-batch", type=int, default=None, help="override the presets' micro_batch")
    p.add_argument("--only", choices=["ours", "reference"], default=None)
    p.add_argument("--set", action="append", default=[], help="extra train-config overrides for ours")
    p.add_argument(
        "--torch-optimizer",
        action="store_true",
        help="ours with torch's fused AdamW and clip_grad_norm_ on DTensors, fp32 weights under"
        " autocast without FSDP (A/B of trainer.optim)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=KEY=VALUE[,KEY=VALUE...]",
        help="run ours once per variant, each with its own overrides (after --set), and print each"
        " against the reference and the first variant; e.g. --variant bf16= --variant"
        " fp8=precision=fp8,fp8_recipe=tensorwise (default: one run named 'ours')",
    )
    p.add_argument(
        "--write-calibration",
        metavar="FILE",
        help="merge the measured points (tokens/s and MFU per preset, micro-batch, activation"
        " checkpointing and precision) into this calibration file, which `pipeline train --plan`"
        " projects time from (the shipped one: src/gristmill/trainer/train_calibration.json)",
    )
    p.add_argument(
        "--tokens",
        help="train on this token directory instead of synthetic random tokens (e.g. real text, for --compare-loss)",
    )
    p.add_argument(
        "--compare-loss",
        action="store_true",
        help="print each variant's loss against the first variant's over the same steps (e.g. fp8 against bf16)",
    )
    p.add_argument("--metrics-dir", help="keep each run's metrics.jsonl here, as SIZE-VARIANT.jsonl")
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variant] or [("ours", [])]
    n_tokens, vocab = 4_000_000, VOCAB
    if args.smoke:
        args.sizes, args.steps, args.warmup, n_tokens, vocab = "tiny", 4, 1, 200_000, SMOKE_VOCAB
    elif not torch.cuda.is_available():
        p.error("no CUDA GPU: the figures are GPU figures (--smoke runs the CPU path at tiny sizes)")
    if args.torch_optimizer:
        import gristmill.trainer.train as T

        def torch_clip(optimizer, max_norm):
            params = [p for g in optimizer.param_groups for p in g["params"]]
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
            return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

        T.AdamW = lambda params, **kw: torch.optim.AdamW(params, fused=True, **kw)
        T.clip_and_guard = torch_clip
        args.set.append("master_weights=false")  # torch's AdamW has no fp32 masters: autocast instead
    d = init_distributed()
    cuda = d.device.type == "cuda"
    peak = peak_flops(d.device)
    # one directory for all ranks: rank 0 makes it and tells the others where
    box = [tempfile.mkdtemp(prefix="gristmill-bench-") if d.is_main else None]
    if d.world > 1:
        dist.broadcast_object_list(box, src=0)
    tmp = Path(box[0])
    tokens = tmp / "tokens"
    if args.tokens:
        tokens = Path(args.tokens).resolve()
        vocab = json.loads((tokens / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    elif d.is_main:
        synthetic_tokens(tokens, n_tokens, vocab=vocab)
    dist.barrier()
    if d.is_main:
        name = torch.cuda.get_device_name() if cuda else "CPU (no GPU: fp32, reference kernels, no compile)"
        print(f"device: {name} × {d.world}, torch {torch.__version__}", flush=True)
    points = []
    for size in args.sizes.split(","):
        res = {}
        for name, sets in variants:
            if args.only == "reference":
                break
            # fresh compile caches per run: otherwise new shapes make dynamo recompile every
            # block with dynamic shapes (slow to build, slower to run)
            torch._dynamo.reset()
            start_memory()
            res[name] = run_ours(
                size,
                tokens,
                tmp / f"out-{size}-{name}",
                args.steps,
                args.warmup,
                args.micro_batch,
                d.world,
                [*args.set, *sets],
                cuda,
            )
            if cuda:
                torch.cuda.empty_cache()
            metrics = tmp / f"out-{size}-{name}" / "metrics.jsonl"
            if args.metrics_dir and d.is_main and metrics.exists():
                Path(args.metrics_dir).mkdir(parents=True, exist_ok=True)
                shutil.copy(metrics, Path(args.metrics_dir) / f"{size}-{name}.jsonl")
        torch._dynamo.reset()
        first = next(iter(res.values()), None)
        cfg = first["cfg"] if first else load_config(size, [f"data.tokens={tokens}"])
        margs = model_args(cfg, vocab)
        mb = args.micro_batch or cfg.data.micro_batch
        if args.only != "ours":
            start_memory()
            res["reference"] = run_reference(margs, mb, cfg.data.seq_len, args.steps, args.warmup, d)
            if cuda:
                torch.cuda.empty_cache()
        if not d.is_main:
            continue
        fpt = margs.flops_per_token(cfg.data.seq_len)
        for name, r in res.items():
            mfu = r["tokens_per_s_per_gpu"] * fpt / peak if peak else float("nan")
            r["mfu"] = mfu
            if r.get("oom"):
                print(f"{size:5s} {name:9s} micro_batch {r.get('micro_batch', mb)}: out of memory", flush=True)
                continue
            print(
                f"{size:5s} {name:9s} micro_batch {r.get('micro_batch', mb)} seq {cfg.data.seq_len}:"
                f" {r['tokens_per_s_per_gpu']:9,.0f} tok/s/GPU  MFU {mfu:5.1%}"
                f"  peak mem {r['max_memory_gib']:5.1f} GiB",
                flush=True,
            )
        ref = res.get("reference")
        for name, o in res.items():
            if name == "reference" or o.get("oom"):
                continue
            if ref is not None and not ref.get("oom"):
                print(
                    f"{size:5s} ratio {name}/reference: ×{o['tokens_per_s_per_gpu'] / ref['tokens_per_s_per_gpu']:.3f}"
                    f" tokens/s, memory {o['max_memory_gib'] / ref['max_memory_gib']:.2f}×",
                    flush=True,
                )
            if o is not first:
                rel = o["tokens_per_s_per_gpu"] / first["tokens_per_s_per_gpu"]
                print(f"{size:5s} ratio {name}/{variants[0][0]}: ×{rel:.3f} tokens/s", flush=True)
                if args.compare_loss:
                    print(loss_report(size, name, o["losses"], variants[0][0], first["losses"]), flush=True)
            c = o["cfg"]
            points.append(
                {
                    "preset": size,
                    "variant": name,
                    "gpus": d.world,
                    "matmul_params": margs.matmul_params(),
                    "flops_per_token": fpt,
                    "micro_batch": c.data.micro_batch,
                    "seq_len": c.data.seq_len,
                    "ac": c.ac,
                    "precision": c.precision if c.precision != "auto" else ("bf16" if cuda else "fp32"),
                    "fp8_recipe": c.fp8_recipe if c.precision == "fp8" else None,
                    "tokens_per_s_per_gpu": round(o["tokens_per_s_per_gpu"], 1),
                    "mfu": round(o["mfu"], 4) if peak else None,
                    "max_memory_gib": round(o["max_memory_gib"], 2) if cuda else None,
                }
            )
    if d.is_main and args.write_calibration and points:
        write_calibration(Path(args.write_calibration), points, device_name(d.device), cuda)
    dist.barrier()
    if d.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/inductor-cache")
    main()
