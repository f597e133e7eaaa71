"""SwiGLU on the output of the fused gate/up projection: `silu(gate) * up` where
`gate, up = gate_up.chunk(2, -1)`.

One read of `gate_up`, one write of the product, computed in fp32. Backward recomputes
`silu(gate)` from the saved input instead of keeping it (saves one (tokens, d_ff) activation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gristmill.trainer.kernels._triton import tl, triton


def swiglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _swiglu_fwd(AB, C, M, F, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = (rows < M) & (cols < F)
    ab = AB + rows.to(tl.int64) * 2 * F + cols
    a = tl.load(ab, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(ab + F, mask=mask, other=0.0).to(tl.float32)
    c = a * tl.sigmoid(a) * b
    tl.store(C + rows.to(tl.int64) * F + cols, c.to(C.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(AB, DC, DAB, M, F, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = (rows < M) & (cols < F)
    ab = rows.to(tl.int64) * 2 * F + cols
    a = tl.load(AB + ab, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(AB + ab + F, mask=mask, other=0.0).to(tl.float32)
    dc = tl.load(DC + rows.to(tl.int64) * F + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    da = dc * b * s * (1.0 + a * (1.0 - s))
    db = dc * a * s
    tl.store(DAB + ab, da.to(DAB.dtype.element_ty), mask=mask)
    tl.store(DAB + ab + F, db.to(DAB.dtype.element_ty), mask=mask)


def tile_settings(f: int) -> tuple[int, int, int]:
    """(BLOCK columns, rows, warps) of one program's tile, for d_ff = `f`: one row, up to 4096
    columns. The fastest, within 1%, of BLOCK {512 … 4096} × rows {1, 2, 4} × warps {4, 8, 16}
    on an H100 at d_ff 2048 / 2816 / 5632 (3% over 1024-column tiles of 4 warps)."""
    block = min(4096, triton.next_power_of_2(f))
    return block, 1, 16 if block == 4096 else 8


def swiglu_fwd(ab):
    """(M, 2F) gate/up → (M, F)."""
    M, F_ = ab.shape[0], ab.shape[1] // 2
    block, rows, warps = tile_settings(F_)
    c = torch.empty((M, F_), dtype=ab.dtype, device=ab.device)
    _swiglu_fwd[(triton.cdiv(M, rows), triton.cdiv(F_, block))](ab, c, M, F_, BLOCK=block, ROWS=rows, num_warps=warps)
    return c


def swiglu_bwd(ab, dc):
    M, F_ = ab.shape[0], ab.shape[1] // 2
    block, rows, warps = tile_settings(F_)
    dab = torch.empty_like(ab)
    _swiglu_bwd[(triton.cdiv(M, rows), triton.cdiv(F_, block))](
        ab, dc, dab, M, F_, BLOCK=block, ROWS=rows, num_warps=warps
    )
    return dab


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        shape = gate_up.shape
        ab = gate_up.reshape(-1, shape[-1]).contiguous()
        c = swiglu_fwd(ab)
        ctx.save_for_backward(ab)
        ctx.shape = shape
        return c.view(*shape[:-1], c.shape[-1])

    @staticmethod
    def backward(ctx, dc):
        (ab,) = ctx.saved_tensors
        dc = dc.reshape(ab.shape[0], ab.shape[1] // 2).contiguous()
        return swiglu_bwd(ab, dc).view(ctx.shape)


def swiglu_triton(gate_up: torch.Tensor) -> torch.Tensor:
    return SwiGLUFunction.apply(gate_up)
