"""The training loop. One process per device, started by torchrun (`pipeline train` does that):

    python -m torch.distributed.run --nproc-per-node N -m gristmill.trainer.train CONFIG --out DIR

Check the token shards (rank 0, unless the launcher did) → build the model on the meta device →
activation checkpointing → compile per block → FSDP2 → `to_empty` + `init_weights` → fused
AdamW → resume from the newest intact checkpoint → loop: micro-
batches with gradient accumulation (gradient sync only on the last), grad norm with clipping and
the NaN/inf guard inside the optimizer step, schedule, the previous step's readout (metrics, a
non-finite loss stops), validation, checkpoint. The host never waits for the GPU mid-loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from gristmill.core.configlib import ConfigError
from gristmill.trainer import checkpoint as ckpt
from gristmill.trainer.config import TrainConfig
from gristmill.trainer.config import load as load_config
from gristmill.trainer.data import TokenStream, TrainLoader, val_batches
from gristmill.trainer.kernels import HAVE_TRITON, Kernels
from gristmill.trainer.launch import EXIT_INPUT, EXIT_NONFINITE, PREEMPT_ENV, check_tokens
from gristmill.trainer.metrics import Metrics
from gristmill.trainer.model import ModelArgs, Transformer
from gristmill.trainer.optim import AdamW, MasterAdamW, clip_and_guard, param_groups
from gristmill.trainer.parallel import Dist, apply_ac, apply_compile, apply_fsdp, init_distributed


class NonFiniteLoss(RuntimeError):
    """Raised on every rank at once (the loss is all-reduced): rank 0 reports it."""


class InputError(ValueError):
    """Token shards or checkpoints the run cannot use. Raised on every rank from one decision
    (rank 0's check of the token directory, the collective choice of a checkpoint): rank 0
    reports it."""


def lr_lambda(cfg: TrainConfig):
    """Multiplier of the peak lr at optimizer step `s` (0-based): linear warm-up, then
    cosine to min_lr_ratio, or WSD (constant, then linear decay over the last decay_fraction)."""
    sch, total = cfg.schedule, cfg.steps
    warm, floor = sch.warmup_steps, sch.min_lr_ratio

    def f(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        if sch.type == "constant":
            return 1.0
        if sch.type == "cosine":
            progress = (s - warm) / max(1, total - warm)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        decay_start = total - max(1, round(sch.decay_fraction * total))
        if s < decay_start:
            return 1.0
        return floor + (1 - floor) * max(0.0, (total - s) / max(1, total - decay_start))

    return f


def model_args(cfg: TrainConfig, vocab_size: int) -> ModelArgs:
    m = cfg.model.model_dump()
    m.pop("doc_mask")
    m["vocab_size"] = m["vocab_size"] or vocab_size
    return ModelArgs(max_seq_len=cfg.data.seq_len, **m)


def resolve_kernels(cfg: TrainConfig, device: torch.device) -> Kernels:
    backend = cfg.kernels
    if backend == "auto":
        backend = "triton" if device.type == "cuda" and HAVE_TRITON else "reference"
    # selective checkpointing keeps matmul outputs for its recompute: RoPE must not rotate them in place
    return Kernels(backend, fused_ce=cfg.fused_ce, rope_in_place=cfg.ac != "selective")


def build(cfg: TrainConfig, d: Dist, vocab_size: int):
    args = model_args(cfg, vocab_size)
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and d.device.type == "cuda")
    use_fsdp = cfg.fsdp is True or (cfg.fsdp == "auto" and d.world > 1)
    if not use_fsdp and d.world > 1:
        raise ValueError("fsdp: false needs world size 1 (there is no other data-parallel wrapper)")
    torch.manual_seed(cfg.seed)
    kernels = resolve_kernels(cfg, d.device)
    with torch.device("meta"):
        model = Transformer(args, kernels)
    apply_ac(model, cfg.ac)
    if cfg.compile:
        apply_compile(model)
    if use_fsdp:
        apply_fsdp(model, d, torch.bfloat16 if bf16 else torch.float32, cfg.fsdp_reshard, cfg.fsdp_unit_layers)
    model.to_empty(device=d.device)
    model.init_weights(cfg.seed)
    # fused on every device (CPU runs take the GPU's code path): clipping and the non-finite
    # guard go into its kernel (optim.clip_and_guard)
    groups = param_groups(model, cfg.optim.weight_decay)
    hyper = {"lr": cfg.optim.lr, "betas": cfg.optim.betas, "eps": cfg.optim.eps}
    # bf16 without FSDP: bf16 weights + fp32 masters in the optimizer (no per-step casts), or
    # fp32 weights under autocast; FSDP's mixed precision does the former by itself
    master = bf16 and not use_fsdp and cfg.master_weights is not False
    optimizer = (MasterAdamW if master else AdamW)(groups, triton=kernels.triton and d.device.type == "cuda",
                                                   **hyper)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and not use_fsdp and not master
                else nullcontext())
    return model, args, optimizer, scheduler, autocast, use_fsdp


class StepReadout:
    """Per-step values (mean loss, grad norm, preemption flag) read on the host one step late.

    Reading a CUDA tensor right away (`.item()`) would stall the host until the GPU has
    finished the step, and the GPU would idle while the host launches the next one. Instead the
    values are copied into pinned memory behind the step's work with an event recorded after
    them; `read()` waits for that event only — by then the host has already queued the next
    step, so the GPU never runs dry. On CPU the copy is immediate.
    """

    def __init__(self, device: torch.device):
        self.host = torch.empty(3, dtype=torch.float32, pin_memory=device.type == "cuda")
        self.event = torch.cuda.Event() if device.type == "cuda" else None

    def record(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor, preempt: torch.Tensor) -> None:
        packet = torch.stack([loss_sum.float(), preempt.float(), grad_norm.float()])
        if dist.get_world_size() > 1:  # loss: mean over ranks; preemption: any rank (the norm is global)
            dist.all_reduce(packet[:2])
            packet[0] /= dist.get_world_size()
        self.host.copy_(packet, non_blocking=True)
        if self.event is not None:
            self.event.record()

    def read(self) -> tuple[float, float, bool]:
        if self.event is not None:
            self.event.synchronize()
        loss, preempt, gn = self.host.tolist()
        return loss, gn, preempt > 0


@torch.no_grad()
def evaluate(model, cfg: TrainConfig, stream: TokenStream, d: Dist, autocast) -> float | None:
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=d.device)
    for b in val_batches(stream, cfg.data.seq_len, cfg.data.micro_batch, cfg.eval.batches, d.rank, d.world,
                         d.device, cfg.model.doc_mask):
        with autocast:
            loss = model(b.inputs, b.targets, b.doc_ids)
        total += torch.stack([loss.double() * b.targets.numel(), torch.tensor(b.targets.numel(), device=d.device)])
    model.train()
    if dist.get_world_size() > 1:
        dist.all_reduce(total)
    return (total[0] / total[1]).item() if total[1] > 0 else None




def preempt_flag(device) -> torch.Tensor:
    """1 once the preemption file exists (the Slurm job's signal trap creates it), as a device
    tensor that rides along with the step's readout: every rank sees any rank's flag (a sum in
    the readout's all-reduce). A file rather than a signal: torchrun does not forward SIGUSR1
    to its workers. Only when the launcher set the variable."""
    path = os.environ.get(PREEMPT_ENV)
    return torch.full((), 1.0 if path and os.path.exists(path) else 0.0, device=device)


def open_data(cfg: TrainConfig, d: Dist, checked: bool):
    """The token directory, checked once (shards present, sha256 as `data.verify` asks, format,
    ids below the vocabulary) by rank 0 unless the launcher already did (`checked`); every rank
    learns rank 0's verdict, so a bad shard is one message and no rank starts training."""
    from gristmill.tokenize.reader import TokenShardError, open_tokens

    verdict, tokdir = None, None
    if d.is_main and not checked:
        try:
            tokdir = check_tokens(cfg)
        except (TokenShardError, ConfigError) as e:
            verdict = str(e)
    if d.world > 1:
        box = [verdict]
        dist.broadcast_object_list(box, src=0)
        verdict = box[0]
    if verdict:
        raise InputError(verdict)
    return tokdir or open_tokens(cfg.data.tokens, verify=False)


def train(cfg: TrainConfig, out_dir: Path, tokens_checked: bool = False) -> dict:
    """Runs (or resumes) training in this process; returns a summary. Needs a process group
    (torchrun's, or a one-process group created here). `tokens_checked`: the launcher has
    checked the token directory (launch.check_tokens), the ranks need not again."""
    d = init_distributed()
    out_dir.mkdir(parents=True, exist_ok=True)
    stream = TokenStream(open_data(cfg, d, tokens_checked), cfg.data.split)
    model, args, optimizer, scheduler, autocast, use_fsdp = build(cfg, d, stream.vocab_size)
    if args.vocab_size < stream.vocab_size:
        raise InputError(f"model.vocab_size {args.vocab_size} < the tokenizer's {stream.vocab_size}")
    loader = TrainLoader(stream, cfg.data.seq_len, cfg.data.global_batch, cfg.data.micro_batch, d.rank, d.world,
                         cfg.data.seed, d.device, cfg.model.doc_mask)
    val_stream = None
    if cfg.eval.batches and cfg.data.val_split in stream.tokdir.splits:
        val_stream = TokenStream(stream.tokdir, cfg.data.val_split)

    ckpt_dir = out_dir / "checkpoints"
    meta = {"config": cfg.model_dump(mode="json"), "model_args": args.to_dict(), "world_size": d.world}
    step = 0
    # the checkpoint a re-run would resume from, and how it is known to be sound
    resume_point: tuple[Path, str] | None = None
    if cfg.checkpoint.resume:
        try:
            last = ckpt.newest_intact(ckpt_dir)
        except ckpt.CheckpointError as e:
            raise InputError(str(e)) from None
        if last is not None:
            step = ckpt.load(last, model, optimizer, scheduler, loader)
            resume_point = (last, "this run started from it; its files matched their checksums")
            if d.is_main:
                print(f"resumed from {last} (step {step}, {loader.consumed} samples consumed)", flush=True)

    tokens_per_step = cfg.data.global_batch * cfg.data.seq_len
    metrics = Metrics(out_dir, d.is_main, cfg.steps, step, cfg.log.tensorboard, cfg.log.progress,
                      args.flops_per_token(cfg.data.seq_len), d.device, d.world)
    last_rec: dict = {}
    val_loss = None
    readout = StepReadout(d.device)
    pending: dict | None = None  # the step whose readout the host has not taken yet

    def take(p: dict) -> bool:
        """Logs step p's readout; raises on a non-finite loss. True if preemption was asked."""
        nonlocal last_rec
        loss_val, gn, preempted = readout.read()
        if not (math.isfinite(loss_val) and math.isfinite(gn)):
            if resume_point is None:
                where = "This run has written no checkpoint and resumed from none."
            else:
                where = f"Checkpoint kept: {resume_point[0]} ({resume_point[1]})" + (
                    "; re-running resumes from it." if cfg.checkpoint.resume else ".")
            raise NonFiniteLoss(
                f"step {p['step']}: loss {loss_val} / grad norm {gn} is not finite; the optimizer skipped the"
                f" step and training stopped. {where} If the loss diverges again from there, lower optim.lr,"
                " raise warm-up or set model.z_loss.")
        metrics.add_tokens(tokens_per_step)
        if p["step"] % cfg.log.every == 0 or p["step"] == end:
            last_rec = metrics.log_step(p["step"], loss_val, p["lr"], gn, {"epoch": p["epoch"]})
        return preempted

    started, start_step = time.perf_counter(), step
    end = min(cfg.steps, cfg.stop_after or cfg.steps)
    try:
        while step < end:
            batches = loader.next_global_batch()
            loss_sum = torch.zeros((), device=d.device)
            for i, b in enumerate(batches):
                last = i == len(batches) - 1
                if use_fsdp:
                    model.set_requires_gradient_sync(last)
                with autocast:
                    loss = model(b.inputs, b.targets, b.doc_ids) / len(batches)
                loss.backward()
                if len(batches) > 1:
                    optimizer.accumulate_grads()
                loss_sum += loss.detach()
            grad_norm = clip_and_guard(optimizer, cfg.optim.grad_clip)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
            # the previous step's readout is complete by now (this step is queued behind it)
            preempted = take(pending) if pending is not None else False
            readout.record(loss_sum, grad_norm, preempt_flag(d.device))
            pending = {"step": step, "lr": lr, "epoch": loader.epoch}
            evaluate_now = val_stream is not None and ((cfg.eval.every and step % cfg.eval.every == 0) or step == end)
            every = cfg.checkpoint.every
            periodic_save = cfg.checkpoint.enabled and bool(every) and step % every == 0
            save_now = False
            if evaluate_now or periodic_save or preempted or step == end:
                # a checkpoint only after its step's loss is known to be finite
                preempted = take(pending) or preempted
                pending = None
                save_now = cfg.checkpoint.enabled and (periodic_save or step == end or preempted)
            if evaluate_now:
                val_loss = evaluate(model, cfg, val_stream, d, autocast)
                if val_loss is not None:
                    metrics.log_eval(step, val_loss)
            if save_now:
                saved = ckpt.save(ckpt_dir, step, model, optimizer, scheduler, loader, meta, cfg.checkpoint.keep,
                                  d.is_main)
                resume_point = (saved, f"written by this run after the finite loss of step {step}")
            if preempted:
                if d.is_main:
                    print(f"preempted: checkpoint of step {step} written; re-run (or requeue) resumes", flush=True)
                break
    finally:
        metrics.close()
    summary = {"steps": step, "target_steps": cfg.steps, "trained_steps": step - start_step, "loss": last_rec.get("loss"),
               "val_loss": val_loss, "seconds": time.perf_counter() - started,
               "tokens_per_s": last_rec.get("tokens_per_s"), "mfu": last_rec.get("mfu"),
               "checkpoint": str(resume_point[0]) if d.is_main and resume_point else None}
    if d.is_main:
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        vl = f", val loss {val_loss:.4f} (ppl {math.exp(val_loss):.1f})" if val_loss is not None else ""
        print(f"trained {summary['trained_steps']} steps to step {step}: loss {summary['loss']}{vl};"
              f" checkpoint {summary['checkpoint']}", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gristmill.trainer.train")
    p.add_argument("config")
    p.add_argument("--out", help="output directory (default: the config's out_dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--tokens-checked", action="store_true",
                   help="the launcher has checked the token directory (sha256, format, ids); do not again")
    args = p.parse_args(argv)
    from gristmill.tokenize.reader import TokenShardError

    rank = int(os.environ.get("RANK", "0"))
    code = 0
    try:
        cfg = load_config(args.config, args.set)
        train(cfg, Path(args.out or cfg.out_dir), tokens_checked=args.tokens_checked)
    except (NonFiniteLoss, InputError) as e:  # the same on every rank: one line, from rank 0
        if rank == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        code = EXIT_NONFINITE if isinstance(e, NonFiniteLoss) else EXIT_INPUT
    except (TokenShardError, ckpt.CheckpointError, ConfigError) as e:  # this rank's own finding
        print(f"error: {e}", file=sys.stderr, flush=True)
        code = EXIT_INPUT
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
