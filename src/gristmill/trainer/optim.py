"""AdamW and gradient clipping as the loop uses them: no host sync, no extra pass over the
gradients, and no DTensor dispatch on the hot path.

`AdamW` is torch's AdamW (same parameter groups, same state — `step`, `exp_avg`, `exp_avg_sq` —
so checkpoints and `get_state_dict` see nothing new) whose `step()` updates the *local* tensors
of FSDP2's DTensor parameters, gradients and moments: with `triton=True` (GPU, fp32 parameters
and gradients) our AdamW kernel, one launch per tensor (`kernels/adamw.py`, 1.2× torch's on
these shards), else torch's fused kernel (`torch._fused_adamw_`) once per (device, dtype)
group. AdamW is elementwise, so updating each rank's shard is the whole update; going through
DTensor's dispatcher instead cost milliseconds of host time per step, which at 125M on two GPUs
was a quarter of the step.

`clip_and_guard` computes the global grad norm from the local shards (one all-reduce of a
scalar under FSDP) and hands the clip coefficient to the fused kernel as `grad_scale` and a
non-finite norm as `found_inf`, on which the kernel leaves parameters and moments untouched
(the mechanism GradScaler uses).

`MasterAdamW` is the same optimizer for a model that computes in bf16 without FSDP: it turns the
model's parameters into bf16 and keeps their fp32 masters (kernel: `kernels/adamw.py`), so no
autocast cast runs per step. Checkpoints still hold fp32 weights and torch's optimizer state.

On one GPU, `optim.overlap_update` moves the update beside compute: `MasterAdamW.overlap_update`
runs the same kernels on the same tensors (so the numbers do not change, bit for bit) on a
second CUDA stream, unit by unit (embedding, each block, final norm + head), and the next
step's forward waits only for the unit it is about to run (`Transformer.before_unit`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from gristmill.compat.torch import foreach_add_, foreach_norm, foreach_sub_, fused_adamw_, is_dtensor, local_tensor
from gristmill.trainer.kernels.adamw import adamw_master_reference, adamw_master_triton


class AdamW(torch.optim.AdamW):
    """Fused AdamW that steps on local shards; `grad_scale` / `found_inf` attributes as set by
    `clip_and_guard` (or absent: no clipping, no guard)."""

    def __init__(self, params, triton: bool = False, **kwargs):
        super().__init__(params, fused=True, **kwargs)
        self.triton = triton

    def grads(self) -> list[torch.Tensor]:
        """The gradients the next step applies (what the grad norm is taken of)."""
        return [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]

    def accumulate_grads(self) -> None:
        """After each micro-batch's backward when accumulating (nothing to do: the fp32
        gradients accumulate in place)."""

    def wait_for_updates(self) -> None:
        """Makes the current stream wait for every parameter update queued so far (nothing to
        wait for: this optimizer updates on the current stream)."""

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
                lp = local_tensor(p)
                b = buckets.setdefault((lp.device, lp.dtype), [[], [], [], [], []])
                for lst, t in zip(
                    b,
                    (
                        lp,
                        local_tensor(p.grad),
                        local_tensor(state["exp_avg"]),
                        local_tensor(state["exp_avg_sq"]),
                        state["step"],
                    ),
                ):
                    lst.append(t)
            beta1, beta2 = group["betas"]
            for (device, _), (ps, gs, ms, vs, steps) in buckets.items():
                scale = grad_scale.to(device, non_blocking=True) if grad_scale is not None else None
                inf = found_inf.to(device, non_blocking=True) if found_inf is not None else None
                foreach_add_(steps, 1)
                hyper = dict(
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    grad_scale=scale,
                    found_inf=inf,
                )
                if (
                    self.triton
                    and device.type == "cuda"
                    and all(t.dtype == torch.float32 and t.is_contiguous() for t in (*gs, *ps, *ms, *vs))
                ):
                    for p, g, m, v, st in zip(ps, gs, ms, vs, steps):
                        adamw_master_triton(p, g, m, v, None, st, **hyper)
                else:
                    fused_adamw_(ps, gs, ms, vs, steps, **hyper)
                if inf is not None:  # a skipped step does not count
                    foreach_sub_(steps, [inf] * len(steps))
        return None


class MasterAdamW(AdamW):
    """AdamW for a bf16 model with fp32 master weights, without FSDP (FSDP2's mixed precision
    keeps the same split itself).

    Give it the fp32 parameters after their init: it copies each to an fp32 master and makes the
    parameter itself bf16, so forward and backward run in bf16 with bf16 gradients and no
    per-step casts. `step()` updates master and moments and rewrites the bf16 weight in one
    kernel per tensor. When accumulating micro-batches, `accumulate_grads()` moves each bf16
    gradient into an fp32 sum (as FSDP2 accumulates in its reduce dtype). For checkpoints,
    `fp32_params()` shows the masters as the model's parameters, so state dicts are fp32 and
    the same as any other run's (resumable with or without master weights, on any world size).
    """

    def __init__(self, params, triton: bool = False, **kwargs):
        super().__init__(params, triton=triton, **kwargs)
        self.masters: dict[torch.nn.Parameter, torch.Tensor] = {}
        self._acc: dict[torch.nn.Parameter, torch.Tensor] = {}
        self._side: torch.cuda.Stream | None = None  # overlap_update
        self._units: list[list[torch.nn.Parameter]] | None = None
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.float32 or is_dtensor(p):
                    raise ValueError(
                        "MasterAdamW: expects plain fp32 parameters (it makes the bf16 ones);"
                        f" got {type(p).__name__} {p.dtype}"
                    )
                master = p.detach().clone()
                p.data = master.to(torch.bfloat16)
                self.masters[p] = master
                # state now, not lazily: its moments must be fp32 although the parameter is bf16
                self.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(master),
                    "exp_avg_sq": torch.zeros_like(master),
                }

    # --- overlap: update on a side stream, unit by unit; gradient norms beside backward -------

    def overlap_update(self, units: list[list[torch.nn.Parameter]]) -> None:
        """From now on `step()` updates on a second CUDA stream, one unit of parameters after
        another in `units` order (the order the forward uses them), recording an event after
        each; `wait_for_unit(i)` makes the current stream wait for unit i only. The forward of
        the next step then starts as soon as the embedding is updated and runs beside the rest
        of the update (memory-bound AdamW beside compute-bound matmuls)."""
        listed = [p for unit in units for p in unit]
        if sorted(map(id, listed)) != sorted(map(id, self.masters)):
            raise ValueError("overlap_update: the units must hold every parameter exactly once")
        self._units = units
        self._ready = [None] * len(units)
        self._side = torch.cuda.Stream(device=listed[0].device)

    def wait_for_unit(self, index: int) -> None:
        """Makes the current stream wait until unit `index`'s parameters are updated."""
        ready = self._ready[index] if self._units else None
        if ready is not None:
            torch.cuda.current_stream().wait_event(ready)
            self._ready[index] = None

    def wait_for_updates(self) -> None:
        if self._side is not None:
            torch.cuda.current_stream().wait_stream(self._side)
            self._ready = [None] * len(self._units or [])

    def _pending(self, params) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """(parameter, gradient to apply): the fp32 sum when accumulating, else the bf16 grad."""
        return [(p, self._acc.get(p, p.grad)) for p in params if p in self._acc or p.grad is not None]

    def grads(self) -> list[torch.Tensor]:
        return [g for group in self.param_groups for _, g in self._pending(group["params"])]

    def accumulate_grads(self) -> None:
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        old = [p for p in params if p in self._acc]  # dict lookup: by identity
        for p in params:
            if p not in self._acc:
                self._acc[p] = p.grad.float()
        if old:
            foreach_add_([self._acc[p] for p in old], [p.grad for p in old])
        for p in params:
            p.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._acc.clear()
        super().zero_grad(set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("MasterAdamW.step: closures are not supported")
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if self._units:
            self._step_beside(grad_scale, found_inf)
            return None
        for group in self.param_groups:
            todo = self._pending(group["params"])
            if not todo:
                continue
            steps = [self.state[p]["step"] for p, _ in todo]
            foreach_add_(steps, 1)
            for p, g in todo:
                self._update(p, g, group, grad_scale, found_inf)
            if found_inf is not None:  # a skipped step does not count
                foreach_sub_(steps, [found_inf] * len(steps))
        return None

    def _update(self, p, g, group, grad_scale, found_inf) -> None:
        st = self.state[p]
        beta1, beta2 = group["betas"]
        (adamw_master_triton if self.triton else adamw_master_reference)(
            self.masters[p],
            g,
            st["exp_avg"],
            st["exp_avg_sq"],
            p.data,
            st["step"],
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            grad_scale=grad_scale,
            found_inf=found_inf,
        )

    def _step_beside(self, grad_scale, found_inf) -> None:
        """`step()` on the side stream, unit by unit, an event after each (`overlap_update`)."""
        side, main = self._side, torch.cuda.current_stream()
        side.wait_stream(main)  # the gradients, the clip coefficient and the inf flag are written
        group_of = {p: g for g in self.param_groups for p in g["params"]}
        todo = [[(p, g) for p, g in self._pending(unit)] for unit in self._units]
        # what the main stream allocated and frees while the side stream still reads it
        for t in [g for unit in todo for _, g in unit] + [x for x in (grad_scale, found_inf) if x is not None]:
            t.record_stream(side)
        steps = [self.state[p]["step"] for unit in todo for p, _ in unit]
        with torch.cuda.stream(side):
            if steps:
                foreach_add_(steps, 1)
            for i, unit in enumerate(todo):
                for p, g in unit:
                    self._update(p, g, group_of[p], grad_scale, found_inf)
                self._ready[i] = side.record_event()
            if found_inf is not None and steps:  # a skipped step does not count
                foreach_sub_(steps, [found_inf] * len(steps))

    @contextmanager
    def fp32_params(self):
        """Inside, each parameter holds its fp32 master (state dicts read and load fp32); on
        exit the bf16 weights are re-made from the masters (which a load may have changed)."""
        self.wait_for_updates()
        weights = {}
        for p, master in self.masters.items():
            weights[p], p.data = p.data, master
        try:
            yield
        finally:
            for p, w in weights.items():
                self.masters[p] = p.data
                w.copy_(p.data)
                p.data = w


def grad_norm(grads) -> torch.Tensor:
    """Global L2 norm of the gradients (fp32 scalar, the same on every rank)."""
    grads = [g for g in grads if g is not None]
    sharded = False
    for g in grads:
        placements = getattr(g, "placements", None)
        if placements is not None:
            if not all(pl.is_shard() for pl in placements):
                raise ValueError(f"grad_norm: expected sharded DTensor gradients (FSDP2), got {placements}")
            sharded = True
    local = [local_tensor(g) for g in grads]
    if local:
        sq = torch.stack(foreach_norm(local, dtype=torch.float32)).square().sum()
    else:
        sq = torch.zeros((), dtype=torch.float32)
    if sharded and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sq)  # each rank holds disjoint shards: the squares add up
    return sq.sqrt()


def clip_and_guard(optimizer: AdamW, max_norm: float) -> torch.Tensor:
    """Grad norm of what the optimizer will apply; sets the optimizer's `grad_scale` (clip:
    clip_grad_norm_'s coefficient max_norm / (norm + 1e-6), capped at 1, as a divisor) and
    `found_inf` (non-finite norm)."""
    norm = grad_norm(optimizer.grads())
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
