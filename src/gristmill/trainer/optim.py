"""AdamW and gradient clipping as the loop uses them: no host sync, no extra pass over the
gradients, and no DTensor dispatch on the hot path.

`AdamW` is torch's AdamW (same parameter groups, same state — `step`, `exp_avg`, `exp_avg_sq` —
so checkpoints and `get_state_dict` see nothing new) whose `step()` calls the fused kernel
(`torch._fused_adamw_`) once per (device, dtype) group on the *local* tensors of FSDP2's DTensor
parameters, gradients and moments. AdamW is elementwise, so updating each rank's shard is the
whole update; going through DTensor's dispatcher instead cost milliseconds of host time per
step, which at 125M on two GPUs was a quarter of the step.

`clip_and_guard` computes the global grad norm from the local shards (one all-reduce of a
scalar under FSDP) and hands the clip coefficient to the fused kernel as `grad_scale` and a
non-finite norm as `found_inf`, on which the kernel leaves parameters and moments untouched
(the mechanism GradScaler uses).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t


class AdamW(torch.optim.AdamW):
    """Fused AdamW that steps on local shards; `grad_scale` / `found_inf` attributes as set by
    `clip_and_guard` (or absent: no clipping, no guard)."""

    def __init__(self, params, **kwargs):
        super().__init__(params, fused=True, **kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("AdamW.step: closures are not supported")
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            buckets: dict[tuple, list[list[torch.Tensor]]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # as torch's Adam._init_group does for fused
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                lp = _local(p)
                b = buckets.setdefault((lp.device, lp.dtype), [[], [], [], [], []])
                for lst, t in zip(b, (lp, _local(p.grad), _local(state["exp_avg"]), _local(state["exp_avg_sq"]),
                                      state["step"])):
                    lst.append(t)
            beta1, beta2 = group["betas"]
            for (device, _), (ps, gs, ms, vs, steps) in buckets.items():
                scale = grad_scale.to(device, non_blocking=True) if grad_scale is not None else None
                inf = found_inf.to(device, non_blocking=True) if found_inf is not None else None
                torch._foreach_add_(steps, 1)
                torch._fused_adamw_(ps, gs, ms, vs, [], steps, amsgrad=False, lr=group["lr"], beta1=beta1,
                                    beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                                    maximize=False, grad_scale=scale, found_inf=inf)
                if inf is not None:  # a skipped step does not count
                    torch._foreach_sub_(steps, [inf] * len(steps))
        return None


def grad_norm(params) -> torch.Tensor:
    """Global L2 norm of the gradients (fp32 scalar, the same on every rank)."""
    grads = [p.grad for p in params if p.grad is not None]
    sharded = False
    for g in grads:
        placements = getattr(g, "placements", None)
        if placements is not None:
            if not all(pl.is_shard() for pl in placements):
                raise ValueError(f"grad_norm: expected sharded DTensor gradients (FSDP2), got {placements}")
            sharded = True
    local = [_local(g) for g in grads]
    if local:
        sq = torch.stack(torch._foreach_norm(local)).float().square().sum()
    else:
        sq = torch.zeros((), dtype=torch.float32)
    if sharded and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sq)  # each rank holds disjoint shards: the squares add up
    return sq.sqrt()


def clip_and_guard(optimizer: torch.optim.Optimizer, params, max_norm: float) -> torch.Tensor:
    """Grad norm; sets the optimizer's `grad_scale` (clip: clip_grad_norm_'s coefficient
    max_norm / (norm + 1e-6), capped at 1, as a divisor) and `found_inf` (non-finite norm)."""
    norm = grad_norm(params)
    optimizer.found_inf = (~torch.isfinite(norm)).float()
    if max_norm > 0:
        optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)
    return norm


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (ndim ≥ 2) except the token embedding (also the tied output); never norms."""
    embed = {id(p) for p in model.tok_embeddings.parameters()}
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim >= 2 and id(p) not in embed else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
