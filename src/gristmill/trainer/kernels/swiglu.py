"""SwiGLU on the output of the fused gate/up projection: `silu(gate) * up` where
`gate, up = gate_up.chunk(2, -1)`.

One read of `gate_up`, one write of the product, computed in fp32. Backward recomputes
`silu(gate)` from the saved input instead of keeping it (saves one (tokens, d_ff) activation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gristmill.trainer.kernels._triton import tl, triton

BLOCK = 1024


def swiglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _swiglu_fwd(AB, C, F, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    a = tl.load(AB + row * 2 * F + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(AB + row * 2 * F + F + cols, mask=mask, other=0.0).to(tl.float32)
    c = a * tl.sigmoid(a) * b
    tl.store(C + row * F + cols, c.to(C.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(AB, DC, DAB, F, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    a = tl.load(AB + row * 2 * F + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(AB + row * 2 * F + F + cols, mask=mask, other=0.0).to(tl.float32)
    dc = tl.load(DC + row * F + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    da = dc * b * s * (1.0 + a * (1.0 - s))
    db = dc * a * s
    tl.store(DAB + row * 2 * F + cols, da.to(DAB.dtype.element_ty), mask=mask)
    tl.store(DAB + row * 2 * F + F + cols, db.to(DAB.dtype.element_ty), mask=mask)


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        shape = gate_up.shape
        F2 = shape[-1]
        ab = gate_up.reshape(-1, F2).contiguous()
        M, F_ = ab.shape[0], F2 // 2
        c = torch.empty((M, F_), dtype=ab.dtype, device=ab.device)
        _swiglu_fwd[(M, triton.cdiv(F_, BLOCK))](ab, c, F_, BLOCK=BLOCK, num_warps=4)
        ctx.save_for_backward(ab)
        ctx.shape = shape
        return c.view(*shape[:-1], F_)

    @staticmethod
    def backward(ctx, dc):
        (ab,) = ctx.saved_tensors
        M, F2 = ab.shape
        F_ = F2 // 2
        dc = dc.reshape(M, F_).contiguous()
        dab = torch.empty_like(ab)
        _swiglu_bwd[(M, triton.cdiv(F_, BLOCK))](ab, dc, dab, F_, BLOCK=BLOCK, num_warps=4)
        return dab.view(ctx.shape)


def swiglu_triton(gate_up: torch.Tensor) -> torch.Tensor:
    return SwiGLUFunction.apply(gate_up)
