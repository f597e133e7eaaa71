"""`pipeline calibrate`: the command (its arguments, the reference files read to a bound, the
table written and summed up); the calibration itself is calibrate.py, FineWeb-2's table
fineweb2_calibration.py.

Kept apart so that building the CLI's parser imports none of them: they load every filter's
module (datatrove, pandas), which every other `pipeline` command would pay for at start-up.
"""

from __future__ import annotations

import argparse
import os
import stat
import statistics
import zipfile
from pathlib import Path

from gristmill.core.configlib import LID176_LABELS, ConfigError

#: the most bytes read of one reference file (or one UDHR file in the zip), by default: a
#: threshold is a quantile, which thousands of documents give as well as millions (UDHR's
#: files are ~10 KB; WikiText-103's training text, 540 MB, would take hours of statistics)
MAX_REFERENCE_MB = 64


def _read_text(path: str, what: str, max_bytes: int) -> str:
    """A reference file's text, at most `max_bytes`; `what` names it as given (`--english FILE`)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # /dev/zero, a FIFO, a directory: never read
            raise ConfigError(f"{what}: not a regular file; give a text file")
        data = b""
        if st.st_size <= max_bytes:
            with open(path, "rb") as f:
                data = f.read(max_bytes + 1)  # a file growing since stat is bounded too
        if st.st_size > max_bytes or len(data) > max_bytes:
            raise ConfigError(
                f"{what}: over --max-reference-mb ({max_bytes >> 20} MB); give a sample of it "
                "(thousands of documents set a quantile as well as millions)"
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what}: cannot read reference text ({getattr(e, 'strerror', None) or e})") from None


def _reference_mb(text: str) -> int:
    """`--max-reference-mb`: a whole number of MB, at least 1."""
    try:
        mb = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of MB, e.g. 64, got {text!r}") from None
    if mb < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 MB, got {text}")
    return mb


def cmd_calibrate(args, console) -> int:
    from rich.table import Table
    from rich.text import Text

    from gristmill.core.files import write_text_atomic
    from gristmill.pipeline.calibration.calibrate import (
        MIN_DOCUMENTS,
        UDHR_FILES,
        Result,
        calibrate,
        calibration_table,
        chunks,
        english_refusals,
        read_udhr,
        refusal,
        rule_key,
    )
    from gristmill.pipeline.calibration.fineweb2 import cmd_from_fineweb2
    from gristmill.pipeline.calibration.rules import (
        changes_comment,
        dump_table,
        grouped_changes,
        guard_table,
        prune_defaults,
    )

    languages = [x for x in args.languages.split(",") if x] if args.languages else None
    for lang in languages or []:
        if lang not in LID176_LABELS:
            raise ConfigError(f"--languages: {lang!r} is not a lid.176 language label")
    if args.from_fineweb2 is not None:
        if args.udhr or args.reference or args.english:
            raise ConfigError(
                "--from-fineweb2 reads FineWeb-2's thresholds: give it without --udhr, --reference or --english"
            )
        return cmd_from_fineweb2(args, languages, console)
    if args.base:
        raise ConfigError("--base: only with --from-fineweb2 (the table FineWeb-2's values are merged onto)")
    max_bytes = args.max_reference_mb << 20
    texts: dict[str, str] = {}
    source: dict[str, str] = {}  # language -> where its reference came from, as given
    if args.udhr:
        udhr = Path(args.udhr)
        if not udhr.exists():
            raise ConfigError(f"--udhr {udhr}: not found (the UDHR zip, e.g. shared/data/corpus/multi/udhr2.zip)")
        if not udhr.is_file():
            raise ConfigError(f"--udhr {udhr}: not a regular file; give the UDHR zip")
        try:
            udhr_texts = read_udhr(udhr, languages, max_bytes)
        except zipfile.BadZipFile as e:
            raise ConfigError(f"--udhr {udhr}: not a zip file ({e})") from None
        if not udhr_texts:
            raise ConfigError(f"--udhr {udhr}: no UDHR text in it (udhr2/<code>.txt files, e.g. udhr2/eng.txt)")
        texts.update(udhr_texts)
        source.update({lang: f"--udhr {udhr} (udhr2/{UDHR_FILES[lang]}.txt)" for lang in udhr_texts})
    for spec in args.reference:
        lang, sep, path = spec.partition("=")
        if not sep or lang not in LID176_LABELS:
            raise ConfigError(f"--reference {spec!r}: expected LANG=FILE with a lid.176 label, e.g. zh=zh.txt")
        texts[lang] = _read_text(path, f"--reference {spec}", max_bytes)
        source[lang] = f"--reference {spec}"
    references = {lang: chunks(text) for lang, text in texts.items()}
    english = [c for path in args.english for c in chunks(_read_text(path, f"--english {path}", max_bytes))]
    if "en" in references and not args.no_udhr_english:
        english = references["en"] + english
    if not english:
        raise ConfigError("no English reference: give --udhr (its English file) or --english FILE")
    if len(english) < MIN_DOCUMENTS:
        raise ConfigError(
            f"the English reference has {len(english)} documents (blocks between blank lines); "
            f"at least {MIN_DOCUMENTS} are needed to know what share a rule removes"
        )
    for lang, docs in references.items():
        if lang != "en" and len(docs) < MIN_DOCUMENTS and source[lang].startswith("--reference"):
            raise ConfigError(
                f"{source[lang]}: {len(docs)} documents of {lang} text (blocks between blank lines); "
                f"at least {MIN_DOCUMENTS} are needed to know what share a rule removes"
            )
    if languages is not None:
        missing = sorted(set(languages) - set(references))
        if missing:
            raise ConfigError(
                f"--languages: no reference text for {', '.join(missing)} (UDHR has none: give --reference LANG=FILE)"
            )
    others = {lang: docs for lang, docs in references.items() if lang != "en"}
    if not others:
        raise ConfigError("no reference text of a language other than English: give --udhr or --reference LANG=FILE")
    results = calibrate(others, english)

    # thresholds that would switch a rule off or drop most of the reference are not written:
    # the English default stays for them, and each is named
    off_in_english = english_refusals(results)
    matched = [r for r in results if r.rule not in off_in_english]
    refused: dict[str, list[tuple[Result, str]]] = {}  # language -> (result, why)
    for r in matched:
        if (why := refusal(r, args.allow_off)) is not None:
            refused.setdefault(r.language, []).append((r, why))
    for lang, bad in sorted(refused.items()):
        # a file named for one language is refused as a whole: it is not clean text of that
        # language, or not cut into documents; of UDHR's ~150 files, one odd statistic (hr's
        # repeated 3-grams) loses only its own value, unless half of the language's are odd
        considered = sum(r.language == lang for r in matched)
        if source[lang].startswith("--reference") or 2 * len(bad) >= considered:
            shown = "; ".join(f"{rule_key(r.rule, lang)} = {r.threshold}: {why}" for r, why in bad[:3])
            more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise ConfigError(
                f"{source[lang]}: {len(bad)} of {considered} thresholds for {lang} would switch their rule off "
                f"or drop most of the reference ({shown}{more}). Is it {lang} text, documents separated by blank lines?"
            )
    dropped = {id(r) for bad in refused.values() for r, _ in bad}
    kept = [r for r in matched if id(r) not in dropped]
    table, changes = guard_table(calibration_table(kept), args.allow_off)
    table = prune_defaults(table)
    header = (
        f"# Written by `pipeline calibrate` (gristmill.pipeline.calibration): thresholds that remove the same share\n"
        f"# of each language's reference text as the English defaults remove of English reference text.\n"
        f"# Reference: {', '.join(filter(None, [args.udhr, *args.english, *args.reference]))}; "
        f"{len(english)} English documents, about {round(statistics.mean(len(v) for v in others.values()))}"
        f" per language (cut at blank lines).\n"
        f"# Use it as `calibration: {args.output}` in a run config; a step's own per_language wins.\n"
        + (
            "# Changed or left out to keep to calibration_rules.guard_table's rules:\n" + changes_comment(changes)
            if changes
            else ""
        )
        + ("# --allow-off: values that switch a rule off are kept.\n" if args.allow_off else "")
    )
    write_text_atomic(Path(args.output), header + dump_table(table))
    t = Table("rule", "English default", "share it removes", "languages: min", "median", "max", "zh", "ar")
    by_rule: dict[str, dict[str, Result]] = {}
    for r in kept:
        by_rule.setdefault(r.rule.name, {})[r.language] = r
    for name, row in by_rule.items():
        first = next(iter(row.values()))
        values = sorted(r.threshold for r in row.values())
        share = "(scaled)" if first.rule.length else f"{first.english_share:.2f}"
        t.add_row(
            name,
            str(first.default),
            share,
            f"{values[0]:g}",
            f"{statistics.median(values):g}",
            f"{values[-1]:g}",
            *[str(row[lang].threshold) if lang in row else "-" for lang in ("zh", "ar")],
        )
    console.print(t)
    for rule, why in off_in_english.items():
        console.print(Text(f"not calibrated: {rule.name}: {why}; every language keeps the default"), soft_wrap=True)
    for lang, bad in sorted(refused.items()):
        for r, why in bad:
            console.print(
                Text(
                    f"refused: {rule_key(r.rule, lang)} = {r.threshold} from {source[lang]}: {why}; "
                    f"{lang} keeps the default {r.default}"
                ),
                soft_wrap=True,
            )
    for line in grouped_changes(changes):
        console.print(Text(line), soft_wrap=True)
    n_values = sum(len(v) for step in table.values() for v in step["per_language"].values())
    calibrated = sorted({r.language for r in results})
    thin = sorted(set(references) - set(calibrated) - {"en"})
    n_refused = sum(map(len, refused.values()))
    console.print(
        f"wrote {args.output}: {len(calibrated)} languages, {n_values} values differing from the English "
        f"defaults"
        + (f"; {len(off_in_english)} rules not calibrated (above)" if off_in_english else "")
        + (f"; {n_refused} thresholds refused (above)" if n_refused else "")
        + (f"; {len(changes)} values changed or left out (above)" if changes else "")
        + (f"; not calibrated (under {MIN_DOCUMENTS} documents): {', '.join(thin)}" if thin else "")
    )
    return 0


def add_parser(sub) -> None:
    """`pipeline calibrate ...` (registered by cli.py)."""
    c = sub.add_parser(
        "calibrate",
        help="per-language thresholds of the heuristic filters from reference text "
        "(the share the English defaults remove), or from FineWeb-2's",
    )
    c.add_argument(
        "--udhr", help="the UDHR zip (udhr2.zip, one file per language), e.g. ../shared/data/corpus/multi/udhr2.zip"
    )
    c.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="LANG=FILE",
        help="reference text of a language (UTF-8, documents separated by blank lines); repeatable",
    )
    c.add_argument(
        "--english",
        action="append",
        default=[],
        metavar="FILE",
        help="more English reference text (e.g. WikiText), documents separated by blank lines",
    )
    c.add_argument("--no-udhr-english", action="store_true", help="do not use UDHR's English file as reference")
    c.add_argument("--languages", help="comma-separated lid.176 labels (default: every language with reference text)")
    c.add_argument(
        "--max-reference-mb",
        type=_reference_mb,
        default=MAX_REFERENCE_MB,
        help=f"read at most this much of each reference file (default {MAX_REFERENCE_MB}); a larger one is refused",
    )
    c.add_argument(
        "--from-fineweb2",
        nargs="?",
        const="",
        metavar="DIR",
        help="instead of reference text, FineWeb-2's per-language thresholds: its configs/ folder "
        "(default ${GRISTMILL_DATA:-../shared/data}/reference/fineweb-2/configs), its "
        "fineweb2-language-distribution.csv beside it",
    )
    c.add_argument(
        "--base",
        metavar="FILE",
        help="with --from-fineweb2: a calibration file whose values FineWeb-2's replace, key by key "
        "(its other keys and languages stay), e.g. configs/calibration/udhr.yaml",
    )
    c.add_argument(
        "--allow-off",
        action="store_true",
        help="write thresholds that switch their rule off (0, a share's bound of 1, a mean word length "
        "of 1) instead of leaving them out",
    )
    c.add_argument(
        "--output", "-o", required=True, help="calibration YAML to write, e.g. configs/calibration/udhr.yaml"
    )
    c.set_defaults(func=cmd_calibrate)
