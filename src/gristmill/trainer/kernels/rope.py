"""Rotary position embedding on the fused q/k/v projection, "rotate half" convention (Hugging
Face Llama's, so exported weights need no permutation): for x = [x1, x2] split along the head
dim, `y = [x1·cos − x2·sin, x2·cos + x1·sin]`.

The attention's one `wqkv` matmul yields (batch, seq, n_heads + 2·n_kv_heads, head_dim); one
kernel splits it into q and k, rotated, and v, each contiguous (batch, seq, heads, head_dim).
Backward is one kernel too: it rotates dq, dk by −θ and writes them with dv straight into the
gradient of the fused projection's output — the concatenation autograd would otherwise do as
a separate pass (and, with three projections, the two adds of their input gradients).
One program per token handles all its heads.
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


def rope_qkv_reference(qkv: torch.Tensor, cos, sin, n_heads: int, n_kv_heads: int):
    """qkv: (batch, seq, n_heads + 2·n_kv_heads, head_dim) → (rope(q), rope(k), v)."""
    q, k, v = qkv.split([n_heads, n_kv_heads, n_kv_heads], dim=2)
    return rope_reference(q, cos, sin), rope_reference(k, cos, sin), v


@triton.jit
def _rotate_heads(SRC, DST, src_base, dst_base, c, s, n, D: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """n heads of one token from SRC+src_base to DST+dst_base (both head-major, D per head)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n) & (d < HALF)
    x1 = tl.load(SRC + src_base + h * D + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(SRC + src_base + h * D + d + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(DST + dst_base + h * D + d, (x1 * c - x2 * s).to(DST.dtype.element_ty), mask=mask)
    tl.store(DST + dst_base + h * D + d + HALF, (x2 * c + x1 * s).to(DST.dtype.element_ty), mask=mask)


@triton.jit
def _rope_qkv_fwd(QKV, Q, K, V, COS, SIN, T, H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr,
                  HALF: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # token index in batch*seq
    t = row % T
    d = tl.arange(0, BLOCK_D)[None, :]
    c = tl.load(COS + t * HALF + d, mask=d < HALF, other=0.0)
    s = tl.load(SIN + t * HALF + d, mask=d < HALF, other=0.0)
    src = row * (H + 2 * KV) * D
    _rotate_heads(QKV, Q, src, row * H * D, c, s, H, D, HALF, BLOCK_Q, BLOCK_D)
    _rotate_heads(QKV, K, src + H * D, row * KV * D, c, s, KV, D, HALF, BLOCK_K, BLOCK_D)
    v = tl.arange(0, BLOCK_V)
    vmask = v < KV * D
    tl.store(V + row * KV * D + v, tl.load(QKV + src + (H + KV) * D + v, mask=vmask), mask=vmask)


@triton.jit
def _rope_qkv_bwd(DQ, DK, DV, DQKV, COS, SIN, T, H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr,
                  HALF: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = row % T
    d = tl.arange(0, BLOCK_D)[None, :]
    c = tl.load(COS + t * HALF + d, mask=d < HALF, other=0.0)
    s = -tl.load(SIN + t * HALF + d, mask=d < HALF, other=0.0)  # rotation by −θ
    dst = row * (H + 2 * KV) * D
    _rotate_heads(DQ, DQKV, row * H * D, dst, c, s, H, D, HALF, BLOCK_Q, BLOCK_D)
    _rotate_heads(DK, DQKV, row * KV * D, dst + H * D, c, s, KV, D, HALF, BLOCK_K, BLOCK_D)
    v = tl.arange(0, BLOCK_V)
    vmask = v < KV * D
    tl.store(DQKV + dst + (H + KV) * D + v, tl.load(DV + row * KV * D + v, mask=vmask), mask=vmask)


def _blocks(H: int, KV: int, D: int) -> dict:
    return dict(H=H, KV=KV, D=D, HALF=D // 2, BLOCK_Q=triton.next_power_of_2(H), BLOCK_K=triton.next_power_of_2(KV),
                BLOCK_D=triton.next_power_of_2(D // 2), BLOCK_V=triton.next_power_of_2(KV * D), num_warps=4)


class RoPEQKVFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, n_heads, n_kv_heads):
        B, T, NH, D = qkv.shape
        if NH != n_heads + 2 * n_kv_heads:
            raise ValueError(f"qkv has {NH} heads, expected {n_heads} + 2·{n_kv_heads}")
        qkv = qkv.contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        q = qkv.new_empty(B, T, n_heads, D)
        k = qkv.new_empty(B, T, n_kv_heads, D)
        v = qkv.new_empty(B, T, n_kv_heads, D)
        _rope_qkv_fwd[(B * T,)](qkv, q, k, v, cos, sin, T, **_blocks(n_heads, n_kv_heads, D))
        ctx.save_for_backward(cos, sin)
        ctx.heads = (n_heads, n_kv_heads)
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        H, KV = ctx.heads
        B, T, _, D = dq.shape
        dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()
        dqkv = dq.new_empty(B, T, H + 2 * KV, D)
        _rope_qkv_bwd[(B * T,)](dq, dk, dv, dqkv, cos, sin, T, **_blocks(H, KV, D))
        return dqkv, None, None, None, None


def rope_qkv_triton(qkv: torch.Tensor, cos, sin, n_heads: int, n_kv_heads: int):
    return RoPEQKVFunction.apply(qkv, cos, sin, n_heads, n_kv_heads)
