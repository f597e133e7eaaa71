"""The training loop on CPU (gloo, fp32, FSDP2): exact resume, resume on another world size via
`pipeline train`'s torchrun launch, NaN stop, metrics, checkpoints, Hugging Face export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from rich.console import Console

from gristmill.config import ConfigError, from_dict
from gristmill.trainer import checkpoint as ckpt
from gristmill.trainer.config import load as load_config
from gristmill.trainer.train import NonFiniteLoss, lr_lambda, train

from .conftest import STEPS, two_rank_section
from .conftest import losses as _losses
from .conftest import tiny_cfg as _cfg


def test_run_writes_metrics_checkpoints_and_learns(baseline):
    recs = [json.loads(line) for line in open(baseline / "metrics.jsonl")]
    steps = [r for r in recs if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert all(r["tokens_per_s"] > 0 and r["grad_norm"] > 0 for r in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]  # the motif stream is learnable
    vals = [r for r in recs if "val_loss" in r]
    assert [r["step"] for r in vals] == [3, 6] and vals[0]["val_ppl"] > 1
    names = [p.name for _, p in ckpt.step_dirs(baseline / "checkpoints")]
    assert names == ["step-00000003", "step-00000006"]
    assert not list((baseline / "checkpoints").glob("*.tmp"))
    meta = json.loads((baseline / "checkpoints" / "step-00000006" / "meta.json").read_text())
    assert meta["step"] == 6 and meta["model_args"]["dim"] == 64


def test_resume_is_bitwise_identical(baseline, token_dir, tmp_path):
    out = tmp_path / "resumed"
    train(_cfg(token_dir, STEPS, "stop_after=3"), out)  # as if preempted after step 3
    assert ckpt.latest(out / "checkpoints").name == "step-00000003"
    train(_cfg(token_dir, STEPS), out)  # resumes from step 3
    full, resumed = _losses(baseline), _losses(out)
    assert [resumed[s] for s in range(1, STEPS + 1)] == [full[s] for s in range(1, STEPS + 1)]


def test_preempted_and_resumed_run_is_the_straight_run_bit_for_bit(baseline, token_dir, tmp_path, monkeypatch, capsys):
    """The preemption file exists from the start: step 1's flag is read with step 1's readout,
    after step 2 was queued, so the run checkpoints step 2 (between two checkpoint intervals)
    and stops. The re-run resumes from it: its metrics and its checkpoints of steps 3 and 6 are
    the uninterrupted run's, bit for bit (DCP's .metadata but for the id and directory of the save)."""
    from torch.distributed.checkpoint import FileSystemReader

    from gristmill.trainer.launch import PREEMPT_ENV

    flag = tmp_path / "PREEMPT"
    flag.touch()
    monkeypatch.setenv(PREEMPT_ENV, str(flag))
    out = tmp_path / "preempted"
    assert train(_cfg(token_dir, STEPS), out)["steps"] == 2
    assert "preempted: checkpoint of step 2 written; re-run (or requeue) resumes" in capsys.readouterr().out
    assert [p.name for _, p in ckpt.step_dirs(out / "checkpoints")] == ["step-00000002"]
    flag.unlink()
    assert train(_cfg(token_dir, STEPS), out)["steps"] == STEPS

    def records(run: Path) -> list[dict]:  # all but the timings
        timing = {"tokens_per_s", "tokens_per_s_per_device", "mfu"}
        return [{k: v for k, v in json.loads(line).items() if k not in timing} for line in open(run / "metrics.jsonl")]

    assert records(out) == records(baseline)
    names = ["step-00000003", "step-00000006"]
    assert [p.name for _, p in ckpt.step_dirs(out / "checkpoints")] == ["step-00000002", *names]
    for name in names:
        a, b = baseline / "checkpoints" / name, out / "checkpoints" / name
        assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
        for f in ("__0_0.distcp", "meta.json"):  # weights, optimizer, scheduler, loader; step and config
            assert (b / f).read_bytes() == (a / f).read_bytes(), f"{name}/{f}"
        # .metadata also holds a random id of the save and its directory (storage_meta)
        ma, mb = (FileSystemReader(str(d)).read_metadata() for d in (a, b))
        assert (mb.state_dict_metadata, mb.storage_data, mb.planner_data) == (
            ma.state_dict_metadata,
            ma.storage_data,
            ma.planner_data,
        )


def test_step_readout_is_read_one_step_late(baseline, token_dir, tmp_path):
    """The host waits for step N's loss only once step N+1 is queued, except where the step's
    loss must be known at once (validation and checkpoints every 3 steps, the last step):
    reading it earlier would leave the GPU idle while the host launches the next step."""
    from gristmill.trainer.train import TokenStream, Trainer, init_distributed, open_data

    cfg = _cfg(token_dir, STEPS)
    d = init_distributed()
    trainer = Trainer(cfg, d=d, stream=TokenStream(open_data(cfg, d, True), cfg.data.split), out_dir=tmp_path)
    events = []
    step, record, read = trainer.train_step, trainer.readout.record, trainer.readout.read

    def logged(name, fn, with_step=False):
        def call(*a, **kw):
            out = fn(*a, **kw)
            events.append(f"{name}{trainer.step}" if with_step else name)
            return out

        return call

    trainer.train_step = logged("queue", step, with_step=True)
    trainer.readout.record = logged("record", record, with_step=True)
    trainer.readout.read = logged("read", read)
    trainer.train()
    assert events == [
        "queue1",
        "record1",
        "queue2",
        "read",
        "record2",
        "queue3",
        "read",
        "record3",
        "read",
        "queue4",
        "record4",
        "queue5",
        "read",
        "record5",
        "queue6",
        "read",
        "record6",
        "read",
    ]
    assert _losses(tmp_path) == _losses(baseline)


def test_pipeline_hook_launches_torchrun_on_two_ranks_and_resumes_on_one(baseline, two_rank_run, tmp_path):
    from gristmill.trainer.launch import after_pipeline

    # no tokens yet: skipped
    assert after_pipeline(two_rank_section(), tmp_path / "no-tokens", Console(stderr=True)) is None
    trained = two_rank_run / "train"  # STEPS steps on two ranks through the hook (torchrun)
    assert json.loads((trained / "checkpoints" / "step-00000003" / "meta.json").read_text())["world_size"] == 2
    out = tmp_path / "resumed"  # the two ranks' run as if it had stopped after step 3
    shutil.copytree(trained / "checkpoints" / "step-00000003", out / "checkpoints" / "step-00000003")
    train(_cfg(two_rank_run / "tokens", STEPS, "eval.batches=0"), out)  # world size 1 now
    full, two, one = _losses(baseline), _losses(trained), _losses(out)
    assert sorted(one) == [4, 5, 6]
    mixed = {**{s: two[s] for s in (1, 2, 3)}, **one}
    for s in range(1, STEPS + 1):  # FSDP on 2 ranks sums gradients in another order: not bitwise
        assert mixed[s] == pytest.approx(full[s], rel=1e-5), s


def test_non_finite_loss_stops_and_keeps_last_checkpoint(baseline, token_dir, tmp_path, monkeypatch):
    from gristmill.trainer.model import Transformer

    out = tmp_path / "nan"
    shutil.copytree(baseline, out)
    forward = Transformer.forward

    def poisoned(self, *a, **k):
        return forward(self, *a, **k) * float("nan")

    monkeypatch.setattr(Transformer, "forward", poisoned)
    # the checkpoint is named for what is known about it: checked at resume, not "good"
    with pytest.raises(
        NonFiniteLoss,
        match=r"step 7: loss nan .*Checkpoint kept: \S*step-00000006 \(this run started"
        r" from it; its files matched their checksums\); re-running resumes",
    ):
        train(_cfg(token_dir, STEPS + 2), out)
    assert ckpt.latest(out / "checkpoints").name == "step-00000006"


def test_export_hf_logits_match(baseline, tmp_path):
    transformers = pytest.importorskip("transformers")
    from gristmill.trainer.export import export_hf, load_model

    out = export_hf(baseline, tmp_path / "hf")
    ours, _ = load_model(baseline)
    hf = transformers.LlamaForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
    x = torch.randint(0, ours.args.vocab_size, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x), rtol=1e-4, atol=1e-4)


def test_schedules():
    cfg = load_config("tiny", ["data.tokens=x", "steps=100", "schedule.warmup_steps=10", "schedule.min_lr_ratio=0.1"])
    f = lr_lambda(cfg)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(99) == pytest.approx(0.1, abs=0.01) and f(55) < 0.6
    wsd = lr_lambda(
        load_config(
            "tiny",
            [
                "data.tokens=x",
                "steps=100",
                "schedule.type=wsd",
                "schedule.warmup_steps=10",
                "schedule.decay_fraction=0.2",
            ],
        )
    )
    assert wsd(50) == 1.0 and wsd(79) == 1.0 and wsd(90) == pytest.approx(0.55) and wsd(100) == pytest.approx(0.1)


def test_presets_load_and_match_the_docs_table():
    """Every configs/train preset validates; the preset table of docs/training.md states their shapes."""
    import re

    from gristmill.trainer.config import PRESET_DIRS
    from gristmill.trainer.train import model_args

    readme = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    names = sorted(p.stem for p in PRESET_DIRS[1].glob("*.yaml"))
    assert {"tiny", "125m", "350m", "1b", "3b"} <= set(names)
    for name in names:
        args = model_args(load_config(name, ["data.tokens=x"]), 32000)
        row = re.search(rf"^\| `{name}` \| (\d+) \| (\d+) \| (\d+)[^|]*\| (\d+) \| ([\d.]+)([MB]) \|", readme, re.M)
        assert row, f"docs/training.md has no preset row for {name}"
        dim, layers, heads, ffn = (int(g) for g in row.groups()[:4])
        assert (dim, layers, heads, ffn) == (args.dim, args.n_layers, args.n_heads, args.ffn_dim), name
        stated = float(row.group(5)) * (1e6 if row.group(6) == "M" else 1e9)
        assert abs(args.non_embedding_params() - stated) / stated < 0.05, name


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"optim\.lr: .*greater than 0"):
        load_config("tiny", ["optim.lr=-1"])
    with pytest.raises(ConfigError, match=r"model\.dims: unknown key"):
        load_config("tiny", ["model.dims=3"])
    with pytest.raises(ConfigError, match="no configs/train/huge.yaml"):
        load_config("huge")
    base = {"input": {"paths": ["x"]}}
    with pytest.raises(ConfigError, match=r"train\.steps: .*greater than or equal to 1"):
        from_dict({**base, "train": {"preset": "tiny", "steps": 0}})
    assert from_dict({**base, "train": {"preset": "tiny", "steps": 5}}).train.steps == 5


def _twin_mlps(optimizer_cls):
    """Two equal small MLPs: one with torch's AdamW, one with ours (same hyper-parameters)."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    ours = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    ours.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    return ref, ours, opt_ref, optimizer_cls(ours.parameters(), lr=1e-2, weight_decay=0.1)


def test_adamw_and_clip_and_guard_match_torch_and_skip_non_finite():
    """Our AdamW (fused kernel on local tensors) with the clip coefficient as grad_scale gives
    the update of clip_grad_norm_ + torch's AdamW; its state has torch's layout (checkpoints);
    a non-finite norm leaves parameters, moments and the step count untouched."""
    from gristmill.trainer.optim import AdamW, clip_and_guard

    ref, ours, opt_ref, opt_ours = _twin_mlps(AdamW)
    for _ in range(3):
        x = torch.randn(8, 16) * 50  # large gradients: clipping is active
        for m in (ref, ours):
            m(x).square().mean().backward()
        want = torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 0.5)
        got = clip_and_guard(opt_ours, 0.5)
        assert want.item() > 0.5 and got.item() == pytest.approx(want.item(), rel=1e-6)
        for opt in (opt_ref, opt_ours):
            opt.step()
            opt.zero_grad()
        for a, b in zip(ref.parameters(), ours.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    sd_ref, sd_ours = opt_ref.state_dict(), opt_ours.state_dict()
    assert sd_ours["state"].keys() == sd_ref["state"].keys()
    for k, st in sd_ref["state"].items():
        assert st.keys() == sd_ours["state"][k].keys() and sd_ours["state"][k]["step"].item() == 3
    before = [p.detach().clone() for p in ours.parameters()]
    moments = [opt_ours.state[p]["exp_avg"].clone() for p in ours.parameters()]
    ours(torch.randn(8, 16)).square().mean().backward()
    next(ours.parameters()).grad[0, 0] = float("inf")
    assert not torch.isfinite(clip_and_guard(opt_ours, 0.5))
    opt_ours.step()
    for p, b, m in zip(ours.parameters(), before, moments):
        assert torch.equal(p, b) and torch.equal(opt_ours.state[p]["exp_avg"], m)
        assert opt_ours.state[p]["step"].item() == 3


def test_master_adamw_is_adamw_on_fp32_masters():
    """MasterAdamW on a bf16 model gives the fp32 weights that torch's AdamW reaches from the
    same (bf16) gradients; accumulation sums in fp32; the bf16 weights are the masters' cast;
    a non-finite norm skips the step; under fp32_params() the state dicts are fp32."""
    from gristmill.trainer.optim import MasterAdamW, clip_and_guard

    ref, ours, opt_ref, opt_ours = _twin_mlps(MasterAdamW)
    assert all(p.dtype == torch.bfloat16 for p in ours.parameters())
    for _ in range(3):
        fp32_sums = [torch.zeros_like(p) for p in ref.parameters()]
        for _ in range(2):  # two micro-batches
            x = (torch.randn(8, 16) * 50).bfloat16()  # large gradients: clipping is active
            ours(x).float().square().mean().backward()
            for s, p in zip(fp32_sums, ours.parameters()):
                s += p.grad.float()
            opt_ours.accumulate_grads()
            assert all(p.grad is None for p in ours.parameters())
        for p, s in zip(ref.parameters(), fp32_sums):
            p.grad = s.clone()
        want = torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 0.5)
        got = clip_and_guard(opt_ours, 0.5)
        assert want.item() > 0.5 and got.item() == pytest.approx(want.item(), rel=1e-5)
        for opt in (opt_ref, opt_ours):
            opt.step()
            opt.zero_grad()
        for a, b in zip(ref.parameters(), ours.parameters()):
            torch.testing.assert_close(opt_ours.masters[b], a.detach(), rtol=1e-5, atol=1e-6)
            assert torch.equal(b.detach(), opt_ours.masters[b].bfloat16())
    before = {p: opt_ours.masters[p].clone() for p in ours.parameters()}
    ours(torch.randn(8, 16).bfloat16()).float().square().mean().backward()
    next(ours.parameters()).grad[0, 0] = float("inf")
    assert not torch.isfinite(clip_and_guard(opt_ours, 0.5))
    opt_ours.step()
    opt_ours.zero_grad()
    for p, b in before.items():
        assert torch.equal(opt_ours.masters[p], b) and opt_ours.state[p]["step"].item() == 3
    with opt_ours.fp32_params():
        sd = ours.state_dict()
        assert all(v.dtype == torch.float32 for v in sd.values())
        assert all(
            v.dtype == torch.float32
            for st in opt_ours.state_dict()["state"].values()
            for k, v in st.items()
            if k != "step"
        )
        first = next(ours.parameters())
        first.data.fill_(0.25)  # as a checkpoint load writes into the masters
    assert first.dtype == torch.bfloat16 and torch.all(first == 0.25)
    assert torch.all(opt_ours.masters[first] == 0.25)


def test_master_weights_run_resumes_bitwise_and_checkpoints_fp32(baseline, token_dir, tmp_path):
    """bf16 on one process = bf16 weights + fp32 masters (CPU: the reference update). A run of
    N + resume + N equals 2N bitwise; its checkpoint holds fp32 weights and resumes as well
    with fp32 weights under autocast (master_weights: false); an fp32 run's checkpoint resumes
    with master weights."""
    full, out = tmp_path / "full", tmp_path / "resumed"
    train(_cfg(token_dir, STEPS, "precision=bf16"), full)
    train(_cfg(token_dir, STEPS, "precision=bf16", "stop_after=3"), out)
    train(_cfg(token_dir, STEPS, "precision=bf16"), out)
    a, b = _losses(full), _losses(out)
    assert [a[s] for s in range(1, STEPS + 1)] == [b[s] for s in range(1, STEPS + 1)]
    assert a[STEPS] < a[1]  # it learns in bf16 too
    from gristmill.trainer.export import load_model

    model, _ = load_model(full)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # the fp32 masters, not bf16 values: at least one weight is not representable in bf16
    assert any(not torch.equal(p, p.bfloat16().float()) for p in model.parameters())
    other = tmp_path / "fp32"
    shutil.copytree(full / "checkpoints" / "step-00000003", other / "checkpoints" / "step-00000003")
    train(_cfg(token_dir, STEPS, "precision=bf16", "master_weights=false"), other)
    c = _losses(other)
    assert set(c) == {4, 5, 6} and all(abs(c[s] - a[s]) < 0.05 for s in c)
    into_master = tmp_path / "into-master"
    shutil.copytree(baseline / "checkpoints" / "step-00000003", into_master / "checkpoints" / "step-00000003")
    train(_cfg(token_dir, STEPS, "precision=bf16"), into_master)
    fp32_run, d = _losses(baseline), _losses(into_master)
    assert set(d) == {4, 5, 6} and all(abs(d[s] - fp32_run[s]) < 0.05 for s in d)


def test_tokens_per_s_leave_out_validation_scoring_and_checkpoints(tmp_path, monkeypatch):
    """A logged step's tokens/s counts training time only: the time spent in `paused()` (what the
    loop wraps around validation, task scoring and saving) is not in it. A fake clock: no timing."""
    import torch

    from gristmill.trainer import metrics as m

    clock = [100.0]
    monkeypatch.setattr(m.time, "perf_counter", lambda: clock[0])
    metrics = m.Metrics(
        tmp_path, enabled=True, total_steps=10, start_step=0, tensorboard=False, progress=False,
        flops_per_token=1.0, device=torch.device("cpu"), world=1,
    )  # fmt: skip
    for _ in range(4):  # 4 steps of 1,000 tokens, 0.5 s each
        clock[0] += 0.5
        metrics.add_tokens(1000)
    assert metrics.log_step(4, 1.0, lr=1e-3, grad_norm=1.0)["tokens_per_s"] == pytest.approx(2000)
    clock[0] += 0.5
    metrics.add_tokens(1000)
    with metrics.paused():  # a scoring of 30 s after step 5
        clock[0] += 30.0
    clock[0] += 0.5
    metrics.add_tokens(1000)
    assert metrics.log_step(6, 1.0, lr=1e-3, grad_norm=1.0)["tokens_per_s"] == pytest.approx(2000)
    clock[0] += 0.25
    metrics.add_tokens(1000)
    assert metrics.log_step(7, 1.0, lr=1e-3, grad_norm=1.0)["tokens_per_s"] == pytest.approx(
        4000
    )  # a pause counts once
    metrics.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [4, 6, 7]
