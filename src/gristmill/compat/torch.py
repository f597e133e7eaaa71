"""torch internals the trainer uses, in one place.

- DTensor's local shard (`._local_tensor`): FSDP2 parameters and gradients are DTensors; the
  optimizer and the grad norm work on the local shards without DTensor dispatch per op.
- `torch._fused_adamw_` and `torch._foreach_*`: the fused AdamW kernel that `torch.optim.AdamW`
  calls, driven directly so the step counts, clip coefficient and inf guard stay on the device.
- `checkpoint_wrapper` (a private module of torch.distributed): activation checkpointing per
  block, as torchtitan applies it.
- The aten names of the attention kernels selective checkpointing keeps.
"""

from __future__ import annotations

import torch

#: torch versions (major.minor) this module was written and tested for: 2.11 on the GPU
#: machines (CUDA 13), 2.13 (CPU wheel) on developer machines and CI.
WRITTEN_FOR = ("2.11", "2.13")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor; a plain tensor as it is."""
    return t._local_tensor if is_dtensor(t) else t


def is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "_local_tensor")


def fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, steps, **hyper) -> None:
    """torch's fused AdamW on lists of same-device, same-dtype tensors (no amsgrad, no maximize)."""
    torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, maximize=False, **hyper)


def foreach_add_(tensors, value) -> None:
    torch._foreach_add_(tensors, value)


def foreach_sub_(tensors, values) -> None:
    torch._foreach_sub_(tensors, values)


def foreach_norm(tensors, dtype=torch.float32):
    return torch._foreach_norm(tensors, 2, dtype=dtype)


def checkpoint_wrapper(module, **kwargs):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as wrap

    return wrap(module, **kwargs)


def attention_ops() -> set:
    """The scaled-dot-product attention kernels (flash, efficient, cuDNN) as aten ops."""
    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    }
