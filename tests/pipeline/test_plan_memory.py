"""Memory bounded by configuration: each stage's per-task estimate against the memory a task has,
refused before anything runs; near dedup splits its buckets further instead; tasks record what
they used; `pipeline plan` projects a run before it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gristmill.config import from_dict
from gristmill.core.step import BASE_TASK_BYTES
from gristmill.dedup.near import BUCKET_BYTES_PER_RECORD
from gristmill.pipeline.planning.planner import DOCUMENTS_PER_GB, estimate_memory, plan
from tests.cli_process import pipeline

REPO = Path(__file__).resolve().parents[2]


def _cli(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return pipeline(
        *args,
        cwd=cwd,
        # a clean environment, but the data the configs name (${GRISTMILL_DATA:-../shared/data})
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
        | {k: v for k, v in os.environ.items() if k == "GRISTMILL_DATA"},
    )


def _config(tmp_path, wet_files, lid_model, **executor) -> Path:
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "executor": {"type": "local", "tasks": 2, "workers": 1, **executor},
        "input": {"paths": [str(p) for p in wet_files]},
        "steps": [{"langid": {"model": str(lid_model)}}, {"gopher_quality": {}}, {"near_dedup": {"threshold": 0.8}}],
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_stage_over_the_memory_a_task_has_is_refused_before_anything_runs(tmp_path, wet_files, lid_model):
    # the curate stage alone is ~300 MB (imports, models, a WET record's buffers): 0.1 GB cannot hold it
    r = _cli("run", str(_config(tmp_path, wet_files, lid_model, memory_gb_per_task=0.1)))
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()[-1]
    assert "stage 01_curate" in err and "executor.memory_gb_per_task" in err and "GB" in err
    assert not (tmp_path / "run").exists()  # nothing created
    ok = _cli("run", str(_config(tmp_path, wet_files, lid_model, memory_gb_per_task=2)))
    assert ok.returncode == 0, ok.stderr
    # every task recorded what it used: the figures the estimates are checked against
    for stage in sorted((tmp_path / "run").glob("0*_*")):
        usage = [json.loads(f.read_text()) for f in sorted((stage / "usage").glob("task_*.json"))]
        assert usage, stage
        assert all(u["cpu_s"] > 0 and 50 < u["max_rss_mb"] < 2048 and u["end"] >= u["start"] for u in usage)


def _slurm_cfg(buckets_mem_gb: float, **near) -> dict:
    return {
        "run_dir": "/tmp/unused",
        "executor": {
            "type": "slurm",
            "tasks": 100,
            "slurm": {"mem_per_cpu_gb": 16, "stages": {"near_dedup_buckets": {"mem_per_cpu_gb": buckets_mem_gb}}},
        },
        "input": {"paths": ["/nonexistent/*.wet.gz"]},
        "steps": [{"near_dedup": {"threshold": 0.8, **near}}],
    }


def test_near_dedup_buckets_split_further_to_fit_and_explicit_ranges_are_refused():
    gb = 1000.0  # ~3e8 documents: a whole band would need ~10 GB
    stages = plan(from_dict(_slurm_cfg(0.5)), input_size=gb * 1e9, sources=[], check_memory=False)
    buckets = next(s for s in stages if s.name == "near_dedup_buckets")
    step = buckets.pipeline[0]
    need = BUCKET_BYTES_PER_RECORD * gb * DOCUMENTS_PER_GB / (0.5 * (1 << 30) - BASE_TASK_BYTES)
    assert step.params.ranges >= need > 8  # more ranges than the default ceil(100 / 9 bands)
    assert buckets.tasks == step.params.bands * step.params.ranges
    assert all(e.fits for e in estimate_memory(from_dict(_slurm_cfg(0.5)), [buckets]))
    # the user fixed key_ranges: not split behind their back, refused with the setting to change
    cfg = from_dict(_slurm_cfg(0.5, key_ranges=2))
    with pytest.raises(ValueError, match=r"near_dedup_buckets.*raise near_dedup.key_ranges"):
        plan(cfg, input_size=gb * 1e9, sources=[])


def test_memory_estimates_grow_only_where_the_model_says(tmp_path):
    """Streaming and spilling stages do not grow with the corpus at fixed tasks; the one-task
    cluster does, and is flagged when over its limit."""
    cfg = from_dict(_slurm_cfg(4))
    small = {
        e.stage.name: e.bytes for e in estimate_memory(cfg, plan(cfg, input_size=1e9, sources=[], check_memory=False))
    }
    big = {
        e.stage.name: e.bytes for e in estimate_memory(cfg, plan(cfg, input_size=1e13, sources=[], check_memory=False))
    }
    # spills: what grows is 8 bytes per document of order keys, not the band records
    per_task = 1e13 / 1e9 * DOCUMENTS_PER_GB / 100
    assert big["near_dedup_signature"] - 8 * per_task < 1.5 * small["near_dedup_signature"]
    # the cluster stages hold a partition of the documents in clusters each: what grows is that share
    rounds = [n for n in big if n.startswith("near_dedup_cluster")]
    assert big["near_dedup_cluster_round"] - BASE_TASK_BYTES > 5 * (small["near_dedup_cluster_round"] - BASE_TASK_BYTES)
    assert all(big[n] < 16 << 30 for n in rounds)
    # ~9e8 documents in clusters on 0.5 GB tasks: the planner takes more partitions than executor.tasks
    tight = _slurm_cfg(4)
    tight["executor"]["slurm"]["stages"]["near_dedup_cluster_round"] = {"mem_per_cpu_gb": 0.5}
    stages = plan(from_dict(tight), input_size=1e13, sources=[], check_memory=False)
    cluster = [s for s in stages if s.name.startswith("near_dedup_cluster") and s.name != "near_dedup_cluster_rest"]
    assert len({s.tasks for s in cluster}) == 1 and cluster[0].tasks > 100
    assert all(e.fits for e in estimate_memory(from_dict(tight), cluster))
    fixed = from_dict(_slurm_cfg(4, cluster_tasks=4))  # fixed by the user: refused, naming the setting
    stages = plan(fixed, input_size=1e13, sources=[], check_memory=False)
    over = [e.message() for e in estimate_memory(fixed, stages) if not e.fits]
    assert any("near_dedup_cluster_round" in m and "raise near_dedup.cluster_tasks" in m for m in over), over


def test_pipeline_plan_projects_a_snapshot_without_downloading():
    r = _cli("plan", "configs/slurm-crawl.yaml", "--files", "90000", "--json")
    assert r.returncode == 0, r.stdout + r.stderr  # the shipped settings fit every stage
    out = json.loads(r.stdout)
    assert out["input_gb"] == pytest.approx(90000 * 0.15)
    names = [s["stage"] for s in out["stages"]]
    assert names[0] == "01_curate" and any("near_dedup_cluster" in n for n in names)
    curate = out["stages"][0]
    assert curate["from"] == "crawl"  # matched to the calibrated config with the same stages and steps
    # 13.5 TB of WET: thousands of CPU-hours, not seconds
    assert float(curate["CPU-h"].rstrip("*").replace(",", "")) > 100
    cluster = next(s for s in out["stages"] if s["stage"].endswith("near_dedup_cluster_round"))
    assert cluster["tasks"] == "4000" and cluster["mem/task"].endswith("MB")  # a partition each, ~80 B/node
    assert any(line.startswith("total:") for line in out["notes"])
    # the tokenizer reads at most sample_bytes: its cost is what the calibration measured with a
    # full sample, not a line through the filtering config's runs extended to 13.5 TB (~6 h)
    tok = next(s for s in out["stages"] if s["stage"].endswith("_tokenizer"))
    assert float(tok["CPU-h"].rstrip("*")) < 0.1, tok
    # what is a line through small runs extended 13,000-fold says so, and what is capped does not
    assert float(curate["extrapolated"].rstrip("x").replace(",", "")) > 100 and tok["extrapolated"] == ""
    assert any(line.startswith("extrapolated:") for line in out["notes"])
    total = next(line for line in out["notes"] if line.startswith("total:"))
    # every stage projected, the cluster rounds and the tokenizer's divided stages included, and
    # the total is their sum: nothing left out of the wall
    assert f"all {len(names)} stages in it" in total, total
    assert all(s["CPU-h"] != "—" and s["wall"] != "—" for s in out["stages"]), out["stages"]
    rounds = [s for s in out["stages"] if s["stage"].endswith("near_dedup_cluster_round")]
    assert len(rounds) > 8  # planned for ~1e7 documents in clusters, as generated graphs of that size took
    assert all(s["from"].startswith("graph ") for s in out["stages"] if "near_dedup_cluster" in s["stage"])
    wall_s = sum(_seconds(s["wall"]) for s in out["stages"])
    shown = total.split(" wall on ")[0].split(", ")[-1]
    assert _seconds(shown) == pytest.approx(wall_s, rel=0.05, abs=60), (shown, wall_s)
    # a figure more than 100x beyond what it was measured at carries the mark, the capped ones not
    assert curate["CPU-h"].endswith("*") and curate["wall"].endswith("*") and not tok["CPU-h"].endswith("*")
    assert any("* marks the" in line for line in out["notes"])
    # the one-task stages: the shard plan reads the divided stage's sums, minutes at most; the walk
    # of the 16M encode files is spread over the shard_lengths tasks
    lengths = next(s for s in out["stages"] if s["stage"].endswith("_shard_lengths"))
    plan_ = next(s for s in out["stages"] if s["stage"].endswith("_shard_plan"))
    assert lengths["tasks"] == "4000" and plan_["tasks"] == "1"
    assert _seconds(plan_["wall"]) < 300 and float(lengths["CPU-h"].rstrip("*")) > 0.1, (plan_, lengths)


def _seconds(text: str) -> float:
    value, unit = text.rstrip("*").split()
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


def test_pipeline_plan_flags_what_does_not_fit(tmp_path):
    cfg = yaml.safe_load((REPO / "configs" / "slurm-crawl.yaml").read_text())
    next(s for s in cfg["steps"] if "near_dedup" in s)["near_dedup"]["cluster_tasks"] = 10  # 1.2e8 in clusters a task
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = _cli("plan", str(path), "--files", "90000")
    assert r.returncode == 1
    assert "✗ 10_near_dedup_cluster_round" in r.stdout, r.stdout


def test_a_tasks_peak_memory_is_its_own_not_its_parents():
    """A task's recorded peak RSS is its own process's: `ru_maxrss` inherits the high-water mark
    of the process that started it (the kernel keeps it across exec), so a task started by a
    parent holding 600 MB would report at least 600 MB while holding ~30."""
    held = bytearray(600 << 20)
    held[:: 1 << 12] = b"\1" * len(held[:: 1 << 12])  # touch every page: resident
    probe = (
        "import json, resource; from gristmill.pipeline.execution.usage import _rss_mb; "
        "ru = resource.getrusage(resource.RUSAGE_SELF); print(json.dumps([ru.ru_maxrss / 1024, _rss_mb(ru)]))"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    inherited, own = json.loads(res.stdout)
    assert inherited > 600  # what getrusage alone reports on Linux
    assert own < 200  # the task's own: an interpreter with gristmill.pipeline.execution.usage imported
    del held
