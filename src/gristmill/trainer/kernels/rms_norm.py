"""RMSNorm, optionally fused with the residual add before it: `h = x + residual; y = norm(h)`.

Forward keeps one fp32 `rstd` per row; backward recomputes `x̂ = h·rstd` rather than storing it.
With a residual, backward adds the gradient arriving at `h` to the norm's own input gradient in
the same pass: in fp32 (one rounding), or with `round_dx` the norm's part rounded to the
activation dtype first, which is what a separate add of the two would compute (the model's
fused residual uses that: fusing it changes no number).
The weight gradient is reduced in fp32: each program sums its rows' `dy·x̂` into one partial row
(as Liger-Kernel's rms_norm does), and a second small kernel sums the partials and casts once.
"""

from __future__ import annotations

import torch

from gristmill.trainer.kernels._triton import row_settings, tl, triton


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Llama's RMSNorm (normalise in fp32, cast back, scale). With `residual`: returns (y, x + residual)."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight
    return y if residual is None else (y, x)


@triton.jit
def _rms_norm_fwd(X, R, H, Y, W, RSTD, M, N, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    # a (ROWS, BLOCK) tile per program: at d = 768 one row is too little work for a program
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < M
    mask = rmask[:, None] & (cols < N)[None, :]
    off = rows.to(tl.int64)[:, None] * N + cols[None, :]
    x = tl.load(X + off, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # round the sum to the activation dtype first, so y is the norm of the h we hand back
        x = (x + tl.load(R + off, mask=mask, other=0.0)).to(H.dtype.element_ty)
        tl.store(H + off, x, mask=mask)
    x = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    tl.store(RSTD + rows, rstd, mask=rmask)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + off, (x * rstd[:, None] * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd(
    DY,
    DH,
    H,
    W,
    RSTD,
    DX,
    DW_PARTIAL,
    M,
    N,
    rows_per_program,
    HAS_DH: tl.constexpr,
    ROUND_DX: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
):
    # each program walks its rows ROWS at a time (a 2-D tile), summing dy·x̂ for the weight grad.
    # The next tile's loads are issued before this tile's math (loop-carried prefetch): with one
    # or two programs per SM nothing else would hide the load latency.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    start = pid * rows_per_program
    end = tl.minimum(start + rows_per_program, M)
    rows = start + tl.arange(0, ROWS)
    rmask = rows < end
    mask = rmask[:, None] & cmask[None, :]
    off = rows.to(tl.int64)[:, None] * N + cols[None, :]
    x = tl.load(H + off, mask=mask, other=0.0)
    dy = tl.load(DY + off, mask=mask, other=0.0)
    dh = tl.load(DH + off, mask=mask, other=0.0) if HAS_DH else dy
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
    for r0 in range(start, end, ROWS):
        nrows = r0 + ROWS + tl.arange(0, ROWS)
        nrmask = nrows < end
        nmask = nrmask[:, None] & cmask[None, :]
        noff = nrows.to(tl.int64)[:, None] * N + cols[None, :]
        nx = tl.load(H + noff, mask=nmask, other=0.0)
        ndy = tl.load(DY + noff, mask=nmask, other=0.0)
        ndh = tl.load(DH + noff, mask=nmask, other=0.0) if HAS_DH else ndy
        nrstd = tl.load(RSTD + nrows, mask=nrmask, other=0.0)

        xhat = x.to(tl.float32) * rstd[:, None]
        dyf = dy.to(tl.float32)
        wdy = w * dyf
        c = tl.sum(xhat * wdy, axis=1)[:, None] / N
        dx = (wdy - xhat * c) * rstd[:, None]
        if HAS_DH:
            if ROUND_DX:
                dx = dx.to(DX.dtype.element_ty).to(tl.float32)
            dx += dh.to(tl.float32)
        tl.store(DX + off, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dyf * xhat

        x, dy, dh, rstd, mask, off = nx, ndy, ndh, nrstd, nmask, noff
    tl.store(DW_PARTIAL + pid * N + cols, tl.sum(dw, axis=0), mask=cmask)


@triton.jit
def _sum_partials(P, DW, programs, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # the weight gradient: the column sums of the (programs, N) fp32 partials, cast once
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for p0 in range(0, programs, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        mask = (rows < programs)[:, None] & cmask[None, :]
        acc += tl.load(P + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=cmask)


# Tile settings below are the fastest found by a sweep on an H100 (16,384 rows, d = 768 / 1024 /
# 2048; GPU time of the kernels queued back to back, as in benchmarks/kernels.py).


def fwd_settings(n: int) -> tuple[int, int, int]:
    """(BLOCK, rows per program, warps) of the forward for rows of `n` elements: d ≤ 1024 takes
    4 rows in 2 warps per program (rows {1, 2, 4} × warps {2, 4, 8}; within 1% of each other),
    longer rows one row in row_settings' warps."""
    block, warps = row_settings(n)
    return (block, 4, 2) if block <= 1024 else (block, 1, warps)


def bwd_settings(n: int) -> tuple[int, int, int]:
    """(rows per tile, warps, programs per SM) of the backward.

    4-row tiles with the next tile prefetched; 2 programs of 4 warps per SM for d ≤ 1024, one of
    8 warps for d = 2048 — the fastest of rows {1, 2, 4, 8} × warps {2, 4, 8, 16} × programs/SM
    {1, 2, 3, 4} (without the prefetch, the best was 20% slower at d = 768). Few programs keep
    the fp32 partials small: their sum is one ~3 µs kernel.
    """
    return (4, 4, 2) if triton.next_power_of_2(n) <= 1024 else (4, 8, 1)


def rms_norm_fwd(x2, r2, weight, eps):
    """Launch the forward on (M, N) rows; r2 None for no residual. Returns y, h (x2 without
    residual), rstd."""
    M, N = x2.shape
    block, rows, warps = fwd_settings(N)
    has_res = r2 is not None
    h = torch.empty_like(x2) if has_res else x2
    y = torch.empty_like(x2)
    rstd = torch.empty(M, dtype=torch.float32, device=x2.device)
    _rms_norm_fwd[(triton.cdiv(M, rows),)](
        x2,
        r2 if has_res else x2,
        h,
        y,
        weight,
        rstd,
        M,
        N,
        eps,
        HAS_RESIDUAL=has_res,
        BLOCK=block,
        ROWS=rows,
        num_warps=warps,
    )
    return y, h, rstd


def rms_norm_bwd(dy, dh, h, weight, rstd, round_dx=False):
    """Launch the backward on (M, N) rows; dh None when h had no upstream gradient; `round_dx`:
    round the norm's input gradient before adding dh (module docstring). Returns dx, dw."""
    M, N = h.shape
    rows, warps, per_sm = bwd_settings(N)
    sms = torch.cuda.get_device_properties(dy.device).multi_processor_count
    rows_per_program = rows * triton.cdiv(M, min(per_sm * sms, M) * rows)
    programs = triton.cdiv(M, rows_per_program)
    dx = torch.empty_like(dy)
    dw_partial = torch.empty((programs, N), dtype=torch.float32, device=dy.device)
    _rms_norm_bwd[(programs,)](
        dy,
        dh if dh is not None else dy,
        h,
        weight,
        rstd,
        dx,
        dw_partial,
        M,
        N,
        rows_per_program,
        HAS_DH=dh is not None,
        ROUND_DX=round_dx,
        BLOCK=triton.next_power_of_2(N),
        ROWS=rows,
        num_warps=warps,
        num_stages=1,
    )  # the prefetch is explicit
    dw = torch.empty_like(weight)
    _sum_partials[(triton.cdiv(N, 32),)](dw_partial, dw, programs, N, BLOCK_P=32, BLOCK_N=32, num_warps=4)
    return dx, dw


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps, round_dx=False):
        shape = x.shape
        N = shape[-1]
        x2 = x.reshape(-1, N).contiguous()
        has_res = residual is not None
        r2 = residual.reshape(-1, N).contiguous() if has_res else None
        y, h, rstd = rms_norm_fwd(x2, r2, weight, eps)
        ctx.save_for_backward(h, weight, rstd)
        ctx.has_res, ctx.round_dx = has_res, round_dx
        ctx.shape = shape
        if has_res:
            return y.view(shape), h.view(shape)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy, dh=None):
        h, weight, rstd = ctx.saved_tensors
        M, N = h.shape
        dy = dy.reshape(M, N).contiguous()
        dh = dh.reshape(M, N).contiguous() if dh is not None else None
        dx, dw = rms_norm_bwd(dy, dh, h, weight, rstd, ctx.round_dx)
        dx = dx.view(ctx.shape)
        return dx, (dx if ctx.has_res else None), dw, None, None


def rms_norm_triton(x, weight, eps, residual=None, round_dx=False):
    return RMSNormFunction.apply(x, residual, weight, eps, round_dx)
