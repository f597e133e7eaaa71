"""Run a global step's stages (dedup, ...) on a folder of Parquet documents, with no WET stage.

For benchmarks, tests and re-deduplicating an existing output folder:

    stages = run_on_parquet("near_dedup", {"threshold": 0.8}, "runs/x/01_curate/output", "runs/dedup", tasks=4)

Stages run on the same executor as `pipeline run` (workers=1 runs tasks in this process).
"""

from __future__ import annotations

from pathlib import Path

from gristmill.config import from_dict
from gristmill.core.step import Stage
from gristmill.input.sources import fetcher_for
from gristmill.pipeline.execution.executors import make_executor
from gristmill.pipeline.planning.planner import PlanContext, build_steps
from gristmill.pipeline.report.journey import merge_stage


def plan_on_parquet(step: str, params: dict, input_folder, run_dir, tasks: int = 1, workers: int = 1) -> list[Stage]:
    cfg = from_dict(
        {
            "run_dir": str(run_dir),
            "executor": {"tasks": tasks, "workers": workers},
            "input": {"paths": [str(input_folder)]},
            "steps": [{step: params}],
            "output": {"dropped_sample": 0},
        }
    )
    # the memory models' input: Parquet (zstd) holds text about as densely as gzipped WET
    size = sum(f.stat().st_size for f in Path(input_folder).rglob("*.parquet"))
    # an absolute folder: the steps take a relative one as a name in the run directory
    docs = Path(input_folder).absolute()
    ctx = PlanContext(cfg, fetcher_for(cfg.input.commoncrawl), documents=docs, input_size=size)
    (global_step,) = build_steps(cfg, ctx)
    global_step.stages(ctx)
    return ctx.stages


def run_on_parquet(step: str, params: dict, input_folder, run_dir, tasks: int = 1, workers: int = 1) -> list[Stage]:
    stages = plan_on_parquet(step, params, input_folder, run_dir, tasks, workers)
    for stage in stages:
        make_executor(stage).run()
        merge_stage(stage.folder)
    return stages
