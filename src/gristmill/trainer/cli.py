"""`pipeline train CONFIG` and `pipeline export-hf CKPT OUT`."""

from __future__ import annotations


def cmd_train(args, console) -> int:
    """Exit codes: 0 trained, 1 training failed (re-running resumes), 2 a configuration or input
    error (nothing trained; the message above names the file or key)."""
    import sys

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
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("export-hf", help="a checkpoint as a Hugging Face LlamaForCausalLM directory")
    e.add_argument("checkpoint", help="checkpoint dir (step-NNNNNNNN) or a train output dir (its latest)")
    e.add_argument("out")
    e.set_defaults(func=cmd_export_hf)
