"""Rotary position embedding on the fused q/k/v projection, "rotate half" convention (Hugging
Face Llama's, so exported weights need no permutation): for x = [x1, x2] split along the head
dim, `y = [x1·cos − x2·sin, x2·cos + x1·sin]`.

The attention's one `wqkv` matmul yields (batch, seq, n_heads + 2·n_kv_heads, head_dim); one
kernel rotates its q and k heads *in place* and q, k, v are returned as views of it (attention
reads them strided). Nothing is copied: writing q and k to new tensors and v too would cost a
read and a write of v, and returning only v as a view would keep the whole projection output
alive beside the q and k copies (attention saves v for its backward) — +2·d bf16 per token per
layer, 1.2 GiB at 1B. The caller must not use the projection output for anything else: the
model's attention does not (its matmul's backward needs only the matmul's input), but
selective activation checkpointing keeps matmul outputs to reuse in the recompute, which would
then see them rotated. There `in_place=False` writes all three into a new tensor instead.
Backward is one kernel too: it rotates dq, dk by −θ and writes them with dv straight into the
gradient of the fused projection's output — the concatenation autograd would otherwise do as
a separate pass (and, with three projections, the two adds of their input gradients). dq, dk,
dv are read with whatever strides attention hands back.
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
def _rotate_heads(
    SRC,
    DST,
    src_base,
    dst_base,
    src_hs,
    dst_hs,
    c,
    s,
    n,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """n heads of one token from SRC+src_base to DST+dst_base (heads src_hs / dst_hs apart; both
    halves of a head are loaded before either is stored, so SRC may be DST)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n) & (d < HALF)
    src = SRC + src_base + h * src_hs + d
    dst = DST + dst_base + h * dst_hs + d
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, (x1 * c - x2 * s).to(DST.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * c + x1 * s).to(DST.dtype.element_ty), mask=mask)


@triton.jit
def _rope_qkv_fwd(
    QKV,
    OUT,
    COS,
    SIN,
    T,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    COPY_V: tl.constexpr,
):
    # OUT is QKV (in place, v left where it is) or a new tensor of the same layout (v copied)
    row = tl.program_id(0).to(tl.int64)  # token index in batch*seq
    t = row % T
    d = tl.arange(0, BLOCK_D)[None, :]
    c = tl.load(COS + t * HALF + d, mask=d < HALF, other=0.0)
    s = tl.load(SIN + t * HALF + d, mask=d < HALF, other=0.0)
    base = row * (H + 2 * KV) * D
    _rotate_heads(QKV, OUT, base, base, D, D, c, s, H, HALF, BLOCK_Q, BLOCK_D)
    _rotate_heads(QKV, OUT, base + H * D, base + H * D, D, D, c, s, KV, HALF, BLOCK_K, BLOCK_D)
    if COPY_V:
        hv = tl.arange(0, BLOCK_KV)[:, None]
        dv = tl.arange(0, BLOCK_DV)[None, :]
        vmask = (hv < KV) & (dv < D)
        v_off = base + (H + KV) * D + hv * D + dv
        tl.store(OUT + v_off, tl.load(QKV + v_off, mask=vmask), mask=vmask)


@triton.jit
def _rope_qkv_bwd(
    DQ,
    DK,
    DV,
    DQKV,
    COS,
    SIN,
    T,
    sq_b,
    sq_t,
    sq_h,
    sk_b,
    sk_t,
    sk_h,
    sv_b,
    sv_t,
    sv_h,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    b = row // T
    t = row % T
    d = tl.arange(0, BLOCK_D)[None, :]
    c = tl.load(COS + t * HALF + d, mask=d < HALF, other=0.0)
    s = -tl.load(SIN + t * HALF + d, mask=d < HALF, other=0.0)  # rotation by −θ
    dst = row * (H + 2 * KV) * D
    _rotate_heads(DQ, DQKV, b * sq_b + t * sq_t, dst, sq_h, D, c, s, H, HALF, BLOCK_Q, BLOCK_D)
    _rotate_heads(DK, DQKV, b * sk_b + t * sk_t, dst + H * D, sk_h, D, c, s, KV, HALF, BLOCK_K, BLOCK_D)
    hv = tl.arange(0, BLOCK_KV)[:, None]
    dv_ = tl.arange(0, BLOCK_DV)[None, :]
    vmask = (hv < KV) & (dv_ < D)
    dv = tl.load(DV + b * sv_b + t * sv_t + hv * sv_h + dv_, mask=vmask)
    tl.store(DQKV + dst + (H + KV) * D + hv * D + dv_, dv, mask=vmask)


def _blocks(H: int, KV: int, D: int) -> dict:
    # one token per program, 4 warps: the fastest of tokens {1, 2, 4, 8} × warps {1, 2, 4, 8} on
    # an H100 at 12 × 64 and 16 × 64 / 128 heads (within 2% of 8 warps)
    return dict(
        H=H,
        KV=KV,
        D=D,
        HALF=D // 2,
        BLOCK_Q=triton.next_power_of_2(H),
        BLOCK_K=triton.next_power_of_2(KV),
        BLOCK_D=triton.next_power_of_2(D // 2),
        BLOCK_KV=triton.next_power_of_2(KV),
        BLOCK_DV=triton.next_power_of_2(D),
        num_warps=4,
    )


def rope_qkv_fwd(qkv, cos, sin, n_heads, n_kv_heads, in_place=True):
    """Rotate the q and k heads of a contiguous (B, T, H + 2·KV, D) tensor, in place or into a
    new tensor (v copied along). Returns the rotated tensor."""
    B, T, _, D = qkv.shape
    out = qkv if in_place else torch.empty_like(qkv)
    _rope_qkv_fwd[(B * T,)](qkv, out, cos, sin, T, COPY_V=not in_place, **_blocks(n_heads, n_kv_heads, D))
    return out


def _token_strides(g: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, head) strides of a (B, T, heads, D) gradient with unit stride along D."""
    return g.stride(0), g.stride(1), g.stride(2)


def rope_qkv_bwd(dq, dk, dv, cos, sin):
    """dq (B, T, H, D), dk and dv (B, T, KV, D), any strides with a unit last one → the gradient
    of the fused qkv, contiguous."""
    B, T, H, D = dq.shape
    KV = dk.shape[2]
    dq, dk, dv = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk, dv))
    dqkv = dq.new_empty(B, T, H + 2 * KV, D)
    _rope_qkv_bwd[(B * T,)](
        dq,
        dk,
        dv,
        dqkv,
        cos,
        sin,
        T,
        *_token_strides(dq),
        *_token_strides(dk),
        *_token_strides(dv),
        **_blocks(H, KV, D),
    )
    return dqkv


class RoPEQKVFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, n_heads, n_kv_heads, in_place):
        NH = qkv.shape[2]
        if NH != n_heads + 2 * n_kv_heads:
            raise ValueError(f"qkv has {NH} heads, expected {n_heads} + 2·{n_kv_heads}")
        if not qkv.is_contiguous():
            qkv = qkv.contiguous()
        elif in_place and not torch.compiler.is_compiling():
            # the kernel's writes are invisible to autograd: bump the version so that a backward
            # which saved this tensor fails loudly instead of using rotated values
            torch.autograd.graph.increment_version(qkv)
        cos, sin = cos.contiguous(), sin.contiguous()
        out = rope_qkv_fwd(qkv, cos, sin, n_heads, n_kv_heads, in_place)
        ctx.save_for_backward(cos, sin)
        return out.split([n_heads, n_kv_heads, n_kv_heads], dim=2)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        return rope_qkv_bwd(dq, dk, dv, cos, sin), None, None, None, None, None


def rope_qkv_triton(qkv: torch.Tensor, cos, sin, n_heads: int, n_kv_heads: int, in_place: bool = True):
    """Rotated q, rotated k and v as views of one tensor: `qkv` itself, its q and k heads rotated
    in place (`in_place` and `qkv` contiguous; any other `qkv` is copied first and left as it
    was), or a new tensor (`in_place=False`)."""
    return RoPEQKVFunction.apply(qkv, cos, sin, n_heads, n_kv_heads, in_place)
