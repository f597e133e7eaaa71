"""`pipeline` (also `gristmill`): the command line.

pipeline run CONFIG [--run-dir DIR] [--set key=value ...] [--force]
pipeline validate CONFIG [--set key=value ...]
pipeline plan CONFIG [--gb X | --files N] [--cores C] [--calibration FILE] [--json]
pipeline steps [--markdown | --json]
pipeline stats RUN_DIR [--stages] [--language LANG] [--json]
pipeline report RUN_DIR [-o report.html]
pipeline tokenizer train INPUT... --vocab-size N -o tokenizer.json
pipeline tokens inspect DIR | pipeline tokens export DIR --format bin -o out.bin
pipeline kenlm train INPUT... -o models/kenlm/en.arpa.bin
pipeline quality train --positives REF... --negatives CRAWL... -o models/quality/en.bin
pipeline calibrate --udhr UDHR.zip | --from-fineweb2 [DIR] [--base FILE] [--allow-off] -o configs/calibration/X.yaml
pipeline train CONFIG [--out DIR] [--nproc N] [--set key=value ...]
pipeline train CONFIG --plan [--gpus N] [--gpu h100|h200|...] [--set key=value ...]
pipeline export-hf CHECKPOINT OUT
pipeline eval MODEL --tasks piqa,arc_easy,... [--corpora wikitext2] --out DIR [--limit N] [--fewshot K]
pipeline eval-compare --a EVAL,EVAL --b EVAL,EVAL --tasks piqa [--metric acc]
pipeline ablate ABLATE.yaml [--plan] [--only curate|train] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gristmill import __version__
from gristmill.core.messages import ConfigError, format_bytes, os_error_line, printable, redact


def safe(value: object) -> Text:
    """Text from the crawl (hostnames, drop reasons, log lines) as inert terminal output.

    A hostname can carry ESC sequences that would recolour, retitle or clear a terminal, and
    `[...]` that rich would read as markup: control and bidi characters are shown escaped,
    and a Text object is never parsed for markup.
    """
    return Text(printable(str(value)))


def cmd_validate(args, console: Console) -> int:
    from gristmill.config import load  # all the steps' modules: only the commands that read a config

    cfg = load(args.config, args.set, args.run_dir)
    console.print(f"[green]ok[/] {args.config}: {len(cfg.specs)} steps, run_dir {cfg.run_dir}")
    for spec in cfg.specs:
        console.print(f"  {spec.step_id}: {spec.params.model_dump()}")
    return 0


def cmd_steps(args, console: Console) -> int:
    from gristmill.pipeline.report.step_reference import markdown, reference

    if args.json:
        print(json.dumps(reference(), indent=2))
    elif args.markdown:
        print(markdown(shipped_only=True), end="")
    else:
        out = Console()
        for step in reference():
            out.print(Text(f"{step['name']}", style="bold"), Text(f"({step['kind']})"))
            out.print(Text(f"  {step['summary']}"))
            for p in step["params"]:
                out.print(
                    Text(f"    {p['name']} = {p['default']}" + (f"  — {p['description']}" if p["description"] else ""))
                )
    return 0


def cmd_run(args, console: Console) -> int:
    from gristmill.config import load  # all the steps' modules: only the commands that read a config
    from gristmill.pipeline.runner import StageFailed, run

    cfg = load(args.config, args.set, args.run_dir)
    command = ["pipeline", "run", args.config, *(a for kv in args.set for a in ("--set", kv))]
    if args.run_dir:
        command += ["--run-dir", args.run_dir]
    try:
        run(cfg, force=args.force, console=console, wait=args.wait, command=command, force_lock=args.force_lock)
    except StageFailed as e:
        console.print(Text.assemble(("failed ", "red"), str(e)), soft_wrap=True)  # one line, never markup
        return 1
    return 0


def _readable(run_dir: str) -> Path:
    """A run directory to read: a local path, or a local view of one on object storage."""
    from gristmill.core import storage

    if not storage.is_url(run_dir):
        return Path(run_dir)
    from gristmill.pipeline.rundir import local_view

    return local_view(run_dir)


def cmd_stats(args, console: Console) -> int:
    from gristmill.pipeline.report.journey import (
        as_json,
        funnel,
        journey,
        language_funnel,
        language_journey,
        language_summary,
        languages,
        load_scores,
        read_run,
        top_domains,
    )

    run_dir = _readable(args.run_dir)
    if not (run_dir / "plan.json").is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no plan.json); run `pipeline run` first")
    merged = read_run(run_dir)
    scores = load_scores(run_dir)
    by_lang = language_funnel(merged, scores)
    if args.language is not None and args.language not in by_lang:
        raise ConfigError(
            f"--language {args.language!r}: no such language in {run_dir} "
            f"(its languages: {', '.join(by_lang) or 'none'})"
        )
    if args.json:
        print(json.dumps(as_json(merged, args.language), indent=2))
        return 0
    out = Console()
    out.width = max(out.width, 132)  # the funnel is wide; let it wrap in a narrow terminal
    rows = funnel(merged)
    if args.language is not None and args.stages:
        return _print_language(out, run_dir, args.language, rows, by_lang[args.language])
    if args.language is not None:
        return _print_language_journey(
            out, run_dir, args.language, journey(merged), language_journey(merged, scores)[args.language]
        )
    if args.stages:
        _print_stages(out, run_dir, rows)
    else:
        _print_journey(out, run_dir, journey(merged))
    langs = languages(merged)
    if langs:
        lt = Table(title="languages (langid, before its keep-list)")
        lt.add_column("language")
        lt.add_column("documents", justify="right")
        for lang, n in list(langs.items())[:20]:
            lt.add_row(safe(lang), f"{n:,}")
        if len(langs) > 20:
            lt.add_row(f"... {len(langs) - 20} more", f"{sum(list(langs.values())[20:]):,}")
        out.print(lt)
    summary = language_summary(by_lang)
    if summary:
        lt = Table(title="per language: read, kept at the end, dropped by step (`--language LANG` for one)")
        for col in ("language", "read", "kept", "kept %", "bytes kept", "dropped by step (most first)"):
            lt.add_column(col, justify="left" if col.startswith(("language", "dropped")) else "right")
        for line in summary[:20]:
            drops = sorted(line["drops_by_step"].items(), key=lambda kv: -kv[1])
            lt.add_row(
                safe(line["language"]),
                f"{line['read']:,}",
                f"{line['kept']:,}",
                f"{line['kept_share']:.1%}" if line["kept_share"] is not None else "-",
                format_bytes(line["bytes_kept"]),
                safe(", ".join(f"{k} {v:,}" for k, v in drops[:3])),
            )
        if len(summary) > 20:
            rest = summary[20:]
            lt.add_row(
                f"... {len(rest)} more",
                f"{sum(x['read'] for x in rest):,}",
                f"{sum(x['kept'] for x in rest):,}",
                "",
                format_bytes(sum(x["bytes_kept"] for x in rest)),
                "",
            )
        out.print(lt)
    domains = top_domains(scores)
    if domains["kept"] or domains["dropped"]:
        dt = Table(title="top domains (in the sampled documents: up to 50 kept and 50 per drop reason)")
        for col in ("kept", "samples", "dropped", "samples "):
            dt.add_column(col, justify="right" if col.startswith("samples") else "left")
        k, d = domains["kept"][:10], domains["dropped"][:10]
        for i in range(max(len(k), len(d))):
            a = k[i] if i < len(k) else ("", "")
            b = d[i] if i < len(d) else ("", "")
            dt.add_row(safe(a[0]), str(a[1]), safe(b[0]), str(b[1]))
        out.print(dt)
    for stage in merged["stages"]:
        if stage["tasks_completed"] < stage["tasks"]:
            out.print(f"[yellow]{stage['label']}: {stage['tasks_completed']}/{stage['tasks']} tasks complete[/]")
    return 0


def _share(n: int, of: int) -> str:
    return f"{n / of:.1%}" if of else "-"


def _print_journey(out: Console, run_dir: Path, rows: list) -> None:
    """The documents' journey: one row per step that decides (read, each YAML step, tokens),
    then its drops by reason."""
    from gristmill.pipeline.report.journey import journey_notes

    table = Table(
        title=f"funnel: the documents' journey, {run_dir}",
        caption="one row per step; every stage's reader, phases and writer: pipeline stats RUN_DIR --stages",
    )
    for col in ("step", "docs in", "docs out", "kept", "dropped", "bytes in", "bytes out", "time", "notes"):
        table.add_column(col, justify="left" if col in ("step", "notes") else "right")
    for r in rows:
        table.add_row(
            safe(r.step),
            f"{r.docs_in:,}",
            f"{r.docs_out:,}",
            _share(r.docs_out, r.docs_in),
            f"{r.dropped:,}",
            format_bytes(r.bytes_in),
            format_bytes(r.bytes_out),
            f"{r.time_s:.2f}s",
            safe(journey_notes(r)),
        )
    out.print(table)
    reasons = Table(title="drops by reason")
    for col in ("step", "reason", "documents", "share of step input"):
        reasons.add_column(col, justify="right" if col in ("documents", "share of step input") else "left")
    for r in rows:
        for reason, n in sorted(r.drops.items(), key=lambda kv: -kv[1]):
            reasons.add_row(safe(r.step), safe(reason), f"{n:,}", _share(n, r.docs_in))
        for key, n in r.counters.items():
            if key.startswith("skipped_"):  # records of other types: counted, never documents
                reasons.add_row(safe(r.step), safe(f"{key} (a record, not a document)"), f"{n:,}", "-")
    out.print(reasons)


def _print_stages(out: Console, run_dir: Path, rows: list) -> None:
    """`--stages`: every step of every stage (readers, writers, each phase of a global step)."""
    table = Table(title=f"funnel per stage: {run_dir}")
    for col in ("stage", "step", "docs in", "docs out", "kept", "bytes in", "bytes out", "time", "MB/s"):
        table.add_column(col, justify="left" if col in ("stage", "step") else "right")
    for r in rows:
        speed = f"{r.mb_per_s:.1f}" if r.mb_per_s else "-"
        table.add_row(
            safe(r.stage),
            safe(r.step),
            f"{r.docs_in:,}",
            f"{r.docs_out:,}",
            _share(r.docs_out, r.docs_in),
            format_bytes(r.bytes_in),
            format_bytes(r.bytes_out),
            f"{r.time_s:.2f}s",
            speed,
        )
    out.print(table)
    reasons = Table(title="drops by reason")
    for col in ("step", "reason", "documents", "share of step input"):
        reasons.add_column(col, justify="right" if col in ("documents", "share of step input") else "left")
    for r in rows:
        for reason, n in sorted(r.drops.items(), key=lambda kv: -kv[1]):
            reasons.add_row(safe(r.step), safe(reason), f"{n:,}", _share(n, r.docs_in))
    out.print(reasons)


def _print_language_journey(out: Console, run_dir: Path, lang: str, rows: list, lang_rows: list) -> int:
    """`pipeline stats RUN_DIR --language LANG`: the journey and drops by reason of one language."""
    table = Table(
        title=f"funnel of language {safe(lang)}: the documents' journey, {run_dir}",
        caption="per stage: add --stages",
    )
    for col in ("step", "docs in", "docs out", "kept", "dropped", "bytes in", "bytes out", "of all languages"):
        table.add_column(col, justify="left" if col == "step" else "right")
    for total, r in zip(rows, lang_rows):
        table.add_row(
            safe(r.step),
            f"{r.docs_in:,}",
            f"{r.docs_out:,}",
            _share(r.docs_out, r.docs_in),
            f"{sum(r.drops.values()):,}",
            format_bytes(r.bytes_in),
            format_bytes(r.bytes_out),
            _share(r.docs_in, total.docs_in),
        )
    out.print(table)
    _print_language_reasons(out, lang, lang_rows)
    return 0


def _print_language_reasons(out: Console, lang: str, lang_rows: list) -> None:
    reasons = Table(title=f"drops by reason, language {safe(lang)}")
    for col in ("step", "reason", "documents", f"share of {safe(lang)} step input"):
        reasons.add_column(col, justify="left" if col in ("step", "reason") else "right")
    for r in lang_rows:
        for reason, n in sorted(r.drops.items(), key=lambda kv: -kv[1]):
            reasons.add_row(safe(r.step), safe(reason), f"{n:,}", _share(n, r.docs_in))
    out.print(reasons)


def _print_language(out: Console, run_dir: Path, lang: str, rows: list, lang_rows: list) -> int:
    """`pipeline stats RUN_DIR --language LANG --stages`: the per-stage funnel of one language."""
    table = Table(title=f"funnel of language {safe(lang)} per stage: {run_dir}")
    for col in ("stage", "step", "docs in", "docs out", "kept", "bytes in", "bytes out", "of all languages"):
        table.add_column(col, justify="left" if col in ("stage", "step") else "right")
    for total, r in zip(rows, lang_rows):
        if not (total.docs_in or total.docs_out):  # a phase that reads no documents (dedup's find)
            continue
        table.add_row(
            safe(r.stage),
            safe(r.step),
            f"{r.docs_in:,}",
            f"{r.docs_out:,}",
            _share(r.docs_out, r.docs_in),
            format_bytes(r.bytes_in),
            format_bytes(r.bytes_out),
            _share(r.docs_in, total.docs_in),
        )
    out.print(table)
    _print_language_reasons(out, lang, lang_rows)
    return 0


def cmd_report(args, console: Console) -> int:
    from gristmill.pipeline.report.page import write

    run_dir = _readable(args.run_dir)
    if not (run_dir / "plan.json").is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no plan.json); run `pipeline run` first")
    path = write(run_dir, args.output)
    console.print(f"[green]wrote[/] {path} (open it in a browser; it needs no network)")
    return 0


def cmd_status(args, console: Console) -> int:
    from gristmill.pipeline.report.run_status import resume_command, stage_statuses

    run_dir = _readable(args.run_dir)
    if not (run_dir / "plan.json").is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no plan.json)")
    out = Console()
    statuses = stage_statuses(run_dir)
    table = Table(title=f"status: {run_dir}")
    for col in ("stage", "tasks done", "state", "slurm job", "job states"):
        table.add_column(col)
    for st in statuses:
        states = ", ".join(f"{k.lower()} {v}" for k, v in sorted(st.job_states.items()))
        table.add_row(st.label, f"{st.completed}/{st.tasks}", st.state, st.job or "-", states or "-")
    out.print(table)
    for st in statuses:
        for rank, tail in st.failed_tasks.items():
            out.print(
                f"[red]{st.label} task {rank} failed[/]; log {run_dir / st.label / 'logs' / f'task_{rank:05d}.log'}:"
            )
            out.print(safe(tail), highlight=False)
    if any(st.state != "complete" for st in statuses):
        out.print(f"resume with: {resume_command(run_dir)}", markup=False)
        return 1 if any(st.state.startswith(("failed", "cancelled")) for st in statuses) else 0
    return 0


def cmd_plan(args, console: Console) -> int:
    from gristmill.pipeline.planning.projection import gpu_column, load_calibration, plan_for_size, project, render

    if args.gb is not None and args.files is not None:
        raise ValueError("give --gb or --files, not both")
    from gristmill.config import load  # all the steps' modules: only the commands that read a config

    cfg = load(args.config, args.set, args.run_dir)
    from gristmill.core import storage

    storage.configure(cfg.storage)  # the inputs are listed with the run's own endpoint and settings
    stages, size = plan_for_size(cfg, args.gb, args.files)
    calibration = load_calibration(args.calibration)
    projections = project(cfg, stages, size / 1e9, calibration, args.cores)
    header, rows, footer = render(projections, size / 1e9, args.cores, cfg.executor.type == "slurm")
    _scratch_column(cfg, stages, header, rows, footer)
    gpu_column(stages, header, rows, footer)
    if args.json:
        print(
            json.dumps(
                {
                    "input_gb": size / 1e9,
                    "calibration": calibration.get("measured"),
                    "stages": [dict(zip(header, r)) for r in rows],
                    "notes": footer,
                },
                indent=2,
            )
        )
        return 0
    table = Table(
        title=f"{args.config}: projected from measurements of {calibration.get('measured', '?')} "
        f"({calibration.get('machine', '?')})"
    )
    for h in header:
        table.add_column(h, justify="left" if h in ("stage", "calibrated on") else "right")
    for r in rows:
        table.add_row(*r)
    out = Console(width=max(Console().width, 132))  # twelve columns: narrower terminals wrap, not squash
    out.print(table)
    for line in footer:
        out.print(safe(line))
    return 1 if any(not p.fits for p in projections) else 0


def _scratch_column(cfg, stages, header: list[str], rows: list[list[str]], footer: list[str]) -> None:
    """A run directory on object storage: what each task stages on local scratch disk."""
    from gristmill.core import storage
    from gristmill.pipeline.execution.staging import scratch_bytes

    if not storage.is_url(cfg.run_dir):
        return
    header.append("scratch/task")
    sizes = [scratch_bytes(stage) for stage in stages]
    for row, size in zip(rows, sizes):
        row.append(format_bytes(size))
    limit = f", at most {cfg.storage.scratch_gb:g} GB (storage.scratch_gb)" if cfg.storage.scratch_gb else ""
    footer.append(
        f"scratch/task: {cfg.run_dir} is on object storage; a task stages its inputs and outputs in "
        f"{storage.scratch_root(cfg.storage)}{limit}: up to {format_bytes(max(sizes, default=0))} (documents as text "
        "and what the steps hold; upper bounds)"
    )


#: the most input `pipeline plan` projects for: 10 PB of compressed WET, more than every crawl's
#: together (~100 crawls of ~10 TB). Far beyond it the memory models' arithmetic overflows.
MAX_PLAN_GB = 10_000_000


def _plan_gb(text: str) -> float:
    """`--gb`: a size above 0 and at most MAX_PLAN_GB (not nan, not inf)."""
    try:
        gb = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in GB, e.g. 150, got {text!r}") from None
    if not 0 < gb <= MAX_PLAN_GB:  # false for nan too
        raise argparse.ArgumentTypeError(
            f"expected a size in GB above 0 and at most {MAX_PLAN_GB:,} (10 PB, more than all of Common Crawl), "
            f"got {text}"
        )
    return gb


def _plan_files(text: str) -> int:
    """`--files`: at least one WET file, and no more than MAX_PLAN_GB of them."""
    from gristmill.input.sources import CC_WET_FILE_BYTES

    most = int(MAX_PLAN_GB * 1e9 // CC_WET_FILE_BYTES)
    try:
        files = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of WET files, e.g. 100, got {text!r}") from None
    if not 1 <= files <= most:
        raise argparse.ArgumentTypeError(
            f"expected between 1 and {most:,} WET files ({MAX_PLAN_GB:,} GB at ~150 MB each), got {text}"
        )
    return files


def _plan_cores(text: str) -> int:
    """`--cores`: at least one."""
    try:
        cores = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of cores, e.g. 16, got {text!r}") from None
    if cores < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 core, got {text}")
    return cores


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeline", description="Common Crawl → curated pretraining data")
    p.add_argument("--version", action="version", version=f"gristmill {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def config_args(sp):
        sp.add_argument("config", help="run configuration (YAML)")
        sp.add_argument("--run-dir", help="override run_dir")
        sp.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config key, e.g. --set executor.tasks=8 (value parsed as YAML)",
        )

    r = sub.add_parser("run", help="run a pipeline; re-running finishes what is missing")
    config_args(r)
    r.add_argument("--force", action="store_true", help="discard the run directory's earlier results and redo")
    r.add_argument("--wait", action="store_true", help="slurm: follow the submitted jobs until they end")
    r.add_argument(
        "--force-lock",
        metavar="HOLDER",
        help="a run directory on object storage: take over the lock of HOLDER (as the refusal names it), "
        "a run that died before its lease expired",
    )
    r.set_defaults(func=cmd_run)
    pl = sub.add_parser("plan", help="before running: per stage CPU-hours, memory per task, disk and wall time")
    config_args(pl)
    pl.add_argument("--gb", type=_plan_gb, help="input size: GB of compressed WET (default: the config's input)")
    pl.add_argument("--files", type=_plan_files, help="input size: this many Common Crawl WET files (~150 MB each)")
    pl.add_argument(
        "--cores", type=_plan_cores, help="cores the tasks share (default: 1 locally; every task at once on Slurm)"
    )
    pl.add_argument(
        "--calibration",
        help="measurements to project from (benchmarks/scale_run.py --write-calibration; default: the shipped ones)",
    )
    pl.add_argument("--json", action="store_true", help="machine-readable")
    pl.set_defaults(func=cmd_plan)
    v = sub.add_parser("validate", help="check a config and print the resolved steps")
    config_args(v)
    v.set_defaults(func=cmd_validate)
    sp = sub.add_parser("steps", help="every step a config may name, with its parameters and defaults")
    sp.add_argument("--markdown", action="store_true", help="the step reference of docs/steps.md")
    sp.add_argument("--json", action="store_true", help="machine-readable")
    sp.set_defaults(func=cmd_steps)
    st = sub.add_parser("status", help="per stage: tasks done, Slurm job states, failed tasks, how to resume")
    st.add_argument("run_dir")
    st.set_defaults(func=cmd_status)
    s = sub.add_parser(
        "stats", help="the funnel of a run: documents and bytes in and out of each step, drops by reason"
    )
    s.add_argument("run_dir")
    s.add_argument("--json", action="store_true", help="machine-readable output (the journey and every stage)")
    s.add_argument(
        "--stages",
        action="store_true",
        help="every step of every stage (readers, writers, each phase of dedup and tokenization) "
        "instead of one row per step",
    )
    s.add_argument(
        "--language",
        metavar="LANG",
        help="the funnel and drops by reason of one language (e.g. zh; 'unknown': documents no step labelled)",
    )
    s.set_defaults(func=cmd_stats)
    rp = sub.add_parser("report", help="a self-contained HTML report of a run: funnel, score histograms, samples")
    rp.add_argument("run_dir")
    rp.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    rp.set_defaults(func=cmd_report)
    from gristmill.tokenize.cli import add_parsers as add_token_parsers

    add_token_parsers(sub)  # tokenizer train, tokens inspect, tokens export
    from gristmill.filters.train_cli import add_classifier_parser, add_kenlm_parser, add_quality_parser

    add_kenlm_parser(sub)  # kenlm train
    add_quality_parser(sub)  # quality train
    add_classifier_parser(sub)  # train-classifier
    from gristmill.pipeline.calibration.cli import add_parser as add_calibrate_parser

    add_calibrate_parser(sub)  # calibrate
    from gristmill.trainer.cli import add_parsers as add_train_parsers

    add_train_parsers(sub)  # train, export-hf
    from gristmill.trainer.eval_cli import add_parsers as add_eval_parsers

    add_eval_parsers(sub)  # eval, eval-compare
    from gristmill.ablation.cli import add_parser as add_ablate_parser

    add_ablate_parser(sub)  # ablate
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # datatrove logs every task's INFO lines and a stats dump through loguru; the progress bar
    # and `pipeline stats` say the same more briefly. Warnings and errors still show.
    from gristmill.compat.datatrove import configure_cli_logging

    configure_cli_logging()
    console = Console(stderr=True)
    from gristmill.dirlock import LockHeld
    from gristmill.input.commoncrawl import DownloadError

    try:
        return args.func(args, console)
    # config errors (ConfigError is a ValueError), corrupt or missing models and inputs found
    # before running, a directory in use, a download that cannot succeed: nothing was run
    except (ValueError, FileNotFoundError, LockHeld, DownloadError) as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a read-only or vanished directory: one line naming the path
        print(f"error: {redact(os_error_line(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; re-run the same command to finish what is missing", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
