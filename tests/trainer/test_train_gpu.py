"""The trainer's GPU-only paths (`pytest -m gpu`): the optimizer beside the forward gives the
same numbers bit for bit; `precision: fp8` trains on
the FP8 tensor cores near bf16, and is refused where the GPU has none."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from gristmill.trainer.config import load as load_config  # noqa: E402
from gristmill.trainer.optim import clip_and_guard  # noqa: E402
from gristmill.trainer.parallel import init_distributed  # noqa: E402
from gristmill.trainer.train import build  # noqa: E402

VOCAB = 1000
SHAPE = ["model.dim=256", "model.n_layers=4", "model.n_heads=4", "model.n_kv_heads=2", "data.seq_len=128"]


def _run(overrides, steps=4, micro=4):
    cfg = load_config(
        "tiny",
        [
            "data.tokens=/nonexistent",
            "kernels=triton",
            "compile=false",
            "precision=bf16",
            f"data.micro_batch={micro}",
            f"data.global_batch={micro}",
            *SHAPE,
            *overrides,
        ],
    )
    built = build(cfg, init_distributed(), VOCAB)
    model, opt = built.model, built.optimizer
    g = torch.Generator(device="cuda").manual_seed(0)
    losses, norms = [], []
    for _ in range(steps):
        x = torch.randint(0, VOCAB, (micro, 129), device="cuda", generator=g)
        with built.autocast:
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        norms.append(clip_and_guard(opt, 0.5))  # clips: the scale path is exercised
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    torch.cuda.synchronize()
    with opt.fp32_params() if hasattr(opt, "fp32_params") else torch.no_grad():
        params = [p.detach().clone() for p in model.parameters()]
    return torch.stack(losses), torch.stack(norms), params, model


def test_overlapped_update_is_bitwise_the_plain_step():
    loss0, norm0, params0, plain = _run(["optim.overlap_update=false"])
    loss1, norm1, params1, model = _run(["optim.overlap_update=true"])
    assert plain.before_unit is None
    assert model.before_unit is not None  # the forward waited unit by unit
    assert torch.equal(loss0, loss1) and torch.equal(norm0, norm1)
    for a, b in zip(params0, params1):
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_trains_near_bf16(recipe):
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    loss_bf16, _, _, _ = _run([], steps=6)
    loss_fp8, norm_fp8, _, model = _run(["precision=fp8", f"fp8_recipe={recipe}"], steps=6)
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == 4 * 4  # 4 linears × 4 blocks
    assert torch.isfinite(loss_fp8).all() and torch.isfinite(norm_fp8).all()
    rel = ((loss_fp8 - loss_bf16).abs() / loss_bf16).max().item()
    assert rel < 0.02, (loss_bf16.tolist(), loss_fp8.tolist())


def test_fp8_refused_on_a_gpu_without_fp8_tensor_cores(monkeypatch):
    from gristmill.core.configlib import ConfigError
    from gristmill.trainer import fp8

    monkeypatch.setattr(fp8, "device_capability", lambda device: (8, 0))
    with pytest.raises(ConfigError, match="compute capability 8.9"):
        _run(["precision=fp8"], steps=1)


def test_full_checkpointing_of_compiled_blocks_gives_the_same_step():
    """`ac: full` with compile checkpoints around each compiled block (train.build): the
    recompute reruns the same compiled graph, so losses, norms and weights are the same as
    without checkpointing."""
    loss0, norm0, params0, _ = _run(["compile=true"])
    loss1, norm1, params1, model = _run(["compile=true", "ac=full"])
    assert type(model.layers[0]).__name__ == "CheckpointWrapper"
    torch.testing.assert_close(loss1, loss0, rtol=0, atol=0)
    torch.testing.assert_close(norm1, norm0, rtol=1e-6, atol=0)
    for a, b in zip(params0, params1):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
