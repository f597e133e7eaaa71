"""The training loop. One process per device, started by torchrun (`pipeline train` does that):

    python -m torch.distributed.run --nproc-per-node N -m gristmill.trainer.train CONFIG --out DIR

`train()` checks the token shards (rank 0, unless the launcher did) and builds a `Trainer` once,
which owns the model, optimizer, scheduler, loader, checkpoints and metrics. Building: the model
on the meta device → (FP8 linears) → activation checkpointing → compile per block (with `ac:
full`, compile and then checkpoint) → FSDP2 → `to_empty` + `init_weights` → fused AdamW →
resume from the newest intact checkpoint.

`Trainer.train()` runs the loop; each iteration, in this order:

1. the next global batch, and `train_step()` on it: the micro-batches with gradient accumulation
   (gradient sync only on the last), grad norm with clipping and the NaN/inf guard inside the
   optimizer step, schedule;
2. the previous step's readout (`PendingReadout`: metrics; a non-finite loss stops), then this
   step's loss, grad norm and preemption flag are queued for reading one step later;
3. `after_step()`, a pure function of the step, the config and the signals (preemption, validation
   data present), says what follows: validate, checkpoint, stop. When it asks for anything, this
   step's readout is read at once (a checkpoint only after its step's loss is known to be finite;
   the readout may carry the preemption flag) and `after_step()` asked again;
4. validation, then checkpoint, then stop.

The host never waits for the GPU mid-loop: step N's readout is read after step N+1 was queued.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from gristmill.core.configlib import ConfigError
from gristmill.trainer import checkpoint as ckpt
from gristmill.trainer.config import TrainConfig
from gristmill.trainer.config import load as load_config
from gristmill.trainer.data import Batch, TokenStream, TrainLoader, val_batches
from gristmill.trainer.fp8 import apply_fp8, fp8_unavailable
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


def last_step(cfg: TrainConfig) -> int:
    """The step this run ends after: `steps`, or `stop_after` when that comes first."""
    return min(cfg.steps, cfg.stop_after or cfg.steps)


@dataclass(frozen=True)
class Signals:
    """What the decision after a step knows besides the step and the config."""

    preempted: bool = False  # some rank saw the preemption file (read with a step's readout)
    val_data: bool = True  # the token directory has the validation split
    scoring: bool = False  # eval.tasks or eval.corpora name something to score


@dataclass(frozen=True)
class Actions:
    """What the loop does after a step's update, in this order: validate, checkpoint, stop."""

    evaluate: bool = False
    score: bool = False  # eval.tasks / eval.corpora (trainer.scores)
    save: bool = False
    stop: bool = False
    reason: str | None = None  # why it stops: "preempted", "steps" (the last step) or "stop_after"

    @property
    def acts(self) -> bool:
        return self.evaluate or self.score or self.save or self.stop


def _every(step: int, interval: int) -> bool:
    return interval > 0 and step % interval == 0


def after_step(step: int, cfg: TrainConfig, signals: Signals) -> Actions:
    """What follows the update of `step` (1-based). Pure, so every rank, and a run and its resumed
    twin, decide alike: validation every `eval.every` steps and at the end; a checkpoint every
    `checkpoint.every` steps, at the end and on preemption (unless checkpoints are off); the
    end is the last step or `stop_after`; a preemption stops at once."""
    end = step >= last_step(cfg)
    if signals.preempted:
        reason = "preempted"
    elif end:
        reason = "steps" if step >= cfg.steps else "stop_after"
    else:
        reason = None
    return Actions(
        evaluate=signals.val_data and cfg.eval.batches > 0 and (end or _every(step, cfg.eval.every)),
        score=signals.scoring and (end or _every(step, cfg.eval.tasks_every)),
        save=cfg.checkpoint.enabled and (end or signals.preempted or _every(step, cfg.checkpoint.every)),
        stop=reason is not None,
        reason=reason,
    )


def model_args(cfg: TrainConfig, vocab_size: int) -> ModelArgs:
    m = cfg.model.model_dump()
    m.pop("doc_mask")
    m["vocab_size"] = m["vocab_size"] or vocab_size
    return ModelArgs(max_seq_len=cfg.data.seq_len, **m)


def resolve_kernels(cfg: TrainConfig, device: torch.device) -> Kernels:
    backend = cfg.kernels
    if backend == "auto":
        backend = "triton" if device.type == "cuda" and HAVE_TRITON else "reference"
    # selective checkpointing keeps matmul outputs for its recompute: RoPE must not rotate them in
    # place; a checkpointed block keeps its inputs, which the fused residual makes two
    return Kernels(
        backend,
        fused_ce=cfg.fused_ce,
        rope_in_place=cfg.ac != "selective",
        fused_residual=cfg.fused_residual and cfg.ac == "none",
    )


@dataclass
class Built:
    """What `build` makes: the model and what trains it."""

    model: Transformer
    args: ModelArgs
    optimizer: AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    autocast: AbstractContextManager  # torch.autocast, or nullcontext
    fsdp: bool


def build(cfg: TrainConfig, d: Dist, vocab_size: int) -> Built:
    args = model_args(cfg, vocab_size)
    fp8 = cfg.precision == "fp8"
    bf16 = cfg.precision in ("bf16", "fp8") or (cfg.precision == "auto" and d.device.type == "cuda")
    use_fsdp = cfg.fsdp is True or (cfg.fsdp == "auto" and d.world > 1)
    if not use_fsdp and d.world > 1:
        raise ValueError("fsdp: false needs world size 1 (there is no other data-parallel wrapper)")
    if fp8 and (why := fp8_unavailable(d.device)):
        raise ConfigError(why)
    torch.manual_seed(cfg.seed)
    kernels = resolve_kernels(cfg, d.device)
    with torch.device("meta"):
        model = Transformer(args, kernels)
    if fp8:
        apply_fp8(model, cfg.fp8_recipe)
    if cfg.compile and cfg.ac == "full":
        # checkpoint around each compiled block, not a compiled checkpoint (parallel.apply_ac)
        apply_compile(model)
        apply_ac(model, cfg.ac)
    else:
        apply_ac(model, cfg.ac)
        if cfg.compile:
            apply_compile(model)
    if use_fsdp:
        apply_fsdp(
            model,
            d,
            param_dtype=torch.bfloat16 if bf16 else torch.float32,
            reshard=cfg.fsdp_reshard,
            unit_layers=cfg.fsdp_unit_layers,
        )
    model.to_empty(device=d.device)
    model.init_weights(cfg.seed)
    # fused on every device (CPU runs take the GPU's code path): clipping and the non-finite
    # guard go into its kernel (optim.clip_and_guard)
    groups = param_groups(model, cfg.optim.weight_decay)
    hyper = {"lr": cfg.optim.lr, "betas": cfg.optim.betas, "eps": cfg.optim.eps}
    # bf16 without FSDP: bf16 weights + fp32 masters in the optimizer (no per-step casts), or
    # fp32 weights under autocast; FSDP's mixed precision does the former by itself
    master = bf16 and not use_fsdp and cfg.master_weights is not False
    optimizer = (MasterAdamW if master else AdamW)(groups, triton=kernels.triton and d.device.type == "cuda", **hyper)
    if master and d.device.type == "cuda" and cfg.optim.overlap_update:
        optimizer.overlap_update(model.units())
        model.before_unit = optimizer.wait_for_unit
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and not use_fsdp and not master else nullcontext()
    return Built(model=model, args=args, optimizer=optimizer, scheduler=scheduler, autocast=autocast, fsdp=use_fsdp)


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


@dataclass
class PendingReadout:
    """A step whose values `StepReadout` holds and the host has not read yet; the rest of its
    metrics record."""

    step: int
    lr: float
    epoch: float


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


class Trainer:
    """One run's model, optimizer, scheduler, loader, checkpoints and metrics, built (and resumed
    from the newest intact checkpoint) once; `train()` runs the loop and returns the summary."""

    def __init__(self, cfg: TrainConfig, *, d: Dist, stream: TokenStream, out_dir: Path):
        self.cfg, self.d, self.out_dir = cfg, d, out_dir
        built = build(cfg, d, stream.vocab_size)
        self.model, self.args, self.optimizer = built.model, built.args, built.optimizer
        self.scheduler, self.autocast, self.fsdp = built.scheduler, built.autocast, built.fsdp
        if self.args.vocab_size < stream.vocab_size:
            raise InputError(f"model.vocab_size {self.args.vocab_size} < the tokenizer's {stream.vocab_size}")
        self.loader = TrainLoader(
            stream,
            seq_len=cfg.data.seq_len,
            global_batch=cfg.data.global_batch,
            micro_batch=cfg.data.micro_batch,
            rank=d.rank,
            world=d.world,
            seed=cfg.data.seed,
            device=d.device,
            doc_mask=cfg.model.doc_mask,
        )
        self.val_stream = None
        if cfg.eval.batches and cfg.data.val_split in stream.tokdir.splits:
            self.val_stream = TokenStream(stream.tokdir, cfg.data.val_split)
        self.scoring = None
        if cfg.eval.tasks or cfg.eval.corpora:
            from gristmill.trainer.scores import TrainingEval

            try:
                self.scoring = TrainingEval(cfg, stream.tokdir, d.device)
            except (ValueError, OSError) as e:  # a task file, task name or corpus that cannot be used
                raise InputError(f"eval: {e}") from None

        self.ckpt_dir = out_dir / "checkpoints"
        self.meta = {"config": cfg.model_dump(mode="json"), "model_args": self.args.to_dict(), "world_size": d.world}
        self.step = 0
        # the checkpoint a re-run would resume from, and how it is known to be sound
        self.resume_point: tuple[Path, str] | None = None
        if cfg.checkpoint.resume:
            self._resume()

        self.end = last_step(cfg)
        self.tokens_per_step = cfg.data.global_batch * cfg.data.seq_len
        self.metrics = Metrics(
            out_dir,
            enabled=d.is_main,
            total_steps=cfg.steps,
            start_step=self.step,
            tensorboard=cfg.log.tensorboard,
            progress=cfg.log.progress,
            flops_per_token=self.args.flops_per_token(cfg.data.seq_len),
            device=d.device,
            world=d.world,
        )
        self.last_rec: dict = {}
        self.val_loss: float | None = None
        self.readout = StepReadout(d.device)
        self.pending: PendingReadout | None = None

    def _resume(self) -> None:
        try:
            last = ckpt.newest_intact(self.ckpt_dir)
        except ckpt.CheckpointError as e:
            raise InputError(str(e)) from None
        if last is not None:
            try:  # the same verdict on every rank: rank 0 reports it
                self.step = ckpt.load(
                    last,
                    model=self.model,
                    optimizer=self.optimizer,
                    scheduler=self.scheduler,
                    loader=self.loader,
                    max_step=self.cfg.steps,
                )
            except ckpt.CheckpointError as e:
                raise InputError(str(e)) from None
            self.resume_point = (last, "this run started from it; its files matched their checksums")
            if self.d.is_main:
                print(f"resumed from {last} (step {self.step}, {self.loader.consumed} samples consumed)", flush=True)

    def train_step(self, batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step on this rank's micro-batches of a global batch. Only queues device
        work: returns the summed loss and the grad norm as device tensors, and the step's lr."""
        model, optimizer, n = self.model, self.optimizer, len(batches)
        loss_sum = torch.zeros((), device=self.d.device)
        for i, b in enumerate(batches):
            if self.fsdp:
                model.set_requires_gradient_sync(i == n - 1)
            with self.autocast:
                loss = model(b.inputs, b.targets, b.doc_ids) / n
            loss.backward()
            if n > 1:
                optimizer.accumulate_grads()
            loss_sum += loss.detach()
        grad_norm = clip_and_guard(optimizer, self.cfg.optim.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        return loss_sum, grad_norm, lr

    def _queue_readout(self, step: int, loss_sum: torch.Tensor, grad_norm: torch.Tensor, lr: float) -> None:
        """Queues this step's loss, grad norm and preemption flag for reading on the host later."""
        self.readout.record(loss_sum, grad_norm, preempt_flag(self.d.device))
        self.pending = PendingReadout(step=step, lr=lr, epoch=self.loader.epoch)

    def _take_pending(self, signals: Signals) -> Signals:
        """Reads and logs the pending step's readout, if any (waits for that step on the device);
        raises on a non-finite loss. Returns `signals` with the readout's preemption flag added."""
        p, self.pending = self.pending, None
        if p is None:
            return signals
        loss_val, gn, preempted = self.readout.read()
        if not (math.isfinite(loss_val) and math.isfinite(gn)):
            if self.resume_point is None:
                where = "This run has written no checkpoint and resumed from none."
            else:
                where = f"Checkpoint kept: {self.resume_point[0]} ({self.resume_point[1]})" + (
                    "; re-running resumes from it." if self.cfg.checkpoint.resume else "."
                )
            raise NonFiniteLoss(
                f"step {p.step}: loss {loss_val} / grad norm {gn} is not finite; the optimizer skipped the"
                f" step and training stopped. {where} If the loss diverges again from there, lower optim.lr,"
                " raise warm-up or set model.z_loss."
            )
        self.metrics.add_tokens(self.tokens_per_step)
        if p.step % self.cfg.log.every == 0 or p.step == self.end:
            self.last_rec = self.metrics.log_step(p.step, loss_val, lr=p.lr, grad_norm=gn, extra={"epoch": p.epoch})
        return replace(signals, preempted=True) if preempted else signals

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean validation loss over the fixed validation windows (all ranks), None if there are none."""
        cfg, d, model = self.cfg, self.d, self.model
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=d.device)
        for b in val_batches(
            self.val_stream,
            seq_len=cfg.data.seq_len,
            micro_batch=cfg.data.micro_batch,
            batches=cfg.eval.batches,
            rank=d.rank,
            world=d.world,
            device=d.device,
            doc_mask=cfg.model.doc_mask,
        ):
            with self.autocast:
                loss = model(b.inputs, b.targets, b.doc_ids)
            total += torch.stack([loss.double() * b.targets.numel(), torch.tensor(b.targets.numel(), device=d.device)])
        model.train()
        if dist.get_world_size() > 1:
            dist.all_reduce(total)
        return (total[0] / total[1]).item() if total[1] > 0 else None

    def save(self) -> None:
        saved = ckpt.save(
            self.ckpt_dir,
            self.step,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            loader=self.loader,
            meta=self.meta,
            keep=self.cfg.checkpoint.keep,
            is_main=self.d.is_main,
        )
        self.resume_point = (saved, f"written by this run after the finite loss of step {self.step}")

    def train(self) -> dict:
        """Runs the loop to `steps` (or `stop_after`, or a preemption); returns the summary."""
        started, start_step = time.perf_counter(), self.step
        signals = Signals(val_data=self.val_stream is not None, scoring=self.scoring is not None)
        stop = self.step >= self.end  # a finished run, run again: nothing to do
        try:
            while not stop:
                batches = self.loader.next_global_batch()
                loss_sum, grad_norm, lr = self.train_step(batches)
                step = self.step
                # the previous step's readout is complete by now (this step is queued behind it)
                signals = self._take_pending(signals)
                self._queue_readout(step, loss_sum, grad_norm, lr)
                actions = after_step(step, self.cfg, signals)
                if actions.acts:
                    # act only once this step's loss is known to be finite; its readout may also
                    # carry the preemption flag, which changes what to do
                    signals = self._take_pending(signals)
                    actions = after_step(step, self.cfg, signals)
                with self.metrics.paused():  # not training time: left out of tokens/s and MFU
                    if actions.evaluate:
                        self.val_loss = self.evaluate()
                        if self.val_loss is not None:
                            self.metrics.log_eval(step, self.val_loss)
                    if actions.score:
                        out = self.out_dir if self.d.is_main else None
                        rec = self.scoring.run(self.model, self.autocast, step, out)
                        self.metrics.log_scores(step, step * self.tokens_per_step, rec)
                    if actions.save:
                        self.save()
                if actions.reason == "preempted" and self.d.is_main:
                    said = (
                        f"checkpoint of step {step} written; re-run (or requeue) resumes"
                        if actions.save
                        else f"stopped after step {step} without a checkpoint (checkpoint.enabled: false)"
                    )
                    print(f"preempted: {said}", flush=True)
                stop = actions.stop
        finally:
            self.metrics.close()
        return self._summary(started, start_step)

    def _summary(self, started: float, start_step: int) -> dict:
        step, rec, val_loss, main = self.step, self.last_rec, self.val_loss, self.d.is_main
        summary = {
            "steps": step,
            "target_steps": self.cfg.steps,
            "trained_steps": step - start_step,
            "loss": rec.get("loss"),
            "val_loss": val_loss,
            "seconds": time.perf_counter() - started,
            "tokens_per_s": rec.get("tokens_per_s"),
            "mfu": rec.get("mfu"),
            "checkpoint": str(self.resume_point[0]) if main and self.resume_point else None,
        }
        if main:
            (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            vl = f", val loss {val_loss:.4f} (ppl {math.exp(val_loss):.1f})" if val_loss is not None else ""
            print(
                f"trained {summary['trained_steps']} steps to step {step}: loss {summary['loss']}{vl};"
                f" checkpoint {summary['checkpoint']}",
                flush=True,
            )
        return summary


def train(cfg: TrainConfig, out_dir: Path, tokens_checked: bool = False) -> dict:
    """Runs (or resumes) training in this process; returns a summary. Needs a process group
    (torchrun's, or a one-process group created here). `tokens_checked`: the launcher has
    checked the token directory (launch.check_tokens), the ranks need not again."""
    d = init_distributed()
    out_dir.mkdir(parents=True, exist_ok=True)
    stream = TokenStream(open_data(cfg, d, tokens_checked), cfg.data.split)
    return Trainer(cfg, d=d, stream=stream, out_dir=out_dir).train()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gristmill.trainer.train")
    p.add_argument("config")
    p.add_argument("--out", help="output directory (default: the config's out_dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--tokens-checked",
        action="store_true",
        help="the launcher has checked the token directory (sha256, format, ids); do not again",
    )
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
