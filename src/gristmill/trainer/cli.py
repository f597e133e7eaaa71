"""`pipeline train CONFIG` and `pipeline export-hf CKPT OUT`."""

from __future__ import annotations


def cmd_train(args, console) -> int:
    from gristmill.trainer.launch import train_command

    code = train_command(args.config, args.set, args.out, args.nproc)
    if code:
        console.print(f"[red]train failed[/] (exit code {code}); re-run the same command to resume from the last"
                      " checkpoint")
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
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a train-config key, e.g. --set optim.lr=1e-3 --set data.tokens=runs/x/tokens")
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("export-hf", help="a checkpoint as a Hugging Face LlamaForCausalLM directory")
    e.add_argument("checkpoint", help="checkpoint dir (step-NNNNNNNN) or a train output dir (its latest)")
    e.add_argument("out")
    e.set_defaults(func=cmd_export_hf)
