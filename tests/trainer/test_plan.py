"""`pipeline train --plan` on the CPU: its arithmetic against independent counts (parameters
counted off the built model, optimizer state and gradients off the real tensors, the saved
activations of a forward measured through autograd's saved-tensor hooks), the time projection,
and bad input answered with one line. The memory model's GPU path (Triton kernels, compiled
blocks) is checked against the allocator on an H100 by benchmarks/train_memory.py
(docs/benchmarks.md)."""

from __future__ import annotations

import math

import pytest
import torch

from gristmill.cli import main as cli_main
from gristmill.core.configlib import ConfigError
from gristmill.trainer import plan
from gristmill.trainer.config import load as load_config
from gristmill.trainer.kernels import Kernels
from gristmill.trainer.model import ModelArgs, Transformer
from gristmill.trainer.optim import MasterAdamW, param_groups
from gristmill.trainer.parallel import apply_ac
from gristmill.trainer.train import model_args

TINY = dict(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=64)


def _numel(tensors) -> int:
    return sum(t.numel() for t in tensors)


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_counts_match_the_built_model(tied):
    args = ModelArgs(**TINY, tie_embeddings=tied)
    m = Transformer(args)
    counts = plan.param_count(args)
    assert counts["total"] == _numel(m.parameters())
    emb = _numel(m.tok_embeddings.parameters()) + (0 if tied else _numel(m.output.parameters()))
    assert counts["embedding"] == emb and counts["non_embedding"] == counts["total"] - emb
    linears = _numel(mod.weight for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    assert counts["matmul"] == linears + (args.vocab_size * args.dim if tied else 0)  # the tied head multiplies too


@pytest.mark.parametrize("preset", ["125m", "350m", "1b", "3b"])
def test_preset_parameter_counts_match_the_meta_model(preset):
    args = model_args(load_config(preset, ["data.tokens=/nonexistent"]), 32000)
    with torch.device("meta"):
        m = Transformer(args)
    assert plan.param_count(args)["total"] == _numel(m.parameters())


def test_parameters_optimizer_and_gradients_are_the_tensors_training_makes():
    """One GPU in bf16 with master weights, made on the CPU: bf16 parameters, fp32 masters and
    two fp32 moments, bf16 gradients — the bytes of the real tensors."""
    args = ModelArgs(**TINY)
    torch.manual_seed(0)
    m = Transformer(args, Kernels("reference", fused_ce=True))
    m.init_weights()
    opt = MasterAdamW(param_groups(m, 0.1), lr=1e-3)
    x = torch.randint(0, args.vocab_size, (2, 33))
    m(x[:, :-1], x[:, 1:]).backward()
    mem = plan.memory(args, micro_batch=2, seq_len=32, ac="none", precision="bf16")

    def nbytes(ts):
        return sum(t.numel() * t.element_size() for t in ts)

    assert mem.parameters == nbytes(m.parameters())
    state = [t for s in opt.state.values() for k, t in s.items() if k != "step"]
    assert mem.optimizer == nbytes(opt.masters.values()) + nbytes(state)
    assert mem.gradients == nbytes(p.grad for p in m.parameters())
    assert mem.resident_gradients == 0
    # accumulating: an fp32 sum of the gradients lives through every forward
    acc = plan.memory(args, micro_batch=2, seq_len=32, ac="none", precision="bf16", accum_steps=4)
    opt.accumulate_grads()
    assert acc.resident_gradients == nbytes(opt._acc.values())


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd keeps for backward while `fn` runs."""
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def test_full_checkpointing_keeps_each_blocks_input_as_counted():
    """`ac: full` keeps each block's input and nothing else of it: measured on a CPU forward
    (fp32: 4 bytes per activation), the model's count exactly."""
    args = ModelArgs(**TINY)
    m = Transformer(args)
    m.init_weights()
    apply_ac(m, "full")
    B, T = 3, 48
    x0 = m.tok_embeddings(torch.randint(0, args.vocab_size, (B, T))).detach().requires_grad_()
    cos, sin = m.rope_cos[:T], m.rope_sin[:T]
    buffers = {m.rope_cos.untyped_storage().data_ptr(), m.rope_sin.untyped_storage().data_ptr()}

    def blocks():
        x = x0
        for block in m.layers:
            x = block(x, cos, sin)
        return x

    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in buffers:  # the RoPE tables: model constants, not activations
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        blocks()
    expected = args.n_layers * plan.saved_per_token_layer(args, "full", act_bytes=4) * B * T
    assert sum(seen.values()) == expected


def test_the_fused_heads_saved_gradients_are_counted():
    """The fused linear + cross-entropy keeps fp32 ∂h and ∂W (computed in its forward)."""
    from gristmill.trainer.kernels.cross_entropy import fused_linear_cross_entropy

    args = ModelArgs(**TINY)
    N = 96
    h = torch.randn(N, args.dim, requires_grad=True)
    w = torch.randn(args.vocab_size, args.dim, requires_grad=True)
    t = torch.randint(0, args.vocab_size, (N,))
    got, _ = _saved_bytes(lambda: fused_linear_cross_entropy(h, w, t, impl="torch"))
    assert got == plan.head_saved_bytes(args, N)


def test_activation_peak_grows_with_the_micro_batch_and_shrinks_with_checkpointing():
    args = model_args(load_config("1b", ["data.tokens=/nonexistent"]), 32000)
    peaks = {
        ac: [plan.activation_bytes(args, micro_batch=m, seq_len=2048, ac=ac)["peak"] for m in (1, 2, 4, 8)]
        for ac in ("none", "selective", "full")
    }
    for ac, p in peaks.items():
        assert p == sorted(p) and p[0] < p[-1], ac
    assert peaks["full"][-1] < peaks["selective"][-1] < peaks["none"][-1]
    # measured on an H100 (benchmarks/train_memory.py): 1B, ac none, micro-batch 4: 23.84 GiB
    cfg = load_config("1b", ["data.tokens=/nonexistent", "ac=none", "data.global_batch=4"])
    assert abs(plan.memory_for(cfg, args, 1).peak / plan.GiB / 23.84 - 1) < 0.10


def test_largest_micro_batch_is_the_last_that_fits():
    cfg = load_config("1b", ["data.tokens=/nonexistent", "ac=none"])
    args = model_args(cfg, 32000)
    gpu = plan.GPUS["h100"]
    m = plan.largest_micro_batch(cfg, args, 1, gpu, "none")
    usable = gpu.usable_gib * plan.GiB
    assert m > 1
    assert plan.memory_for(cfg, args, 1, micro_batch=m).peak <= usable
    assert plan.memory_for(cfg, args, 1, micro_batch=m + 1).peak > usable
    assert plan.largest_micro_batch(cfg, args, 1, plan.GPUS["h200"], "none") > m  # more memory, more fits


def test_time_is_the_token_budget_at_the_calibrated_mfu():
    cfg = load_config("1b", ["data.tokens=/nonexistent", "model.vocab_size=32000", "steps=100"])
    args = model_args(cfg, 32000)
    point = {"gpu": "h100", "preset": "1b", "gpus": 1, "matmul_params": args.matmul_params(), "micro_batch": 4}
    points = [
        {**point, "ac": "selective", "precision": "bf16", "mfu": 0.5},
        {**point, "ac": "none", "precision": "bf16", "mfu": 0.55},
        {**point, "ac": "selective", "precision": "fp8", "fp8_recipe": "tensorwise", "mfu": 0.6},
        {**point, "gpu": "h200", "ac": "selective", "precision": "bf16", "mfu": 0.9},
    ]
    p = plan.make_plan(cfg, gpus=2, gpu="h100", calibration={"points": points})
    assert p["mfu"] == 0.5  # same GPU, precision and checkpointing
    tokens = 100 * cfg.data.global_batch * cfg.data.seq_len
    assert p["tokens"] == tokens
    assert math.isclose(p["tokens_per_s"], 2 * 989e12 * 0.5 / args.flops_per_token(2048))
    assert math.isclose(p["seconds"], tokens / p["tokens_per_s"])
    assert plan.make_plan(cfg, gpus=1, gpu="h100", calibration={"points": []})["seconds"] is None


def test_the_shipped_calibration_projects_the_presets():
    for preset in ("125m", "350m", "1b", "3b"):
        cfg = load_config(preset, ["data.tokens=/nonexistent"])
        p = plan.make_plan(cfg, gpus=1, gpu="h100")
        assert p["seconds"] and 0.2 < p["mfu"] < 0.8, preset
        assert p["point"]["gpu"] == "h100"


def _cli(capsys, *argv):
    code = cli_main(["train", *argv, "--set", "data.tokens=/nonexistent"])
    cap = capsys.readouterr()
    return code, cap.out + cap.err


def test_plan_command_prints_the_plan(capsys):
    code, out = _cli(capsys, "1b", "--plan", "--gpus", "2", "--gpu", "H200")
    assert code == 0, out
    for line in ("plan: 1b on 2 × H200", "parameters: 1,055,991,808", "FLOPs per token: 6.848 G", "optimizer"):
        assert line in out, out
    assert "largest micro_batch that fits" in out and "time:" in out and "MFU" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "x100"], "error: --gpu: unknown GPU 'x100' (known: a100, a100-40gb, h100, h200, l40s)"),
        (["--gpus", "0"], "error: --gpus: must be at least 1 (got 0)"),
        (["--gpu", "a100", "--set", "precision=fp8"], "error: precision: fp8 needs FP8 tensor cores; an A100 80GB"),
        (["--gpus", "3"], "error: data.global_batch 64 is not a multiple of micro_batch 4 × 3 GPUs"),
        (
            ["--set", "data.micro_batch=32", "--set", "ac=none"],
            "error: does not fit: micro_batch 32 needs",
        ),
    ],
)
def test_bad_input_is_one_line(capsys, argv, message):
    code, out = _cli(capsys, "1b", "--plan", *argv)
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith(message), out


def test_plan_flags_without_plan_are_refused(capsys):
    code, out = _cli(capsys, "1b", "--gpus", "2")
    assert code == 2 and "error: --gpus goes with --plan" in out


def test_unknown_preset_is_a_config_error():
    with pytest.raises(ConfigError):
        load_config("7b", [])
