"""Fused kernels and their PyTorch references, selected by `kernels: triton|reference`.

Each kernel lives in one file with its Triton forward, backward, autograd Function and the plain
PyTorch reference it is tested against. Triton is imported only if installed (see `_triton`),
so CPU runs never need it. `Kernels(backend)` is what the model calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from gristmill.trainer.kernels._triton import HAVE_TRITON
from gristmill.trainer.kernels.cross_entropy import cross_entropy_reference, fused_linear_cross_entropy
from gristmill.trainer.kernels.rms_norm import rms_norm_reference, rms_norm_triton
from gristmill.trainer.kernels.rope import rope_qkv_reference, rope_qkv_triton, rope_tables
from gristmill.trainer.kernels.swiglu import swiglu_reference, swiglu_triton

__all__ = ["HAVE_TRITON", "Kernels", "rope_tables"]


@dataclass(frozen=True)
class Kernels:
    """The four ops the model uses, as Triton kernels or as PyTorch references.

    `fused_ce` picks the chunked linear+cross-entropy even with reference kernels (its per-row
    step then runs in PyTorch): memory stays O(chunk × vocab) on any device. `rope_in_place`:
    the RoPE kernel rotates the q/k/v projection's output in place (off under selective
    activation checkpointing, which keeps that output for its recompute; see kernels.rope).
    `fused_residual`: the model hands each block's feed-forward output to the next norm, whose
    kernel adds it to the residual stream (see model.Block). Off by default and under activation
    checkpointing: a checkpointed block would then keep two inputs (stream and pending output)
    where it keeps one.
    """

    backend: str = "reference"
    fused_ce: bool = False
    rope_in_place: bool = True
    fused_residual: bool = False

    def __post_init__(self):
        if self.backend not in ("triton", "reference"):
            raise ValueError(f"kernels: expected 'triton' or 'reference', got {self.backend!r}")
        if self.backend == "triton" and not HAVE_TRITON:
            raise RuntimeError("kernels: triton requested but Triton is not installed (use `kernels: reference`)")

    @property
    def triton(self) -> bool:
        return self.backend == "triton"

    def rms_norm(self, x, weight, eps, residual=None, round_dx=False):
        """`round_dx`: the Triton backward rounds the norm's input gradient before adding the
        residual's, as autograd's separate add (and so the reference) does."""
        if self.triton and x.is_cuda:
            return rms_norm_triton(x, weight, eps, residual, round_dx)
        return rms_norm_reference(x, weight, eps, residual)

    def swiglu(self, gate_up):
        return swiglu_triton(gate_up) if self.triton and gate_up.is_cuda else swiglu_reference(gate_up)

    def rope_qkv(self, qkv, cos, sin, n_heads, n_kv_heads):
        """(B, T, n_heads + 2·n_kv_heads, head_dim) → rotated q, rotated k, v."""
        if self.triton and qkv.is_cuda:
            return rope_qkv_triton(qkv, cos, sin, n_heads, n_kv_heads, self.rope_in_place)
        return rope_qkv_reference(qkv, cos, sin, n_heads, n_kv_heads)

    def linear_cross_entropy(self, h, weight, targets, z_loss=0.0, chunk_tokens=None):
        if self.triton and h.is_cuda:
            return fused_linear_cross_entropy(h, weight, targets, z_loss, chunk_tokens, impl="triton")
        if self.fused_ce:
            return fused_linear_cross_entropy(h, weight, targets, z_loss, chunk_tokens, impl="torch")
        return cross_entropy_reference(h, weight, targets, z_loss)
