"""`pipeline ablate ablate.yaml --plan`: what the ablation will cost, before anything runs.

CPU-hours, disk and wall of curation and tokenization come from the pipeline's projection
(`pipeline plan`: each stage from the calibration runs), a stage shared by several variants
counted once; GPU-hours from the trainer's plan (`pipeline train --plan`: FLOPs per token at the
MFU measured for the nearest calibrated size) for one run, times variants × seeds; checkpoint
disk from the parameter count (fp32 weights and two Adam moments, 12 bytes a parameter, times
`checkpoint.keep`). Per variant, tokenization is projected as its own `tokenize` step would run.
"""

from __future__ import annotations

from gristmill.ablation.config import AblateConfig, train_steps, variant_config
from gristmill.ablation.sharing import stage_keys

CHECKPOINT_BYTES_PER_PARAM = 12


def _with_tokenize(cfg: AblateConfig, name: str):
    from gristmill.config import from_dict

    vcfg = variant_config(cfg, name)
    data = vcfg.resolved()
    t, tok = cfg.tokenize, cfg.tokenizer
    source = {"path": tok.path} if tok.path else {"train": tok.train.model_dump(), "sample_bytes": tok.sample_bytes}
    step = {"tokenizer": source, "shard_tokens": t.shard_tokens, "val_fraction": t.val_fraction, "seed": t.seed}
    if t.tasks:
        step["tasks"] = t.tasks
    data["steps"] = [*data["steps"], {"tokenize": step}]
    return from_dict(data, source=f"variant {name}")


def vocab_size(cfg: AblateConfig) -> int:
    if cfg.tokenizer.path is None:
        return cfg.tokenizer.train.vocab_size
    from gristmill.tokenize import tokenizer as bpe

    return bpe.special_ids(bpe.load(cfg.tokenizer.path)).vocab_size


def make_plan(cfg: AblateConfig, *, gpu: str = "h100", gpus: int = 1, calibration: str | None = None) -> dict:
    from gristmill.pipeline.planning.projection import load_calibration, plan_for_size, project
    from gristmill.trainer.config import from_dict as train_from_dict
    from gristmill.trainer.plan import load_calibration as train_calibration
    from gristmill.trainer.plan import make_plan as train_plan

    pipeline_cal = load_calibration(calibration)
    variants, seen = {}, {}
    for name in cfg.names():
        vcfg = _with_tokenize(cfg, name)
        stages, size = plan_for_size(vcfg, None, None)
        keys = stage_keys(vcfg, stages)
        projections = project(vcfg, stages, size / 1e9, pipeline_cal, None)
        own = {"cpu_s": 0.0, "wall_s": 0.0, "disk_mb": 0.0, "stages": len(stages), "shared": 0, "uncalibrated": 0}
        for key, p in zip(keys, projections):
            if key in seen:
                own["shared"] += 1
                continue
            seen[key] = name
            if p.cpu_s is None:
                own["uncalibrated"] += 1
                continue
            own["cpu_s"] += p.cpu_s
            own["wall_s"] += p.wall_s
            own["disk_mb"] += p.disk_mb
        own["input_gb"] = size / 1e9
        variants[name] = own
    vocab = vocab_size(cfg)
    m = cfg.model
    tcfg = train_from_dict(
        {"preset": m.preset, "data": {"tokens": str(cfg.out_dir / "tokens")}, "model": {"vocab_size": vocab}},
        m.set,
        source=f"model.preset {m.preset}",
    )
    steps = train_steps(cfg.tokens, tcfg.data.global_batch, tcfg.data.seq_len)
    tcfg = tcfg.model_copy(update={"steps": steps})
    tp = train_plan(tcfg, gpus=gpus, gpu=gpu, calibration=train_calibration())
    runs = len(cfg.variants) * len(cfg.seeds)
    per_run_s = tp["seconds"]
    ckpt = tp["params"]["total"] * CHECKPOINT_BYTES_PER_PARAM * tcfg.checkpoint.keep
    cpu_s = sum(v["cpu_s"] for v in variants.values())
    wall_cur = sum(v["wall_s"] for v in variants.values())
    return {
        "variants": variants,
        "curation": {
            "cpu_hours": cpu_s / 3600,
            "wall_s": wall_cur,
            "disk_bytes": sum(v["disk_mb"] for v in variants.values()) * 1e6,
            "uncalibrated_stages": sum(v["uncalibrated"] for v in variants.values()),
            "shared_stages": sum(v["shared"] for v in variants.values()),
        },
        "training": {
            "runs": runs,
            "steps": steps,
            "tokens_per_run": steps * tcfg.data.global_batch * tcfg.data.seq_len,
            "gpu": tp["gpu"].name,
            "gpus": gpus,
            "params": tp["params"]["total"],
            "mfu": tp["mfu"],
            "seconds_per_run": per_run_s,
            "gpu_hours": None if per_run_s is None else per_run_s * gpus * runs / 3600,
            "checkpoint_bytes": ckpt * runs,
            "fits": tp["fits"],
        },
        "wall_s": wall_cur + (per_run_s or 0) * runs,
        "disk_bytes": sum(v["disk_mb"] for v in variants.values()) * 1e6 + ckpt * runs,
    }


def render(plan: dict, source: str) -> list[str]:
    from gristmill.core.messages import format_bytes

    def dur(s):
        return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"

    lines = [f"plan: {source}"]
    for name, v in plan["variants"].items():
        lines.append(
            f"  curate {name}: {v['stages']} stages ({v['shared']} shared with an earlier variant),"
            f" {v['input_gb']:.3g} GB of input: {v['cpu_s'] / 3600:.3g} CPU-hours, {dur(v['wall_s'])} wall,"
            f" {format_bytes(v['disk_mb'] * 1e6)} written"
            + (f" ({v['uncalibrated']} stages not calibrated, not counted)" if v["uncalibrated"] else "")
        )
    c, t = plan["curation"], plan["training"]
    lines.append(
        f"curation: {c['cpu_hours']:.3g} CPU-hours, {dur(c['wall_s'])} wall, {format_bytes(c['disk_bytes'])} on disk"
        f" ({c['shared_stages']} stages computed once for several variants)"
    )
    gpu_h = "no calibrated MFU to project from" if t["gpu_hours"] is None else f"{t['gpu_hours']:.3g} GPU-hours"
    per_run = "" if t["seconds_per_run"] is None else f", {dur(t['seconds_per_run'])} each at {t['mfu']:.1%} MFU"
    lines.append(
        f"training: {t['runs']} runs × {t['steps']:,} steps ({t['tokens_per_run']:,} tokens) of {t['params']:,}"
        f" parameters on {t['gpus']} × {t['gpu']}: {gpu_h}{per_run};"
        f" checkpoints {format_bytes(t['checkpoint_bytes'])}" + ("" if t["fits"] else "; DOES NOT FIT in GPU memory")
    )
    lines.append(f"total: {dur(plan['wall_s'])} wall, {format_bytes(plan['disk_bytes'])} on disk")
    return lines
