"""RMSNorm, optionally fused with the residual add before it: `h = x + residual; y = norm(h)`.

Forward keeps one fp32 `rstd` per row; backward recomputes `x̂ = h·rstd` rather than storing it.
The weight gradient is reduced in fp32: each program sums its rows' `dy·x̂` into one partial row,
and the partials are summed in PyTorch (as Liger-Kernel's rms_norm does).
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
def _rms_norm_fwd(X, R, H, Y, W, RSTD, N, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # round the sum to the activation dtype first, so y is the norm of the h we hand back
        x = (x + tl.load(R + row * N + cols, mask=mask, other=0.0)).to(H.dtype.element_ty)
        tl.store(H + row * N + cols, x, mask=mask)
    x = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(RSTD + row, rstd)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd(DY, DH, H, W, RSTD, DX, DW_PARTIAL, M, N, rows_per_program,
                  HAS_DH: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    # each program walks its rows ROWS at a time (a 2-D tile), summing dy·x̂ for the weight grad
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    start = pid * rows_per_program
    end = tl.minimum(start + rows_per_program, M)
    for r0 in range(start, end, ROWS):
        rows = r0 + tl.arange(0, ROWS)
        rmask = rows < end
        mask = rmask[:, None] & cmask[None, :]
        off = rows.to(tl.int64)[:, None] * N + cols[None, :]
        x = tl.load(H + off, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + off, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)[:, None]
        xhat = x * rstd
        wdy = w * dy
        c = tl.sum(xhat * wdy, axis=1)[:, None] / N
        dx = (wdy - xhat * c) * rstd
        if HAS_DH:
            dx += tl.load(DH + off, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + off, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW_PARTIAL + pid * N + cols, tl.sum(dw, axis=0), mask=cmask)


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        shape = x.shape
        N = shape[-1]
        x2 = x.reshape(-1, N).contiguous()
        M = x2.shape[0]
        has_res = residual is not None
        r2 = residual.reshape(-1, N).contiguous() if has_res else x2
        h = torch.empty_like(x2) if has_res else x2
        y = torch.empty_like(x2)
        rstd = torch.empty(M, dtype=torch.float32, device=x.device)
        block, warps = row_settings(N)
        _rms_norm_fwd[(M,)](x2, r2, h, y, weight, rstd, N, eps, HAS_RESIDUAL=has_res, BLOCK=block, num_warps=warps)
        ctx.save_for_backward(h, weight, rstd)
        ctx.has_res = has_res
        ctx.shape = shape
        if has_res:
            return y.view(shape), h.view(shape)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy, dh=None):
        h, weight, rstd = ctx.saved_tensors
        M, N = h.shape
        dy = dy.reshape(M, N).contiguous()
        has_dh = dh is not None
        dh = dh.reshape(M, N).contiguous() if has_dh else dy
        dx = torch.empty_like(dy)
        sms = torch.cuda.get_device_properties(dy.device).multi_processor_count
        block, _ = row_settings(N)
        # tile of 1 row (d ≤ 1024) or 2 rows, 4 warps, 8 programs per SM: the fastest of
        # warps {4, 8, 16} × rows {1, 2, 4, 8} × programs/SM {4, 8, 16} on an H100 at
        # d = 768 / 1024 / 2048 (5–12% over the row_settings warps with 4096-element tiles)
        rows = 1 if block <= 1024 else 2
        rows_per_program = rows * triton.cdiv(M, min(8 * sms, M) * rows)
        programs = triton.cdiv(M, rows_per_program)
        dw_partial = torch.empty((programs, N), dtype=torch.float32, device=dy.device)
        _rms_norm_bwd[(programs,)](dy, dh, h, weight, rstd, dx, dw_partial, M, N, rows_per_program,
                                   HAS_DH=has_dh, BLOCK=block, ROWS=rows, num_warps=4)
        dw = dw_partial.sum(0).to(weight.dtype)
        dx = dx.view(ctx.shape)
        return dx, (dx if ctx.has_res else None), dw, None


def rms_norm_triton(x, weight, eps, residual=None):
    return RMSNormFunction.apply(x, residual, weight, eps)
