"""Train YAML (`configs/train/*.yaml`) → validated `TrainConfig`.

A train YAML may name a `preset:` (another file in configs/train/, e.g. `tiny`, `125m`) whose
keys it overrides; `--set key=value` overrides come last. Errors name the key path, as the crawl
config's do (the config library's `validate_config` does both configs' overrides, `${VAR}`
interpolation and error collection).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field

from gristmill.core.configlib import ConfigError, Strict, validate_config

PRESET_DIRS = [Path("configs/train"), Path(__file__).resolve().parents[3] / "configs" / "train"]


class ModelShape(Strict):
    """The model's parameters, declared here once: the `model:` section is these (and how
    attention treats documents); `trainer.model.ModelArgs` is these with the vocabulary size and
    the longest sequence resolved, what the model is built from."""

    vocab_size: int | None = Field(None, ge=2, description="null: the token manifest's vocab size")
    dim: int = Field(768, ge=8)
    n_layers: int = Field(12, ge=1)
    n_heads: int = Field(12, ge=1)
    n_kv_heads: int | None = Field(None, ge=1, description="null: n_heads (no GQA)")
    ffn_dim: int | None = Field(None, ge=8, description="null: 8/3·dim rounded up to multiple_of")
    multiple_of: int = Field(256, ge=1)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02
    z_loss: float = Field(0.0, ge=0)
    ce_chunk_tokens: int | None = Field(
        None, ge=1, description="null: about vocab/dim chunks (see kernels.cross_entropy)"
    )


class ModelSection(ModelShape):
    doc_mask: bool = Field(False, description="attention stays within documents (dense mask: reference path)")


class DataSection(Strict):
    tokens: str = Field(description="token directory (with manifest.json) or a run directory holding tokens/")
    split: str = "train"
    val_split: str = "val"
    seq_len: int = Field(2048, ge=8)
    global_batch: int = Field(8, ge=1, description="sequences per optimizer step, all ranks together")
    micro_batch: int = Field(8, ge=1, description="sequences per forward on one rank (accumulation fills the rest)")
    seed: int = 0
    verify: Literal["lazy", False] = Field("lazy", description="sha256 of each shard when first opened")


class OptimSection(Strict):
    lr: float = Field(3e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = Field(0.1, ge=0, description="on matrices (ndim ≥ 2) except the embedding")
    grad_clip: float = Field(1.0, ge=0, description="max global grad norm; 0: off")
    overlap_update: bool = Field(
        True,
        description="one GPU (master weights): update the parameters on a second CUDA stream, block"
        " by block, beside the next step's forward (same numbers, bit for bit; 1.0-1.9% faster on an"
        " H100 at the presets' micro-batches)",
    )


class ScheduleSection(Strict):
    type: Literal["cosine", "wsd", "constant"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: share of steps in the final decay")


class CheckpointSection(Strict):
    every: int = Field(0, ge=0, description="steps between checkpoints (0: only at the end)")
    keep: int = Field(2, ge=1, description="keep the last N checkpoints")
    resume: bool = Field(True, description="continue from the latest checkpoint in <out>/checkpoints")
    enabled: bool = Field(True, description="false: write no checkpoints (benchmarks)")


class EvalSection(Strict):
    every: int = Field(0, ge=0, description="steps between validations (0: only at the end)")
    batches: int = Field(4, ge=0, description="micro-batches per rank per validation (0: no validation)")
    tasks: list[str] = Field(
        default_factory=list,
        description="in-context tasks scored during training: names of tasks_file, or JSONL files (docs/evaluation.md)",
    )
    corpora: list[str] = Field(
        default_factory=list, description="text files (or corpus names of tasks_file) scored in bits per byte"
    )
    tasks_file: str = Field("configs/eval/tasks.yaml", description="the task definitions tasks/corpora name")
    tasks_every: int = Field(0, ge=0, description="steps between task/corpus scorings (0: only at the end)")
    limit: int | None = Field(500, ge=1, description="items per task (null: all)")
    corpus_tokens: int | None = Field(100_000, ge=1, description="tokens per corpus (null: all)")
    batch_tokens: int = Field(8192, ge=1, description="padded tokens per scoring forward")


class LogSection(Strict):
    every: int = Field(1, ge=1)
    tensorboard: bool = True
    progress: bool = True


class TrainConfig(Strict):
    preset: str | None = Field(None, description="a train YAML in configs/train/ whose keys this one overrides")
    out_dir: str = Field("runs/train", description="checkpoints, metrics.jsonl, tensorboard/")
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    optim: OptimSection = Field(default_factory=OptimSection)
    schedule: ScheduleSection = Field(default_factory=ScheduleSection)
    steps: int = Field(100, ge=1)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    log: LogSection = Field(default_factory=LogSection)
    kernels: Literal["auto", "triton", "reference"] = Field("auto", description="auto: triton on CUDA, else reference")
    fused_ce: bool = Field(True, description="chunked linear+CE even with reference kernels")
    fused_residual: bool = Field(
        True,
        description="each block's feed-forward output is added to the residual stream inside the next"
        " norm's kernel (one pass less over the stream per block, forward and backward; same"
        " forward numbers bit for bit); false: a separate add at the end of each block. Only with"
        " `ac: none` (a checkpointed block would keep both the stream and the pending output)",
    )
    compile: bool = Field(False, description="torch.compile each block")
    ac: Literal["none", "selective", "full"] = "none"
    precision: Literal["auto", "bf16", "fp32", "fp8"] = Field(
        "auto",
        description="auto: bf16 on CUDA, fp32 on CPU; fp8: bf16 with the blocks' linear layers in"
        " float8 (torchao; a GPU with FP8 tensor cores, compute capability 8.9+)",
    )
    fp8_recipe: Literal["tensorwise", "rowwise"] = Field(
        "tensorwise", description="precision fp8: torchao's scaling recipe (one scale per tensor, or per row)"
    )
    master_weights: Literal["auto"] | bool = Field(
        "auto",
        description="bf16 without FSDP: the model holds bf16"
        " weights and the optimizer their fp32 masters (no per-step"
        " casts); false: fp32 weights under autocast",
    )
    fsdp: Literal["auto"] | bool = Field(
        "auto",
        description="FSDP2 fully_shard per block and root; auto: when"
        " world size > 1 (at world size 1 it only adds copies and host time)",
    )
    fsdp_reshard: bool = Field(
        True,
        description="FSDP2 reshard_after_forward: free each block's gathered"
        " parameters after its forward and gather them again in backward (ZeRO-3);"
        " false keeps them to backward (one all-gather per step, ZeRO-2's memory)",
    )
    fsdp_unit_layers: int = Field(
        1,
        ge=1,
        description="consecutive blocks per FSDP2 unit (one all-gather and"
        " one reduce-scatter each); >1 trades overlap for less per-unit host time",
    )
    nproc: int | None = Field(None, ge=1, description="processes for torchrun; null: visible GPUs, or 1 on CPU")
    seed: int = Field(0, description="model init seed")
    stop_after: int | None = Field(
        None,
        ge=1,
        description="end this run after that step, as a preemption would"
        " (the schedule still spans `steps`); re-running resumes",
    )


def find_preset(name: str) -> Path:
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    for d in PRESET_DIRS:
        if (d / f"{name}.yaml").is_file():
            return d / f"{name}.yaml"
    known = sorted({p.stem for d in PRESET_DIRS if d.is_dir() for p in d.glob("*.yaml")})
    raise ConfigError(f"preset: no configs/train/{name}.yaml (known: {', '.join(known)})")


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def _with_preset(data: dict, source: str, seen: tuple[Path, ...] = ()) -> dict:
    """`data`'s keys over those of its `preset:` (which may name a preset of its own), the
    `preset` key dropped; `seen`: the files read on the way here (a cycle is an error)."""
    if not data.get("preset"):
        return data
    path = find_preset(str(data["preset"]))
    if path.resolve() in seen:
        raise ConfigError(f"{source}: preset cycle through {path}")
    base = _with_preset(_read(path), str(path), (*seen, path.resolve()))
    return _merge(base, {k: v for k, v in data.items() if k != "preset"})


def from_dict(data: dict, overrides: list[str] = (), source: str = "train config") -> TrainConfig:
    return validate_config(TrainConfig, _with_preset(data, source), source=source, overrides=overrides)


def load(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        # a bare preset name works too: `pipeline train tiny`
        path = find_preset(str(path)) if "/" not in str(path) else path
        if not path.is_file():
            raise ConfigError(f"{path}: train config not found")
    data = _with_preset(_read(path), str(path), (path.resolve(),))
    return validate_config(TrainConfig, data, source=str(path), overrides=overrides)
