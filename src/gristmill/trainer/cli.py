"""`pipeline train CONFIG` (`--plan`: what it needs, before any GPU is taken) and `pipeline export-hf CKPT OUT`."""

from __future__ import annotations


def cmd_train(args, console) -> int:
    """Exit codes: 0 trained, 1 training failed (re-running resumes), 2 a configuration or input
    error (nothing trained; the message above names the file or key)."""
    import sys

    if args.plan:
        return cmd_plan(args, console)
    for flag in ("gpus", "gpu", "calibration"):
        if getattr(args, flag) is not None:
            print(f"error: --{flag} goes with --plan (training uses --nproc and the visible GPUs)", file=sys.stderr)
            return 2

    from gristmill.dirlock import LockHeld
    from gristmill.trainer.launch import EXIT_INPUT, EXIT_NONFINITE, train_command

    try:
        code = train_command(args.config, args.set, args.out, args.nproc)
    except LockHeld as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if code == EXIT_INPUT:  # a rank printed the one-line error
        return 2
    if code and code != EXIT_NONFINITE:  # the non-finite message already says what a re-run does
        console.print(
            f"[red]train failed[/] (exit code {code}); re-run the same command to resume from the last"
            " intact checkpoint"
        )
    return 1 if code else 0


def cmd_plan(args, console) -> int:
    """`pipeline train CONFIG --plan`: parameters, FLOPs, memory per GPU, the largest micro-batch
    and the time, from the config alone (no GPU, no token shards needed). Exit code 2, with one
    line, for bad input or a config that does not fit."""
    import sys

    from gristmill.core.configlib import ConfigError
    from gristmill.trainer.config import load as load_config
    from gristmill.trainer.plan import does_not_fit, load_calibration, make_plan, render

    try:
        cfg = load_config(args.config, args.set)
        gpus = args.gpus if args.gpus is not None else (cfg.nproc or 1)
        calibration = load_calibration(args.calibration) if args.calibration else None
        plan = make_plan(cfg, gpus=gpus, gpu=(args.gpu or "h100").lower(), calibration=calibration)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in render(plan, args.config):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if why := does_not_fit(plan):
        print(f"error: {why}", file=sys.stderr)
        return 2
    return 0


def cmd_export_hf(args, console) -> int:
    from gristmill.trainer.export import export_hf

    out = export_hf(args.checkpoint, args.out)
    console.print(f"[green]exported[/] {out}: config.json + model.safetensors (LlamaForCausalLM)")
    return 0


def add_parsers(sub) -> None:
    t = sub.add_parser("train", help="pretrain on token shards (torchrun: one process per GPU, gloo on CPU)")
    t.add_argument("config", help="train YAML (configs/train/*.yaml) or a preset name: tiny, 125m, 350m, 1b")
    t.add_argument("--out", help="output directory (default: the config's out_dir); resumes from its checkpoints")
    t.add_argument("--nproc", type=int, help="processes (default: config nproc, visible GPUs, or 1 on CPU)")
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a train-config key, e.g. --set optim.lr=1e-3 --set data.tokens=runs/x/tokens",
    )
    t.add_argument(
        "--plan",
        action="store_true",
        help="print parameters, FLOPs per token, memory per GPU, the largest micro-batch that fits and"
        " the time for the token budget; trains nothing and needs no GPU",
    )
    t.add_argument("--gpus", type=int, help="with --plan: GPUs to plan for (default: config nproc, or 1)")
    t.add_argument("--gpu", help="with --plan: GPU kind, h100 (default), h200, a100, a100-40gb, l40s")
    t.add_argument(
        "--calibration",
        help="with --plan: measured MFU to project time from (benchmarks/train_throughput.py"
        " --write-calibration; default: the shipped src/gristmill/trainer/train_calibration.json)",
    )
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("export-hf", help="a checkpoint as a Hugging Face LlamaForCausalLM directory")
    e.add_argument("checkpoint", help="checkpoint dir (step-NNNNNNNN) or a train output dir (its latest)")
    e.add_argument("out")
    e.set_defaults(func=cmd_export_hf)
