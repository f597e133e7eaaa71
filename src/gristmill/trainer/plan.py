"""`pipeline train CONFIG --plan`: what a training run needs, before a GPU is taken.

For a train config, a GPU kind and a number of GPUs: the parameters (embedding and not), the
FLOPs per token (`ModelArgs.flops_per_token`: 6·N over every matmul's weights, the output head
included, + 12·L·d·T for attention), the peak memory per GPU split into parameters, gradients,
optimizer state and activations, the largest micro-batch that fits, and the time for the
configured token budget (steps × global batch × seq_len) at the MFU measured for the nearest
calibrated size (`train_calibration.json`, written by `benchmarks/train_throughput.py
--write-calibration`, as `pipeline plan` projects from `scale_calibration.json`).

The memory model counts what the GPU path keeps (Triton kernels, compiled blocks, the fused
linear + cross-entropy head), tensor by tensor; `torch.cuda.max_memory_allocated` is what it
predicts, checked on an H100 against measured peaks (`benchmarks/train_memory.py`, the table
in docs/benchmarks.md). Per token and block, with a = bytes per activation (2 in bf16):

- `ac: none` keeps the block's input x, the normed input of q/k/v, the q/k/v output (RoPE
  rotates it in place and attention reads it), attention's output and its log-sum-exp (fp32 per
  head), the residual sum and its normed copy, the gate/up output and SwiGLU's output, and two
  fp32 reciprocal RMS values;
- `selective` keeps x, the matmuls' outputs that a recompute needs (q/k/v, the attention
  projection, gate/up) and attention's output and log-sum-exp; backward recomputes one block's
  norms, RoPE and SwiGLU at a time;
- `full` keeps x alone and recomputes one whole block at a time in backward.

The peak is the larger of two moments: the end of the forward (every block's saved tensors, the
final norm's input and output, and the head's chunked logits, which sit beside the fp32 ∂h and
∂W the fused head computes in its forward) and the first block's backward (every block's saved
tensors, that block's recomputed ones and its backward's temporaries). Gradients exist only after
the activations are gone (set to None after each step), except an accumulation buffer: the peak
is parameters + optimizer state + the larger of (activations + resident gradients) and the full
gradients. FP8 (torchao's Float8Linear) keeps the same bf16 tensors for its backward. With
several GPUs (FSDP2), the fp32 parameters, gradients and moments are sharded, and the bf16
parameters gathered for compute stay whole from forward to backward when `fsdp_reshard` is false
(or two units at a time when true); the several-GPU figures are not yet checked on a GPU.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gristmill.core.configlib import ConfigError
from gristmill.trainer.config import TrainConfig
from gristmill.trainer.model import ModelArgs

GiB = 2**30
CALIBRATION_FILE = "train_calibration.json"
DEFAULT_VOCAB = 32000


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float  # total memory as torch.cuda reports it
    peak_bf16: float  # dense bf16 FLOP/s (the MFU denominator, FP8 runs included)
    fp8: bool  # FP8 tensor cores (compute capability 8.9+)

    @property
    def usable_gib(self) -> float:
        """What the caching allocator can hand out: less the CUDA context, cuBLAS/cuDNN
        workspaces and NCCL buffers (~1 GiB, outside its count) and 5% for fragmentation."""
        return 0.95 * self.memory_gib - 1.0


GPUS = {
    "h100": GPU("H100 80GB", 81559 / 1024, 989e12, True),
    "h200": GPU("H200", 143771 / 1024, 989e12, True),
    "a100": GPU("A100 80GB", 81920 / 1024, 312e12, False),
    "a100-40gb": GPU("A100 40GB", 40960 / 1024, 312e12, False),
    "l40s": GPU("L40S", 46068 / 1024, 362e12, True),
}


def gpu_kind(device_name: str) -> str:
    """The GPUS key of a CUDA device name ('NVIDIA H100 80GB HBM3' → 'h100'), or the name
    lower-cased when it is none of them."""
    name = device_name.upper()
    for key in ("H200", "H100", "L40S"):
        if key in name:
            return key.lower()
    if "A100" in name:
        return "a100-40gb" if "40GB" in name else "a100"
    return device_name.lower()


# --- parameters ------------------------------------------------------------------------------


def param_count(args: ModelArgs) -> dict[str, int]:
    emb = args.embedding_params()
    non = args.non_embedding_params()
    return {"total": emb + non, "embedding": emb, "non_embedding": non, "matmul": args.matmul_params()}


# --- memory ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU: `gradients` is their full size (at the optimizer step),
    `resident_gradients` what of it lives through the forward (an accumulation buffer),
    `activations` the larger of the two activation peaks (module docstring)."""

    parameters: float
    optimizer: float
    gradients: float
    resident_gradients: float
    activations: float
    notes: dict

    @property
    def peak(self) -> float:
        return self.parameters + self.optimizer + max(self.activations + self.resident_gradients, self.gradients)


def saved_per_token_layer(args: ModelArgs, ac: str, act_bytes: int) -> float:
    """Bytes one block keeps for backward per token (module docstring)."""
    d, f, hd = args.dim, args.ffn_dim, args.head_dim
    qkv = (args.n_heads + 2 * args.n_kv_heads) * hd
    attn = args.n_heads * hd
    lse = 4 * args.n_heads  # fp32 log-sum-exp per head
    if ac == "none":
        # x, norm(x), q/k/v, attention out, x + attn, its norm, gate/up, SwiGLU out; two rstd
        return act_bytes * (d + d + qkv + attn + d + d + 2 * f + f) + lse + 2 * 4
    if ac == "selective":
        # x, q/k/v (matmul), attention out (+ lse), attention projection (matmul), gate/up (matmul)
        return act_bytes * (d + qkv + attn + d + 2 * f) + lse
    if ac == "full":
        return act_bytes * d
    raise ValueError(f"ac: expected none, selective or full, got {ac!r}")


def backward_transient_per_token(args: ModelArgs, ac: str, act_bytes: int) -> float:
    """Bytes per token one block's backward adds beside what is saved: recomputed tensors of
    that block (selective, full) and the gradients flowing through it (∂x, ∂gate/up, ∂SwiGLU)."""
    d, f = args.dim, args.ffn_dim
    temps = act_bytes * (2 * d + 3 * f)
    if ac == "none":
        return temps
    if ac == "selective":  # norm(x), rotated q/k/v, x + attn and its norm, SwiGLU out, rstd
        qkv = (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
        return temps + act_bytes * (d + qkv + 2 * d + f) + 8
    return temps + saved_per_token_layer(args, "none", act_bytes) - act_bytes * d  # full: the block once more


def head_forward_bytes(args: ModelArgs, tokens: int, act_bytes: int, chunk_tokens: int | None) -> float:
    """The final norm and the fused linear + cross-entropy at their forward peak: the norm's
    input and output, fp32 ∂h and ∂W (computed in the forward), per-token losses, and the logits
    of one chunk (two once there are several: the next chunk's matmul runs while the previous
    chunk's buffer is still referenced)."""
    from gristmill.trainer.kernels.cross_entropy import default_chunk_tokens

    d, V = args.dim, args.vocab_size
    chunk = chunk_tokens or default_chunk_tokens(tokens, V, d)
    chunk = min(chunk, tokens)
    live = 2 if tokens > chunk else 1
    norm = tokens * (2 * act_bytes * d + 4)  # its input (saved), its output (the head's input), rstd
    return norm + head_saved_bytes(args, tokens) + tokens * 4 + live * chunk * V * act_bytes


def head_saved_bytes(args: ModelArgs, tokens: int) -> float:
    """What the fused linear + cross-entropy keeps for backward: ∂h and ∂W, both fp32."""
    return 4 * tokens * args.dim + 4 * args.vocab_size * args.dim


def activation_bytes(
    args: ModelArgs, *, micro_batch: int, seq_len: int, ac: str, act_bytes: int = 2, chunk_tokens=None
) -> dict[str, float]:
    """Activation peak of one micro-batch, and its two candidates (module docstring)."""
    tokens = micro_batch * seq_len
    saved = args.n_layers * saved_per_token_layer(args, ac, act_bytes) * tokens
    ids = tokens * 8 * 2  # input and target ids (int64)
    forward_end = saved + ids + head_forward_bytes(args, tokens, act_bytes, chunk_tokens)
    # first block's backward: the head's bf16 ∂h and the final norm's output gradient flow in
    backward = (
        saved + ids + tokens * backward_transient_per_token(args, ac, act_bytes) + tokens * 2 * act_bytes * args.dim
    )
    return {"peak": max(forward_end, backward), "forward_end": forward_end, "backward": backward, "saved": saved}


def memory(
    args: ModelArgs,
    *,
    micro_batch: int,
    seq_len: int,
    ac: str,
    gpus: int = 1,
    precision: str = "bf16",
    master_weights: bool | str = "auto",
    fsdp: bool | str = "auto",
    reshard: bool = True,
    unit_layers: int = 1,
    accum_steps: int = 1,
    chunk_tokens: int | None = None,
) -> Memory:
    """Peak memory per GPU of a training step on the GPU path (module docstring)."""
    P = param_count(args)["total"]
    mixed = precision in ("bf16", "fp8")
    act_bytes = 2 if mixed else 4
    use_fsdp = fsdp is True or (fsdp == "auto" and gpus > 1)
    notes = {}
    if use_fsdp:
        n = gpus
        # bf16 copies gathered for compute: every unit from forward to backward without reshard,
        # else about two units at a time (the one computing and the one prefetched)
        block = args.non_embedding_params() / args.n_layers
        gathered = P if not reshard else min(P, 2 * unit_layers * block + args.embedding_params())
        gather_bytes = (2 if mixed else 0) * gathered
        parameters = 4 * P / n + gather_bytes
        optimizer = 8 * P / n
        # unsharded gradients of a unit (compute dtype) and their fp32 copy for the reduce-scatter
        unit_grad = (act_bytes + 4) * min(P, unit_layers * block + args.embedding_params())
        gradients = 4 * P / n + unit_grad
        resident = 4 * P / n if accum_steps > 1 else 0.0
        notes = {
            "parameters": f"fp32 shards (1/{n}) + bf16 gathered for compute"
            + (" (all units, fsdp_reshard false)" if not reshard else " (~2 units)"),
            "optimizer": f"2 fp32 moments, sharded (1/{n})",
            "gradients": f"fp32 shards (1/{n}) + one unit's unsharded gradients",
        }
    elif mixed and master_weights is not False:
        parameters, optimizer, gradients = 2 * P, 12 * P, 2 * P
        resident = 4 * P if accum_steps > 1 else 0.0
        gradients += resident
        notes = {
            "parameters": "bf16 weights",
            "optimizer": "fp32 masters + 2 fp32 moments",
            "gradients": "bf16" + (" + an fp32 accumulation sum" if accum_steps > 1 else ""),
        }
    elif mixed:  # fp32 weights under autocast: bf16 copies of the matmul weights live through the step
        parameters, optimizer, gradients = 4 * P + 2 * args.matmul_params(), 8 * P, 4 * P
        resident = 4 * P if accum_steps > 1 else 0.0
        notes = {"parameters": "fp32 + autocast's bf16 copies", "optimizer": "2 fp32 moments", "gradients": "fp32"}
    else:
        parameters, optimizer, gradients = 4 * P, 8 * P, 4 * P
        resident = 4 * P if accum_steps > 1 else 0.0
        notes = {"parameters": "fp32", "optimizer": "2 fp32 moments", "gradients": "fp32"}
    act = activation_bytes(
        args, micro_batch=micro_batch, seq_len=seq_len, ac=ac, act_bytes=act_bytes, chunk_tokens=chunk_tokens
    )
    notes["activations"] = f"ac {ac}, micro_batch {micro_batch} × seq {seq_len}"
    return Memory(parameters, optimizer, gradients, resident, act["peak"], notes)


def memory_for(cfg: TrainConfig, args: ModelArgs, gpus: int, *, micro_batch: int | None = None, ac=None) -> Memory:
    micro = micro_batch or cfg.data.micro_batch
    precision = cfg.precision if cfg.precision != "auto" else "bf16"  # the plan is for a GPU
    return memory(
        args,
        micro_batch=micro,
        seq_len=cfg.data.seq_len,
        ac=ac or cfg.ac,
        gpus=gpus,
        precision=precision,
        master_weights=cfg.master_weights,
        fsdp=cfg.fsdp,
        reshard=cfg.fsdp_reshard,
        unit_layers=cfg.fsdp_unit_layers,
        accum_steps=max(1, cfg.data.global_batch // (gpus * micro)),
        chunk_tokens=args.ce_chunk_tokens,
    )


def largest_micro_batch(cfg: TrainConfig, args: ModelArgs, gpus: int, gpu: GPU, ac: str, limit: int = 4096) -> int:
    """The largest micro-batch whose predicted peak fits the GPU's usable memory (0: none)."""
    usable = gpu.usable_gib * GiB
    best = 0
    for m in range(1, limit + 1):
        if memory_for(cfg, args, gpus, micro_batch=m, ac=ac).peak > usable:
            break
        best = m
    return best


# --- time ------------------------------------------------------------------------------------


def load_calibration(path: str | Path | None = None) -> dict:
    if path is not None:
        try:
            return json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"calibration file {path}: {e}") from None
    return json.loads(resources.files("gristmill.trainer").joinpath(CALIBRATION_FILE).read_text())


def nearest_point(
    points: list[dict], *, gpu: str, matmul_params: int, precision: str, recipe, ac: str, micro: int, gpus: int
):
    """The measured point closest to the planned run: the same GPU kind if any was measured,
    then the same precision (and FP8 recipe), the same activation checkpointing, the nearest
    size (log of matmul parameters), micro-batch and GPU count. None when there are no points."""
    points = [p for p in points if p.get("mfu")]
    if not points:
        return None
    same_gpu = [p for p in points if p.get("gpu") == gpu] or points

    def distance(p):
        return (
            p.get("precision") != precision or (precision == "fp8" and p.get("fp8_recipe") != recipe),
            p.get("ac") != ac,
            abs(math.log(p["matmul_params"] / matmul_params)),
            abs(math.log(p["micro_batch"] / micro)),
            p.get("gpus", 1) != gpus,
        )

    return min(same_gpu, key=distance)


# --- the plan --------------------------------------------------------------------------------


def vocab_for(cfg: TrainConfig) -> tuple[int, str]:
    """The vocabulary size and where it came from: model.vocab_size, else the token
    manifest's, else an assumed 32,000 (said so)."""
    if cfg.model.vocab_size:
        return cfg.model.vocab_size, "model.vocab_size"
    # data.tokens names a token directory, or a run directory holding tokens/
    candidates = [Path(cfg.data.tokens) / "manifest.json", Path(cfg.data.tokens) / "tokens" / "manifest.json"]
    for manifest in candidates:
        try:
            return int(json.loads(manifest.read_text())["tokenizer"]["vocab_size"]), str(manifest)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return DEFAULT_VOCAB, f"assumed (no readable {candidates[0]}; set model.vocab_size)"


def make_plan(cfg: TrainConfig, *, gpus: int, gpu: str, calibration: dict | None = None) -> dict:
    """Everything `--plan` prints, as a dict. Raises ConfigError for bad input (one line)."""
    from gristmill.trainer.train import model_args

    if gpus < 1:
        raise ConfigError(f"--gpus: must be at least 1 (got {gpus})")
    if gpu not in GPUS:
        raise ConfigError(f"--gpu: unknown GPU {gpu!r} (known: {', '.join(sorted(GPUS))})")
    kind = GPUS[gpu]
    precision = cfg.precision if cfg.precision != "auto" else "bf16"
    if precision == "fp8" and not kind.fp8:
        raise ConfigError(f"precision: fp8 needs FP8 tensor cores; an {kind.name} has none (use precision bf16)")
    if cfg.data.global_batch % (gpus * cfg.data.micro_batch):
        raise ConfigError(
            f"data.global_batch {cfg.data.global_batch} is not a multiple of micro_batch"
            f" {cfg.data.micro_batch} × {gpus} GPUs"
        )
    vocab, vocab_from = vocab_for(cfg)
    args = model_args(cfg, vocab)
    params = param_count(args)
    mem = memory_for(cfg, args, gpus)
    fpt = args.flops_per_token(cfg.data.seq_len)
    attn = 12 * args.n_layers * args.dim * cfg.data.seq_len
    largest = {ac: largest_micro_batch(cfg, args, gpus, kind, ac) for ac in ("none", "selective", "full")}
    per_gpu = cfg.data.global_batch // gpus
    dividing = {
        ac: max((m for m in range(1, m_max + 1) if per_gpu % m == 0), default=0) for ac, m_max in largest.items()
    }
    tokens = cfg.steps * cfg.data.global_batch * cfg.data.seq_len
    calibration = calibration if calibration is not None else load_calibration()
    point = nearest_point(
        calibration.get("points", []),
        gpu=gpu,
        matmul_params=args.matmul_params(),
        precision=precision,
        recipe=cfg.fp8_recipe,
        ac=cfg.ac,
        micro=cfg.data.micro_batch,
        gpus=gpus,
    )
    time_s = tok_s = mfu = None
    if point is not None and point.get("mfu"):
        mfu = point["mfu"]
        tok_s = gpus * kind.peak_bf16 * mfu / fpt
        time_s = tokens / tok_s
    return {
        "config": cfg,
        "gpu": kind,
        "gpu_key": gpu,
        "gpus": gpus,
        "precision": precision,
        "vocab": vocab,
        "vocab_from": vocab_from,
        "args": args,
        "params": params,
        "flops_per_token": fpt,
        "attention_flops": attn,
        "memory": mem,
        "fits": mem.peak <= kind.usable_gib * GiB,
        "largest_micro_batch": largest,
        "largest_dividing": dividing,
        "tokens": tokens,
        "point": point,
        "mfu": mfu,
        "tokens_per_s": tok_s,
        "seconds": time_s,
    }


def _gib(x: float) -> str:
    return f"{x / GiB:6.2f} GiB"


def _duration(s: float) -> str:
    if s < 3600:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def render(plan: dict, source: str) -> list[str]:
    cfg, kind, gpus, mem, p = plan["config"], plan["gpu"], plan["gpus"], plan["memory"], plan["params"]
    args = plan["args"]
    accum = cfg.data.global_batch // (gpus * cfg.data.micro_batch)
    lines = [
        f"plan: {source} on {gpus} × {kind.name} ({kind.memory_gib:.1f} GiB, {kind.usable_gib:.1f} usable),"
        f" {plan['precision']}{' ' + cfg.fp8_recipe if plan['precision'] == 'fp8' else ''}, ac {cfg.ac},"
        f" micro_batch {cfg.data.micro_batch} × seq {cfg.data.seq_len}, global batch {cfg.data.global_batch}"
        f" ({accum} accumulation step{'s' if accum > 1 else ''})",
        f"model: d {args.dim}, {args.n_layers} layers, {args.n_heads} heads ({args.n_kv_heads} KV),"
        f" d_ff {args.ffn_dim}, vocab {plan['vocab']:,} ({plan['vocab_from']})",
        f"parameters: {p['total']:,} = embedding {p['embedding']:,}"
        f"{' (tied)' if args.tie_embeddings else ' (input + output head)'} + non-embedding {p['non_embedding']:,}",
        f"FLOPs per token: {plan['flops_per_token'] / 1e9:.3f} G = 6·N {6 * p['matmul'] / 1e9:.3f} G"
        f" (N = {p['matmul']:,} matmul weights, output head included)"
        f" + attention {plan['attention_flops'] / 1e9:.3f} G",
        "memory per GPU (predicted peak allocated):",
        f"  parameters   {_gib(mem.parameters)}  {mem.notes['parameters']}",
        f"  optimizer    {_gib(mem.optimizer)}  {mem.notes['optimizer']}",
        f"  gradients    {_gib(mem.gradients)}  {mem.notes['gradients']}",
        f"  activations  {_gib(mem.activations)}  {mem.notes['activations']}",
        f"  peak         {_gib(mem.peak)}  parameters + optimizer + the larger of activations"
        f"{' + resident gradients' if mem.resident_gradients else ''} and gradients:"
        f" {'fits' if plan['fits'] else 'DOES NOT FIT'} in {kind.usable_gib:.1f} GiB",
    ]
    big = plan["largest_micro_batch"]
    div = plan["largest_dividing"]
    lines.append(
        "largest micro_batch that fits: "
        + ", ".join(
            f"{m} (ac {ac}{'' if div[ac] == m else f'; {div[ac]} divides the global batch'})" for ac, m in big.items()
        )
    )
    tokens = plan["tokens"]
    if plan["seconds"] is None:
        lines.append(f"time: {tokens:,} tokens ({cfg.steps} steps); no calibrated MFU to project from")
    else:
        pt = plan["point"]
        where = (
            f"{pt['preset']} on {pt['gpus']} × {pt['gpu']}, micro_batch {pt['micro_batch']}, ac {pt['ac']},"
            f" {pt['precision']}{' ' + pt['fp8_recipe'] if pt.get('fp8_recipe') else ''}, {pt.get('measured', '?')}"
        )
        lines.append(
            f"time: {tokens:,} tokens ({cfg.steps} steps × {cfg.data.global_batch} × {cfg.data.seq_len}) at"
            f" {plan['mfu']:.1%} MFU (measured: {where}) = {plan['tokens_per_s']:,.0f} tokens/s"
            f" → {_duration(plan['seconds'])}"
        )
    return lines


def does_not_fit(plan: dict) -> str | None:
    """The one line for a config that does not fit, or None."""
    if plan["fits"]:
        return None
    cfg, kind, mem = plan["config"], plan["gpu"], plan["memory"]
    m = plan["largest_micro_batch"][cfg.ac]
    hint = (
        f"micro_batch {m} fits with ac {cfg.ac}"
        if m
        else "no micro_batch fits with ac " + cfg.ac + "; try ac full, fp32 → bf16, or more GPUs"
    )
    return (
        f"does not fit: micro_batch {cfg.data.micro_batch} needs {mem.peak / GiB:.1f} GiB per GPU,"
        f" {plan['gpus']} × {kind.name} has {kind.usable_gib:.1f} GiB usable ({hint})"
    )
