"""Rotary position embedding, "rotate half" convention (Hugging Face Llama's, so exported
weights need no permutation): for x = [x1, x2] split along the head dim,
`y = [x1·cos − x2·sin, x2·cos + x1·sin]`.

One program per token rotates all its heads; backward is the same rotation by −θ.
"""

from __future__ import annotations

import torch

from gristmill.trainer.kernels._triton import tl, triton


def rope_tables(seq_len: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each (seq_len, head_dim // 2), fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    return freqs.cos(), freqs.sin()


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); cos/sin: (≥ seq, head_dim // 2)."""
    T = x.shape[1]
    c = cos[:T, None, :]
    s = sin[:T, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).type_as(x)


@triton.jit
def _rope_kernel(X, Y, COS, SIN, T, H: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, BACKWARD: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # token index in batch*seq
    t = row % T
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < H) & (d < HALF)
    base = row * H * D + h * D + d
    x1 = tl.load(X + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + base + HALF, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(COS + t * HALF + d, mask=d < HALF, other=0.0)
    s = tl.load(SIN + t * HALF + d, mask=d < HALF, other=0.0)
    if BACKWARD:
        s = -s
    tl.store(Y + base, (x1 * c - x2 * s).to(Y.dtype.element_ty), mask=mask)
    tl.store(Y + base + HALF, (x2 * c + x1 * s).to(Y.dtype.element_ty), mask=mask)


def _launch(x, cos, sin, backward: bool):
    B, T, H, D = x.shape
    x = x.contiguous()
    y = torch.empty_like(x)
    _rope_kernel[(B * T,)](x, y, cos, sin, T, H=H, D=D, HALF=D // 2, BACKWARD=backward,
                           BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D // 2), num_warps=4)
    return y


class RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        cos, sin = cos.contiguous(), sin.contiguous()
        ctx.save_for_backward(cos, sin)
        return _launch(x, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _launch(dy, cos, sin, backward=True), None, None


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return RoPEFunction.apply(x, cos, sin)
