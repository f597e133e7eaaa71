"""`pipeline ablate ABLATE.yaml [--plan] [--only curate|train]`."""

from __future__ import annotations

import json
import sys


def cmd_ablate(args, console) -> int:
    """Exit codes: 0 done; 1 a phase failed (re-run to finish) or a variant was left out; 2 bad input."""
    from gristmill.ablation.config import load
    from gristmill.ablation.run import Ablation, AblationFailed

    cfg = load(args.config, args.set)
    if args.out:
        cfg = cfg.model_copy(update={"out": args.out})
    if args.plan:
        from gristmill.ablation.plan import make_plan, render

        plan = make_plan(cfg, gpu=args.gpu.lower(), gpus=args.gpus, calibration=args.calibration)
        if args.json:
            print(json.dumps(plan, indent=2, default=str))
        else:
            for line in render(plan, args.config):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
        return 0
    command = ["pipeline", "ablate", args.config, *(a for kv in args.set for a in ("--set", kv))]
    try:
        return Ablation(cfg, console, command=command).run(args.only)
    except AblationFailed as e:
        print(f"failed {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a curation stage's failure: the runner's one line
        from gristmill.pipeline.runner import StageFailed

        if isinstance(e, StageFailed):
            print(f"failed {e}", file=sys.stderr)
            return 1
        raise


def add_parser(sub) -> None:
    a = sub.add_parser(
        "ablate", help="curate variants of a recipe, train a proxy model on each, and compare them (docs/ablation.md)"
    )
    a.add_argument("config", help="ablation YAML (configs/ablate.yaml)")
    a.add_argument("--out", help="output folder (default: the config's out)")
    a.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of the ablation YAML"
    )
    a.add_argument(
        "--only",
        choices=["curate", "train"],
        help="curate: curation, the tokenizer and token shards only (CPU); train: training, scoring and the report"
        " on the token shards <out> already holds (a GPU machine)",
    )
    a.add_argument("--plan", action="store_true", help="CPU-hours, GPU-hours, disk and wall; runs nothing")
    a.add_argument("--gpu", default="h100", help="with --plan: h100 (default), h200, a100, a100-40gb, l40s")
    a.add_argument("--gpus", type=int, default=1, help="with --plan: GPUs per training (default 1)")
    a.add_argument("--calibration", help="with --plan: the pipeline's calibration file (default: the shipped one)")
    a.add_argument("--json", action="store_true", help="with --plan: machine-readable")
    a.set_defaults(func=cmd_ablate)
