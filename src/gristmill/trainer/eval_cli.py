"""`pipeline eval MODEL --tasks piqa,arc_easy --out DIR` and `pipeline eval-compare --a ... --b ...`."""

from __future__ import annotations

from pathlib import Path


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def cmd_eval(args, console) -> int:
    """Exit codes: 0 evaluated; 2 bad input (one line naming the file, task or model)."""
    import sys

    from gristmill.core.configlib import ConfigError
    from gristmill.evaluation.tasks import TaskError, load_tasks_file, resolve_corpora, resolve_tasks
    from gristmill.trainer.eval_models import ModelError

    try:
        tasks_file = load_tasks_file(args.tasks_file)
        specs = resolve_tasks(_split(args.tasks), tasks_file, str(args.tasks_file), args.fewshot)
        corpora = resolve_corpora(_split(args.corpora), tasks_file)
        if not specs and not corpora:
            raise TaskError("nothing to evaluate: give --tasks and/or --corpora")
        from gristmill.trainer.eval_models import load
        from gristmill.trainer.evaluate import evaluate

        model = load(args.model, args.tokenizer, args.device, args.dtype)
        out = Path(args.out)
        res = evaluate(
            model,
            specs,
            corpora,
            out=out,
            limit=args.limit,
            batch_tokens=args.batch_tokens,
            corpus_tokens=args.corpus_tokens,
            say=lambda line: console.print(line, markup=False, highlight=False),
        )
    except (ConfigError, TaskError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if res["core"] is not None:
        console.print(f"CORE-style mean of centred accuracy: {res['core']:.4f}", markup=False)
    console.print(f"[green]wrote[/] {out / 'results.json'} and {out / 'items'}/")
    return 0


def cmd_compare(args, console) -> int:
    """One line per task: the difference of A from B, its 95% interval and the verdict. Exit 2
    for evaluations that cannot be compared."""
    import sys

    from gristmill.evaluation.compare import CompareError, compare

    rows = []
    try:
        for task in _split(args.tasks):
            rows.append((task, compare(_split(args.a), _split(args.b), task, args.metric, step=args.step)))
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for task, c in rows:
        seeds = f", seeds se {c.se_seeds:.4f} (df {c.df:.0f})" if c.se_seeds is not None else ""
        console.print(
            f"{task} {args.metric}: A - B = {c.diff:+.4f}, 95% [{c.ci[0]:+.4f}, {c.ci[1]:+.4f}]"
            f" (items se {c.se_items:.4f}{seeds}): {c.verdict}",
            markup=False,
            highlight=False,
        )
    return 0


def add_parsers(sub) -> None:
    e = sub.add_parser("eval", help="score a model on in-context tasks and held-out text (bits per byte)")
    e.add_argument(
        "model", help="a training output folder (its newest intact checkpoint), a checkpoint, or an HF model dir"
    )
    e.add_argument("--tasks", default="", help="comma-separated task names of --tasks-file, or JSONL task files")
    e.add_argument(
        "--corpora", default="", help="comma-separated corpus names of --tasks-file, or text files (bits per byte)"
    )
    e.add_argument("--out", required=True, help="directory for results.json and items/<task>.jsonl")
    e.add_argument("--limit", type=int, help="score only the first N items of each task")
    e.add_argument("--fewshot", type=int, help="few-shot examples for every task (default: each task's own)")
    e.add_argument("--tasks-file", default="configs/eval/tasks.yaml", help="task definitions (default %(default)s)")
    e.add_argument("--tokenizer", help="tokenizer.json (default: the checkpoint's token directory's, or the HF dir's)")
    e.add_argument("--device", default="auto", help="auto (a GPU if there is one), cpu, cuda, cuda:N")
    e.add_argument(
        "--dtype", default="auto", choices=["auto", "bf16", "fp32", "fp16"], help="auto: bf16 on GPU, fp32 on CPU"
    )
    e.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per forward (default %(default)s)")
    e.add_argument("--corpus-tokens", type=int, help="score only the first N tokens of each corpus")
    e.set_defaults(func=cmd_eval)
    c = sub.add_parser(
        "eval-compare", help="variant A against B, per item across seeds: better / worse / not distinguishable"
    )
    c.add_argument(
        "--a", required=True, help="comma-separated evaluations of A, one per seed (eval --out dirs or training dirs)"
    )
    c.add_argument("--b", required=True, help="comma-separated evaluations of B, one per seed")
    c.add_argument("--tasks", required=True, help="comma-separated task names (their items/<task>.jsonl)")
    c.add_argument("--metric", default="acc", help="acc, acc_norm, acc_bytes, or loglikelihood (language modelling)")
    c.add_argument("--step", type=int, help="training dirs: the scoring of this step (default: the newest)")
    c.set_defaults(func=cmd_compare)
