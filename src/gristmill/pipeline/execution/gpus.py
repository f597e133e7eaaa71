"""GPUs for the tasks of a stage that holds a GPU step (`Step.gpus_per_task`, e.g. the neural
`classifier` on `device: cuda`/`auto` where a GPU is visible).

Each executor gives every such task GPUs of its own, the way its scheduler knows:
- local: the GPUs this process sees (`CUDA_VISIBLE_DEVICES`, else every device) are cut into
  groups of `gpus_per_task`; at most one task per group runs at once, and a task is started with
  `CUDA_VISIBLE_DEVICES` naming its group's devices (slot k: group k), so it sees them as
  `cuda:0..`;
- Slurm: `--gres=gpu:N` on the stage's job arrays (Slurm sets `CUDA_VISIBLE_DEVICES` per task);
- Ray: `num_gpus` in the task's resources (Ray sets `CUDA_VISIBLE_DEVICES` per task).
"""

from __future__ import annotations

import os

from gristmill.core.messages import ConfigError

__all__ = ["NoGpus", "concurrent_tasks", "slot_devices", "visible"]


class NoGpus(ConfigError):
    """A stage needs more GPUs per task than this machine shows; the message names the stage."""


def visible() -> list[str]:
    """The GPUs this process may use, as `CUDA_VISIBLE_DEVICES` names them (indices or UUIDs)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        names = [d.strip() for d in env.split(",") if d.strip()]
        # CUDA stops at the first invalid entry: "-1" (a common way to hide every GPU) hides the rest
        out = []
        for d in names:
            if d.startswith("-"):
                break
            out.append(d)
        return out
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def concurrent_tasks(stage_label: str, workers: int, gpus: list[str], per_task: int) -> int:
    """How many tasks of a stage needing `per_task` GPUs each may run at once."""
    if per_task <= 0:
        return workers
    groups = len(gpus) // per_task
    if groups == 0:
        raise NoGpus(
            f"stage {stage_label}: a task needs {per_task} GPU(s) and this machine shows {len(gpus)} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); set the step's device: cpu"
        )
    return min(workers, groups)


def slot_devices(gpus: list[str], per_task: int, slot: int) -> str:
    """`CUDA_VISIBLE_DEVICES` of the task that runs in `slot` (0 ≤ slot < concurrent_tasks)."""
    return ",".join(gpus[slot * per_task : (slot + 1) * per_task])
