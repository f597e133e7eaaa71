"""Triton, if installed. CPU machines have none: the kernel modules still import (their
reference paths run anywhere) and a Triton kernel raises a clear error only when called."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # CPU-only torch wheels do not bring triton
    HAVE_TRITON = False

    class _Unavailable:
        def __init__(self, fn=None):
            self.fn = fn

        def __getitem__(self, grid):
            raise RuntimeError("Triton is not installed: set `kernels: reference` (the default on CPU)")

        def __call__(self, *a, **k):
            return self[None]

    class triton:  # noqa: N801 - stands in for the module
        jit = _Unavailable

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << (n - 1).bit_length()

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return (a + b - 1) // b

    class tl:  # noqa: N801
        constexpr = object
        float32 = int64 = None


def row_settings(n: int) -> tuple[int, int]:
    """Block size and warps for a kernel that holds one row of `n` elements (Liger's heuristic)."""
    block = triton.next_power_of_2(n)
    if block > 65536:
        raise ValueError(f"row of {n} elements is too long for one block")
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, warps
