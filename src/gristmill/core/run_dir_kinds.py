"""What each kind of run directory can serve, declared once: read by the config's validation
(before anything runs) and by the run directories themselves (`gristmill.pipeline.rundir`, whose
`RunDir.refusals` is its kind's). Here, below both, so that neither imports the other."""

from __future__ import annotations

from gristmill.core import storage


class LocalRunDirKind:
    """A local folder, or a shared filesystem every Slurm or Ray node mounts: serves every run."""

    @staticmethod
    def refusals(cfg) -> list[str]:
        return []


class StoreRunDirKind:
    """A prefix on object storage: no training in place, no Slurm, no Ray."""

    @staticmethod
    def refusals(cfg) -> list[str]:
        where = cfg.run_dir
        problems = []
        if cfg.train is not None:
            problems.append(
                f"train: training on a run directory on object storage ({where}) is not supported: the "
                "trainer memory-maps the token shards and writes checkpoints in place; run without `train:` "
                "and train on a local copy of tokens/ (`pipeline train`)"
            )
        if cfg.executor.type == "slurm":
            problems.append(
                f"executor.type: slurm with a run directory on object storage ({where}) is not supported: "
                "Slurm writes each task's output and reads its launch script on a shared filesystem; use a "
                "run_dir there (inputs, models and token exports may still be URLs)"
            )
        if cfg.executor.type == "ray":
            problems.append(
                f"executor.type: ray with a run directory on object storage ({where}) is not supported: "
                "Ray tasks write their outputs, logs and completion markers to a run directory every node mounts "
                "at the same path; use a run_dir there (inputs, models and token exports may still be URLs)"
            )
        return problems


def run_dir_kind(location: str) -> type[LocalRunDirKind] | type[StoreRunDirKind]:
    return StoreRunDirKind if storage.is_url(str(location)) else LocalRunDirKind
