"""Model and kernels' CPU paths: chunked linear+CE equals the full-logits reference; document
masking; tied embeddings; the init and FLOP accounting."""

from __future__ import annotations

import pytest
import torch

from gristmill.trainer.kernels import Kernels
from gristmill.trainer.kernels.cross_entropy import cross_entropy_reference, fused_linear_cross_entropy
from gristmill.trainer.model import ModelArgs, Transformer


def _model(kernels=None, **kw):
    torch.manual_seed(0)
    args = ModelArgs(
        **{
            "vocab_size": 300,
            "dim": 64,
            "n_layers": 2,
            "n_heads": 4,
            "n_kv_heads": 2,
            "max_seq_len": 64,
            "multiple_of": 32,
            **kw,
        }
    )
    m = Transformer(args, kernels)
    m.init_weights()
    return m


@pytest.mark.parametrize("z", [0.0, 1e-3])
def test_chunked_cross_entropy_matches_reference(z):
    torch.manual_seed(1)
    h = torch.randn(50, 16, requires_grad=True)
    w = torch.randn(70, 16, requires_grad=True)
    t = torch.randint(0, 70, (50,))
    t[::9] = -100
    ref = cross_entropy_reference(h, w, t, z)
    gref = torch.autograd.grad(ref, (h, w))
    got = fused_linear_cross_entropy(h, w, t, z, chunk_tokens=7, impl="torch")
    ggot = torch.autograd.grad(got, (h, w))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    for a, b in zip(ggot, gref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_model_fused_ce_equals_full_logits_loss():
    a, b = _model(Kernels("reference")), _model(Kernels("reference", fused_ce=True))
    x = torch.randint(0, 300, (2, 33))
    la, lb = a(x[:, :-1], x[:, 1:]), b(x[:, :-1], x[:, 1:])
    la.backward(), lb.backward()
    torch.testing.assert_close(la, lb)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=lambda m: f"{n}: {m}")
    assert abs(la.item() - torch.log(torch.tensor(300.0)).item()) < 0.5  # near-uniform at init


def test_document_mask_isolates_documents():
    m = _model()
    m.eval()
    doc_a, doc_b = torch.randint(2, 300, (1, 10)), torch.randint(2, 300, (1, 12))
    packed = torch.cat([doc_a, doc_b], 1)
    doc_ids = torch.tensor([[0] * 10 + [1] * 12])
    with torch.no_grad():
        masked = m(packed, doc_ids=doc_ids)
        unmasked = m(packed)
        alone_a, alone_b = m(doc_a), m(doc_b)
    # under the mask each document sees only itself; RoPE is relative, so the second document's
    # positions starting at 10 instead of 0 change nothing
    torch.testing.assert_close(masked[:, :10], alone_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(masked[:, 10:], alone_b, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(masked[:, 10:], unmasked[:, 10:], atol=1e-4)
    # changing the first document does not change the second's outputs under the mask
    other = torch.cat([torch.randint(2, 300, (1, 10)), doc_b], 1)
    with torch.no_grad():
        torch.testing.assert_close(m(other, doc_ids=doc_ids)[:, 10:], masked[:, 10:], rtol=1e-5, atol=1e-5)


def test_tied_embeddings_share_one_matrix():
    m = _model(tie_embeddings=True)
    assert m.output is None
    x = torch.randint(0, 300, (2, 16))
    with torch.no_grad():  # the logits are read through the embedding matrix
        torch.testing.assert_close(m(x), m.hidden(x) @ m.tok_embeddings.weight.T)
    n_untied = sum(p.numel() for p in _model().parameters())
    assert n_untied - sum(p.numel() for p in m.parameters()) == 300 * 64


def test_shapes_init_and_flops():
    a = ModelArgs(vocab_size=32000, dim=768, n_layers=12, n_heads=12)
    assert a.ffn_dim == 2048 and a.ffn_dim % 256 == 0
    m = Transformer(a)
    m.init_weights()
    counted = sum(p.numel() for n, p in m.named_parameters() if not n.startswith(("tok_embeddings", "output")))
    assert counted == a.non_embedding_params()
    # MFU's N: every matmul's weights, the output head included (tied or not), counted from the
    # modules themselves
    linears = sum(mod.weight.numel() for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    assert linears == a.matmul_params() == counted - (2 * 12 + 1) * 768 + 32000 * 768
    assert a.flops_per_token(2048) == 6 * linears + 12 * 12 * 768 * 2048
    tied = ModelArgs(vocab_size=32000, dim=768, n_layers=12, n_heads=12, tie_embeddings=True)
    assert tied.matmul_params() == a.matmul_params()  # the tied head is still a matmul
    assert tied.embedding_params() == a.embedding_params() // 2 == 32000 * 768
    std_wo = m.layers[0].attention.wo.weight.std().item()
    assert 0.02 / (24**0.5) * 0.9 < std_wo < 0.02 / (24**0.5) * 1.1  # scaled init of residual projections


def test_triton_backend_without_triton_is_a_clear_error():
    from gristmill.trainer.kernels import HAVE_TRITON

    if HAVE_TRITON:
        pytest.skip("Triton is installed here")
    with pytest.raises(RuntimeError, match="kernels: reference"):
        Kernels("triton")


def test_rope_in_place_off_under_selective_checkpointing():
    """Selective checkpointing keeps the q/k/v matmul's output for its recompute, so the RoPE
    kernel must not rotate that output in place there (and does elsewhere: it saves a copy)."""
    from pathlib import Path

    from gristmill.trainer.config import load
    from gristmill.trainer.train import resolve_kernels

    configs = Path(__file__).resolve().parents[2] / "configs" / "train"
    cpu = torch.device("cpu")
    for ac, in_place in (("none", True), ("full", True), ("selective", False)):
        cfg = load(configs / "125m.yaml", [f"ac={ac}"])
        assert resolve_kernels(cfg, cpu).rope_in_place is in_place, ac
