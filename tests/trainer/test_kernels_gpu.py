"""Triton kernels against their PyTorch references on random inputs (`pytest -m gpu`).

Tolerance rule: in bf16, a kernel's error against an fp32 computation of the same op must be at
most 2× the bf16 reference's own error against that fp32 computation (plus a small absolute
floor for values that are ~0); in fp32, kernel and reference agree to 1e-5 relative (absolute:
1e-5 of the tensor's largest value).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the Triton kernels need a GPU", allow_module_level=True)

from gristmill.trainer.kernels import HAVE_TRITON  # noqa: E402
from gristmill.trainer.kernels.adamw import adamw_master_reference, adamw_master_triton  # noqa: E402
from gristmill.trainer.kernels.cross_entropy import cross_entropy_reference, fused_linear_cross_entropy  # noqa: E402
from gristmill.trainer.kernels.rms_norm import rms_norm_reference, rms_norm_triton  # noqa: E402
from gristmill.trainer.kernels.rope import rope_qkv_reference, rope_qkv_triton, rope_tables  # noqa: E402
from gristmill.trainer.kernels.swiglu import swiglu_reference, swiglu_triton  # noqa: E402

if not HAVE_TRITON:
    pytest.skip("Triton is not installed", allow_module_level=True)

DEV = "cuda"


def _run(fn, inputs, grad_out_seed=1234):
    """Output(s) and input gradients of fn for a fixed random upstream gradient."""
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator(device=DEV).manual_seed(grad_out_seed)
    grads_out = [torch.randn(o.shape, device=DEV, generator=g, dtype=torch.float32).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, grads_out)
    return [o.detach().float() for o in outs] + [x.grad.float() for x in xs if x.grad is not None]


def _check(kernel, reference, inputs_bf16):
    """kernel(bf16) vs reference(fp32 inputs) must be within 2× reference(bf16)'s error (+ floor)."""
    exact = _run(reference, [x.float() if x.is_floating_point() else x for x in inputs_bf16])
    ref = _run(reference, inputs_bf16)
    got = _run(kernel, inputs_bf16)
    assert len(exact) == len(ref) == len(got)
    for i, (e, r, k) in enumerate(zip(exact, ref, got)):
        ref_err = (r - e).abs().max().item()
        err = (k - e).abs().max().item()
        floor = 1e-3 * e.abs().max().item()
        assert err <= 2 * ref_err + floor, f"tensor {i}: kernel error {err:.3g} > 2 × reference error {ref_err:.3g}"


def _fp32_close(kernel, reference, inputs):
    # absolute floor relative to the tensor's scale: a weight gradient sums over every row, and
    # two fp32 summation orders of 1,024 rows (values ~30) differ by ~1e-5 at entries near 0
    for i, (r, k) in enumerate(zip(_run(reference, inputs), _run(kernel, inputs))):
        torch.testing.assert_close(
            k, r, rtol=1e-5, atol=1e-5 * max(1.0, r.abs().max().item()), msg=lambda m: f"tensor {i}: {m}"
        )


@pytest.mark.parametrize("shape", [(4, 256, 768), (2, 100, 2048), (3, 7, 1000)])
@pytest.mark.parametrize("residual", [False, True, "round_dx"])
def test_rms_norm(shape, residual):
    x = torch.randn(shape, device=DEV)
    w = 1 + 0.1 * torch.randn(shape[-1], device=DEV)
    r = torch.randn(shape, device=DEV)
    if residual:
        kern = lambda x, w, r: rms_norm_triton(x, w, 1e-5, r, round_dx=residual == "round_dx")  # noqa: E731
        ref = lambda x, w, r: rms_norm_reference(x, w, 1e-5, r)  # noqa: E731
        inputs = [x, w, r]
    else:
        kern = lambda x, w: rms_norm_triton(x, w, 1e-5)  # noqa: E731
        ref = lambda x, w: rms_norm_reference(x, w, 1e-5)  # noqa: E731
        inputs = [x, w]
    _fp32_close(kern, ref, inputs)
    _check(kern, ref, [t.bfloat16() for t in inputs])


@pytest.mark.parametrize("shape", [(4, 256, 2048), (2, 100, 768), (3, 7, 1000)])
def test_rms_norm_round_dx_is_the_separate_add(shape):
    """With `round_dx` the fused residual norm computes, bit for bit, what the norm without a
    residual and separate adds compute in bf16: h = x + r; dx = dr = round(norm's ∂h) + ∂h from
    upstream (what the model's fused residual relies on to change no number)."""
    x, r = (torch.randn(shape, device=DEV).bfloat16() for _ in range(2))
    w = (1 + 0.1 * torch.randn(shape[-1], device=DEV)).bfloat16()
    dy, dh = (torch.randn(shape, device=DEV).bfloat16() for _ in range(2))
    fused = [t.clone().requires_grad_() for t in (x, r, w)]
    y1, h1 = rms_norm_triton(fused[0], fused[2], 1e-5, fused[1], round_dx=True)
    torch.autograd.backward([y1, h1], [dy, dh])
    sep = [t.clone().requires_grad_() for t in (x, r, w)]
    h0 = sep[0] + sep[1]
    y0 = rms_norm_triton(h0, sep[2], 1e-5)
    torch.autograd.backward([y0, h0], [dy, dh])
    assert torch.equal(h1, h0) and torch.equal(y1, y0)
    for a, b in zip(fused, sep):
        assert torch.equal(a.grad, b.grad)
    # without round_dx the sum is rounded once: not the same numbers (else the flag does nothing)
    plain = [t.clone().requires_grad_() for t in (x, r, w)]
    torch.autograd.backward(list(rms_norm_triton(plain[0], plain[2], 1e-5, plain[1])), [dy, dh])
    assert not torch.equal(plain[0].grad, sep[0].grad)


@pytest.mark.parametrize("shape", [(4, 256, 2 * 2048), (2, 33, 2 * 5632), (5, 3, 2 * 100)])
def test_swiglu(shape):
    x = 2 * torch.randn(shape, device=DEV)
    _fp32_close(swiglu_triton, swiglu_reference, [x])
    _check(swiglu_triton, swiglu_reference, [x.bfloat16()])


@pytest.mark.parametrize(
    "B,T,H,KV,D", [(2, 256, 12, 12, 64), (1, 2048, 16, 16, 128), (3, 17, 4, 2, 32), (2, 64, 6, 1, 96)]
)
def test_rope_qkv(B, T, H, KV, D):
    qkv = torch.randn(B, T, H + 2 * KV, D, device=DEV)
    cos, sin = rope_tables(T + 5, D, 10000.0, DEV)
    kern = lambda x: rope_qkv_triton(x, cos, sin, H, KV)  # noqa: E731
    ref = lambda x: tuple(t.contiguous() for t in rope_qkv_reference(x, cos, sin, H, KV))  # noqa: E731
    _fp32_close(kern, ref, [qkv])
    _check(kern, ref, [qkv.bfloat16()])
    # forward: q and k rotated in place in the projection output, all three returned as views
    x = qkv.bfloat16()
    orig = x.clone()
    q, k, v = kern(x)
    assert q.shape == (B, T, H, D) and k.shape == v.shape == (B, T, KV, D)
    assert (q.data_ptr(), k.data_ptr(), v.data_ptr()) == tuple(t.data_ptr() for t in x.split([H, KV, KV], 2))
    torch.testing.assert_close(v, orig[:, :, H + KV :], rtol=0, atol=0)  # v passes through untouched
    rq, rk, _ = rope_qkv_reference(orig.float(), cos, sin, H, KV)
    torch.testing.assert_close(q.float(), rq, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(k.float(), rk, rtol=1e-2, atol=1e-2)
    # a non-contiguous input is copied, not modified
    wider = torch.cat([orig, orig[:, :, :1]], dim=2)
    kern(wider[:, :, :-1])
    torch.testing.assert_close(wider[:, :, :-1], orig, rtol=0, atol=0)
    # attention hands back dq, dk, dv in its (B, heads, T, D) layout: strided here
    heads_first = lambda f: lambda x: tuple(t.transpose(1, 2) for t in f(x))  # noqa: E731
    _fp32_close(heads_first(kern), heads_first(ref), [qkv])


@pytest.mark.parametrize(
    "N,d,V,z,chunk", [(1024, 256, 32000, 0.0, None), (777, 128, 50257, 1e-4, 100), (64, 64, 1000, 1e-3, 16)]
)
def test_fused_linear_cross_entropy(N, d, V, z, chunk):
    h = torch.randn(N, d, device=DEV)
    w = torch.randn(V, d, device=DEV) / d**0.5
    t = torch.randint(0, V, (N,), device=DEV)
    t[::7] = -100  # some ignored positions
    kern = lambda h, w, t: fused_linear_cross_entropy(h, w, t, z, chunk, impl="triton")  # noqa: E731
    ref = lambda h, w, t: cross_entropy_reference(h, w, t, z)  # noqa: E731
    for i, (r, k) in enumerate(zip(_run(ref, [h, w, t]), _run(kern, [h, w, t]))):
        torch.testing.assert_close(k, r, rtol=1e-4, atol=1e-5, msg=lambda m: f"tensor {i}: {m}")
    _check(kern, ref, [h.bfloat16(), w.bfloat16(), t])


def test_fused_ce_weight_grad_accumulates_in_fp32():
    """Many chunks: the fp32 accumulator keeps ∂W as accurate as one bf16 matmul over all tokens."""
    N, d, V = 8192, 128, 4096
    h, w = torch.randn(N, d, device=DEV), torch.randn(V, d, device=DEV) / d**0.5
    t = torch.randint(0, V, (N,), device=DEV)
    kern = lambda h, w, t: fused_linear_cross_entropy(h, w, t, 0.0, 64, impl="triton")  # noqa: E731
    ref = lambda h, w, t: cross_entropy_reference(h, w, t)  # noqa: E731
    _check(kern, ref, [h.bfloat16(), w.bfloat16(), t])


@pytest.mark.parametrize("ac", ["none", "full", "selective"])
def test_model_triton_matches_reference(ac):
    """Also under activation checkpointing: the in-place RoPE must not corrupt what a recompute
    reuses (selective checkpointing keeps the q/k/v matmul's output). Without checkpointing the
    Triton model hands each block's last residual add to the next norm (`fused_residual`, as the
    trainer does there); the reference keeps the separate add."""
    from gristmill.trainer.kernels import Kernels
    from gristmill.trainer.model import ModelArgs, Transformer
    from gristmill.trainer.parallel import apply_ac

    args = ModelArgs(vocab_size=1000, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=128, z_loss=1e-4)
    torch.manual_seed(0)
    ref = Transformer(args, Kernels("reference")).to(DEV)
    ref.init_weights()
    tri = Transformer(args, Kernels("triton", rope_in_place=ac != "selective", fused_residual=ac == "none")).to(DEV)
    tri.load_state_dict(ref.state_dict())
    apply_ac(tri, ac)
    x = torch.randint(0, 1000, (2, 129), device=DEV)
    losses = []
    for m in (ref, tri):
        loss = m(x[:, :-1], x[:, 1:])
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) < 1e-4
    for (n, a), b in zip(ref.named_parameters(), tri.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-5, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("n", [1, 4095, 4096 * 3 + 17, 2_000_003])
@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("low", [True, False], ids=["bf16-weight", "fp32-only"])
def test_adamw_master(n, grad_dtype, scaled, low):
    """Three steps of the master-weight AdamW kernel against torch's fused AdamW on the fp32
    master + cast: master and moments to 1e-5 relative, the bf16 weight exactly the master's
    cast; found_inf leaves all five tensors untouched. Without a bf16 weight (FSDP2's fp32
    shards) the same update on the fp32 parameter alone."""
    if not low and grad_dtype != torch.float32:
        pytest.skip("fp32 parameters come with fp32 gradients (FSDP2's reduce dtype)")
    g = torch.Generator(device=DEV).manual_seed(n)
    master = torch.randn(n, device=DEV, generator=g)
    states = []
    for _ in range(2):
        states.append(
            [
                master.clone(),
                torch.zeros_like(master),
                torch.zeros_like(master),
                master.bfloat16() if low else None,
                torch.zeros((), device=DEV),
            ]
        )
    hyper = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    for _ in range(3):
        grad = (torch.randn(n, device=DEV, generator=g) * 0.3).to(grad_dtype)
        scale = torch.rand((), device=DEV, generator=g) + 1.0 if scaled else None
        for fn, (p, m, v, w, step) in zip((adamw_master_reference, adamw_master_triton), states):
            step += 1
            # a copy each: torch's fused kernel writes the unscaled gradient back in place
            fn(p, grad.clone(), m, v, w, step, grad_scale=scale, found_inf=torch.zeros((), device=DEV), **hyper)
    (p0, m0, v0, w0, _), (p1, m1, v1, w1, _) = states
    torch.testing.assert_close(p1, p0, rtol=1e-5, atol=1e-7)
    # moments: a few ulp apart (another order of the same fp32 operations; m ~ 0.03 here)
    torch.testing.assert_close(m1, m0, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(v1, v0, rtol=1e-5, atol=1e-9)
    assert not torch.equal(p1, master)
    if low:
        assert torch.equal(w1, p1.bfloat16())
    before = [t.clone() for t in states[1] if t is not None]
    p, m, v, w, step = states[1]
    adamw_master_triton(p, grad, m, v, w, step, grad_scale=None, found_inf=torch.ones((), device=DEV), **hyper)
    assert all(torch.equal(a, b) for a, b in zip(before, [t for t in states[1] if t is not None]))


def test_adamw_triton_path_matches_torch_adamw(monkeypatch):
    """The trainer's AdamW with `triton=True` on fp32 parameters (FSDP2's shards) runs our kernel
    — once per tensor — and reaches torch's AdamW + clip_grad_norm_ over three clipped steps (to
    1e-4: the two models' GPU matmuls differ in the last bits once their weights do, and inputs
    of ×50 amplify that; a wrong update — no clipping, no bias correction — is off by > 1e-2)."""
    import gristmill.trainer.optim as optim

    calls = []
    monkeypatch.setattr(optim, "adamw_master_triton", lambda *a, **k: (calls.append(1), adamw_master_triton(*a, **k)))
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 8)).to(DEV)
    ours = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 8)).to(DEV)
    ours.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    opt_ours = optim.AdamW(ours.parameters(), triton=True, lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        x = torch.randn(32, 64, device=DEV) * 50  # large gradients: clipping is active
        for m in (ref, ours):
            m(x).square().mean().backward()
        want = torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 0.5)
        got = optim.clip_and_guard(opt_ours, 0.5)
        assert want.item() > 0.5 and got.item() == pytest.approx(want.item(), rel=1e-4)
        for opt in (opt_ref, opt_ours):
            opt.step()
            opt.zero_grad()
    assert len(calls) == 3 * 4
    for a, b in zip(ref.parameters(), ours.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
