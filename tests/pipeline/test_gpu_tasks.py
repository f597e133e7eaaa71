"""A stage that holds a GPU step gets GPUs of its own for each task, on every executor: locally
one task per visible GPU with `CUDA_VISIBLE_DEVICES` naming it, `--gres=gpu:N` on Slurm,
`num_gpus` on Ray; and `pipeline plan` shows its GPU-hours. No GPU is needed: the local
executor's assignment is read back from the tasks themselves, under a `CUDA_VISIBLE_DEVICES`
this test sets (which the tasks never use to open a device)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from datatrove.pipeline.base import PipelineStep

from gristmill.pipeline.execution import gpus
from gristmill.pipeline.execution import zygote as task_zygote
from gristmill.pipeline.execution.executors import LocalExecutor


class RecordDevices(PipelineStep):
    """Holds `CUDA_VISIBLE_DEVICES` for a while, as a GPU task would hold its device: claims
    `<folder>/busy-<devices>` exclusively (two tasks given the same GPU at once fail), then
    writes `<rank>.json`."""

    name = "record devices"
    gpus_per_task = 1

    def __init__(self, folder: str, hold_s: float = 0.3):
        super().__init__()
        self.folder, self.hold_s = folder, hold_s

    def run(self, data, rank: int = 0, world_size: int = 1):
        devices = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        busy = Path(self.folder) / f"busy-{devices}"
        fd = os.open(busy, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # FileExistsError: the GPU is shared
        try:
            time.sleep(self.hold_s)
        finally:
            os.close(fd)
            busy.unlink()
        (Path(self.folder) / f"{rank}.json").write_text(json.dumps({"rank": rank, "devices": devices}))
        yield from ()


def _executor(folder: Path, records: Path, tasks: int, workers: int, gpus_per_task: int = 1) -> LocalExecutor:
    return LocalExecutor(
        pipeline=[RecordDevices(str(records))],
        tasks=tasks,
        workers=workers,
        logging_dir=str(folder),
        skip_completed=True,
        storage_config=None,
        gpus_per_task=gpus_per_task,
        label="01_score",
    )


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_each_local_task_sees_one_gpu_of_its_own_and_no_more_run_than_there_are_gpus(tmp_path, monkeypatch, start):
    monkeypatch.setenv(task_zygote.START_ENV, start)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    records = tmp_path / "records"
    records.mkdir()
    _executor(tmp_path / "stage", records, tasks=6, workers=4).run()
    seen = [json.loads((records / f"{r}.json").read_text())["devices"] for r in range(6)]
    assert set(seen) == {"3", "5"}, seen  # one device each, never both, never unset
    assert not list(records.glob("busy-*"))


def test_two_gpus_a_task_are_given_in_pairs(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4")  # the fifth makes no pair: unused
    records = tmp_path / "records"
    records.mkdir()
    _executor(tmp_path / "stage", records, tasks=4, workers=8, gpus_per_task=2).run()
    seen = {json.loads((records / f"{r}.json").read_text())["devices"] for r in range(4)}
    assert seen <= {"0,1", "2,3"} and seen, seen


def test_a_stage_that_needs_a_gpu_on_a_machine_without_one_fails_in_one_line_before_any_task(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    records = tmp_path / "records"
    records.mkdir()
    with pytest.raises(gpus.NoGpus, match=r"^stage 01_score: a task needs 1 GPU\(s\) and this machine shows 0 "):
        _executor(tmp_path / "stage", records, tasks=2, workers=2).run()
    assert not list(records.iterdir())  # no task started


def test_visible_gpus_read_as_cuda_reads_them(monkeypatch):
    for env, want in [("0,1", ["0", "1"]), (" 2 , 7 ", ["2", "7"]), ("", []), ("-1", []), ("1,-1,2", ["1"])]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
        assert gpus.visible() == want, env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8c1f2e,GPU-77aa")  # UUIDs pass through
    assert gpus.slot_devices(gpus.visible(), 1, 1) == "GPU-77aa"


def _neural_cfg(tmp_path: Path, executor: dict, device: str):
    from gristmill.config import load

    return load(
        "configs/crawl-neural.yaml",
        [f"executor={json.dumps(executor)}", f"steps.7.classifier.device={device}"],
        str(tmp_path / "run"),
    )


def test_slurm_asks_a_gpu_for_each_task_of_the_classifier_stage_only(tmp_path, monkeypatch, judged_classifier):
    """The planning machine has no GPU: `device: cuda` stands for tasks on the cluster's nodes."""
    from gristmill.pipeline.execution.executors import make_slurm_executor
    from gristmill.pipeline.planning.planner import plan

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = _neural_cfg(tmp_path, {"type": "slurm", "tasks": 2}, "cuda")
    stages = plan(cfg, check_memory=False)
    curate, later = stages[0], stages[1]
    assert curate.gpus_per_task == 1 and later.gpus_per_task == 0
    args = make_slurm_executor(curate, cfg.executor.slurm, None).get_sbatch_args(2)
    assert args.get("gres") == "gpu:1", args
    assert "gres" not in make_slurm_executor(later, cfg.executor.slurm, None).get_sbatch_args(2)


def test_a_local_run_with_device_cuda_and_no_gpu_is_refused_at_planning(tmp_path, monkeypatch, judged_classifier):
    from gristmill.filters.model_check import ModelError

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ModelError, match=r"device: cuda, but no CUDA GPU is visible here"):
        from gristmill.pipeline.planning.planner import plan

        plan(_neural_cfg(tmp_path, {"type": "local", "tasks": 2}, "cuda"), check_memory=False)


def test_ray_asks_num_gpus_and_a_cluster_without_gpus_is_refused_naming_them(tmp_path, monkeypatch, judged_classifier):
    from gristmill.core.messages import ConfigError
    from gristmill.pipeline.execution.ray import RayCluster, _fits
    from gristmill.pipeline.planning.planner import plan

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = _neural_cfg(tmp_path, {"type": "ray", "tasks": 2, "ray": {"address": "127.0.0.1:1"}}, "cuda")
    stages = plan(cfg, check_memory=False)
    cluster = RayCluster(cfg, stages)
    want = cluster.resources(stages[0])
    assert want["num_gpus"] == 1 and "num_gpus" not in cluster.resources(stages[1])
    node = {"Alive": True, "Resources": {"CPU": 16.0, "memory": 64e9}}
    assert not _fits(node, want) and _fits(node, cluster.resources(stages[1]))
    assert _fits({"Alive": True, "Resources": {**node["Resources"], "GPU": 1.0}}, want)

    import ray

    monkeypatch.setattr(ray, "nodes", lambda: [node])
    cluster.address = "127.0.0.1:1"
    with pytest.raises(ConfigError, match=r"^stage 01_curate: a task asks Ray for 1 CPUs, 1 GPUs and .* 0 GPUs\)"):
        cluster._check_room()


def test_plan_shows_gpu_hours_of_the_classifier_stage(tmp_path, monkeypatch, judged_classifier):
    from gristmill.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "plan.json"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(
            [
                "plan", "configs/crawl-neural.yaml", "--files", "1000", "--json",
                "--set", 'executor={"type": "slurm", "tasks": 2}', "--set", "steps.7.classifier.device=cuda",
            ]
        )  # fmt: skip
    out.write_text(buf.getvalue())
    report = json.loads(out.read_text())
    rows = {r["stage"]: r for r in report["stages"]}
    hours = float(rows["01_curate"]["GPU-h"])
    # 1,000 WET files of ~300k documents a GB, at the measured docs/s of a model this size
    from gristmill.filters import classifier_model as cm
    from gristmill.input.sources import CC_WET_FILE_BYTES

    docs = 1000 * CC_WET_FILE_BYTES / 1e9 * 300_000
    params = cm.check_classifier(str(judged_classifier)).params
    expected = docs / cm.MEASURED_GPU_DOCS_S * params / cm.MEASURED_GPU_PARAMS / 3600
    assert hours == pytest.approx(expected, rel=0.1), (hours, expected)
    assert all(r["GPU-h"] == "—" for s, r in rows.items() if s != "01_curate")
    assert any(n.startswith("GPU-h: ") for n in report["notes"])
