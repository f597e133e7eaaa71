"""`precision: fp8`: refused with one line where it would be wrong (a CPU, a GPU without FP8
tensor cores, no torchao), and the model swap itself, run on the CPU through torchao's float8
emulation. The GPU side (speed, loss against bf16) is in tests/trainer/test_train_gpu.py and
docs/benchmarks.md."""

from __future__ import annotations

import pytest
import torch

from gristmill.core.configlib import ConfigError
from gristmill.trainer import fp8
from gristmill.trainer.config import load as load_config
from gristmill.trainer.model import ModelArgs, Transformer
from gristmill.trainer.parallel import Dist
from gristmill.trainer.train import build, main

from .conftest import tiny_cfg


def test_refused_on_cpu():
    why = fp8.fp8_unavailable(torch.device("cpu"))
    assert why.startswith("precision: fp8 needs a CUDA GPU") and "\n" not in why


@pytest.mark.parametrize(
    ("cap", "name", "refused"),
    [((8, 0), "NVIDIA A100-SXM4-80GB", True), ((7, 5), "Tesla T4", True), ((9, 0), "NVIDIA H100 80GB HBM3", False)],
)
def test_refused_on_a_gpu_without_fp8_tensor_cores(monkeypatch, cap, name, refused):
    """Through the capability check, as a GPU would answer it (the test runs on CPU too)."""
    monkeypatch.setattr(fp8, "device_capability", lambda device: cap)
    monkeypatch.setattr(fp8, "device_name", lambda device: name)
    why = fp8.fp8_unavailable(torch.device("cuda", 0))
    if refused:
        assert why == (
            f"precision: fp8 needs FP8 tensor cores (compute capability 8.9+); {name} has {cap[0]}.{cap[1]}:"
            " use precision bf16"
        )
    else:  # Hopper: allowed if torchao is installed, else the line names the extra
        try:
            import torchao.float8  # noqa: F401

            assert why is None
        except ImportError:
            assert why is not None and "torchao" in why and "gristmill[fp8]" in why


def test_build_refuses_before_building_anything(token_dir):
    cfg = tiny_cfg(token_dir, 2, "precision=fp8")
    with pytest.raises(ConfigError, match="precision: fp8 needs a CUDA GPU"):
        build(cfg, Dist(0, 1, 0, torch.device("cpu")), 300)


def test_train_command_answers_with_one_line(token_dir, tmp_path, capsys):
    code = main(["tiny", "--out", str(tmp_path / "out"), "--set", f"data.tokens={token_dir}", "--set", "precision=fp8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: precision: fp8 needs a CUDA GPU"), err
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_recipe_is_validated():
    with pytest.raises(ConfigError, match="fp8_recipe"):
        load_config("tiny", ["fp8_recipe=blockwise"])


def test_swap_converts_the_block_linears_and_trains_under_emulation():
    """The blocks' four linear layers become Float8Linear, the head stays; a forward and a
    backward through torchao's emulated float8 give a loss near the unconverted model's."""
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    args = ModelArgs(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=32, max_seq_len=64)
    torch.manual_seed(0)
    ref = Transformer(args)
    ref.init_weights()
    model = Transformer(args)
    model.load_state_dict(ref.state_dict())
    assert fp8.apply_fp8(model, "tensorwise", emulate=True) == 4 * args.n_layers
    swapped = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert swapped == {f"layers.{i}.{name}" for i in range(args.n_layers) for name in fp8.FP8_LINEARS}
    assert not isinstance(model.output, Float8Linear)
    x = torch.randint(0, 512, (2, 65))
    losses = []
    for m in (ref, model):
        loss = m(x[:, :-1], x[:, 1:])
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[1] - losses[0]) / losses[0] < 0.02, losses
    for (n, a), b in zip(ref.named_parameters(), model.parameters()):
        assert b.grad is not None and torch.isfinite(b.grad).all(), n
        cos = torch.nn.functional.cosine_similarity(a.grad.flatten(), b.grad.flatten(), dim=0)
        assert cos > 0.98, (n, cos.item())
