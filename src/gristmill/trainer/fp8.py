"""`precision: fp8`: the blocks' linear layers trained in float8 through torchao.

torchao's `Float8Linear` (torchtitan's float8 path) replaces `wqkv`, `wo`, `w13` and `w2` in
every block: each matmul casts its two operands to float8 (e4m3 forward, e5m2 for the gradient
it receives) with scales computed on the fly, and multiplies on the FP8 tensor cores
(`torch._scaled_mm`); everything else (embedding, norms, RoPE, attention, the output head and
its loss, the optimizer's fp32 masters) stays as in bf16. Recipes (`fp8_recipe`): `tensorwise`,
one scale per tensor (the fastest), or `rowwise`, one per row (more accurate, slower kernels).
The swap happens on the meta-device model, before activation checkpointing and compile, as
torchtitan orders it; per-block compile fuses the casts.

Only where it is right and fast: a CUDA GPU with FP8 tensor cores (compute capability 8.9 or
higher: Ada, Hopper, Blackwell) and torchao installed (the `fp8` extra). Anywhere else the run
stops before building anything, with one line saying why (`fp8_unavailable`): on a CPU or an
older GPU torchao would either fail deep inside the first step or emulate float8 at a fraction
of bf16's speed.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

RECIPES = ("tensorwise", "rowwise")
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x)
FP8_LINEARS = ("attention.wqkv", "attention.wo", "feed_forward.w13", "feed_forward.w2")


def device_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) CUDA compute capability (one place, so tests can stand in for a GPU)."""
    return torch.cuda.get_device_capability(device)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device)


def fp8_unavailable(device: torch.device) -> str | None:
    """Why `precision: fp8` cannot run on `device`, as one line; None when it can."""
    if device.type != "cuda":
        return (
            "precision: fp8 needs a CUDA GPU with FP8 tensor cores (compute capability 8.9+: Ada,"
            f" Hopper, Blackwell); this run is on {device.type.upper()}: use precision bf16 or fp32"
        )
    cap = device_capability(device)
    if tuple(cap) < MIN_CAPABILITY:
        return (
            f"precision: fp8 needs FP8 tensor cores (compute capability 8.9+); {device_name(device)}"
            f" has {cap[0]}.{cap[1]}: use precision bf16"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "precision: fp8 needs torchao (pip install 'gristmill[fp8]'; torchao 0.17 was tested with torch 2.11)"
    return None


def _is_block_linear(module: nn.Module, fqn: str) -> bool:
    """A block's linear layer whose dimensions the FP8 matmul takes (multiples of 16)."""
    return (
        isinstance(module, nn.Linear)
        and fqn.startswith("layers.")
        and fqn.endswith(FP8_LINEARS)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def apply_fp8(model: nn.Module, recipe: str, *, emulate: bool = False) -> int:
    """Swaps the blocks' linear layers for torchao's Float8Linear (in place); returns how many.
    `emulate`: torchao's float8 emulation, for checking the code path on a CPU (tests)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if recipe not in RECIPES:
        raise ValueError(f"fp8_recipe: expected one of {', '.join(RECIPES)}, got {recipe!r}")
    config = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    before = sum(1 for n, m in model.named_modules() if _is_block_linear(m, n))
    convert_to_float8_training(model, module_filter_fn=_is_block_linear, config=config)
    return before


def scaled_mm_ops() -> set:
    """The FP8 matmul as an aten op (what selective checkpointing keeps besides `mm`)."""
    op = getattr(torch.ops.aten, "_scaled_mm", None)
    return {op.default} if op is not None else set()
