"""A calibration file's thresholds against FineWeb-2's, key by key.

    python benchmarks/calibration_vs_fineweb2.py [TABLE ...] [--fineweb2 DIR] [--largest 13] [--smoke]

TABLE: calibration files (`{step: {per_language: {...}}}`); by default the one
configs/multilingual.yaml names and configs/calibration/udhr.yaml. The peer is FineWeb-2's
per-language configs (`${GRISTMILL_DATA:-../shared/data}/reference/fineweb-2/configs`), each
lid.176 label mapped to one as `pipeline calibrate --from-fineweb2` maps it
(gristmill.pipeline.calibration.fineweb2). For each threshold FineWeb-2 sets, the value a run
with the table applies (the table's, else the English default) is compared with FineWeb-2's
over the languages the table calibrates and FineWeb-2 has, and over the `--largest` of them by
FineWeb-2's text: Pearson's r, the mean absolute difference, and how many languages the table
is looser or stricter in (a `min` bound is looser when lower). Then the languages that differ
most, per key. Markdown, for docs/multilingual.md.

`--smoke`: the 20 languages FineWeb-2 holds the most text of (seconds; checks that it runs).
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import yaml

from gristmill.pipeline.calibration.fineweb2 import default_configs_dir, read_distribution, read_fineweb2
from gristmill.pipeline.calibration.rules import default_value

ROOT = Path(__file__).resolve().parents[1]

#: (label, step, param, n, kind): the thresholds FineWeb-2 sets per language
KEYS = (
    ("min_avg_word_length", "gopher_quality", "min_avg_word_length", None, "min"),
    ("max_avg_word_length", "gopher_quality", "max_avg_word_length", None, "max"),
    ("max_non_alpha_words_ratio", "gopher_quality", "max_non_alpha_words_ratio", None, "min"),
    ("min_stop_words", "gopher_quality", "min_stop_words", None, "min"),
    ("dup_line_frac", "gopher_repetition", "dup_line_frac", None, "max"),
    *((f"top_n_grams[{n}]", "gopher_repetition", "top_n_grams", n, "max") for n in (2, 3, 4)),
    *((f"dup_n_grams[{n}]", "gopher_repetition", "dup_n_grams", n, "max") for n in range(5, 11)),
)


def value(table: dict, step: str, param: str, n: int | None, lang: str):
    """What a run with `table` applies to pages of `lang`: the table's value, else the default."""
    v = table.get(step, {}).get("per_language", {}).get(lang, {}).get(param, default_value(step, param))
    return dict(map(tuple, v)).get(n) if n is not None else v


def pearson(x: list[float], y: list[float]) -> float:
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan
    return statistics.correlation(x, y)


def compare(table: dict, fw: dict, langs: list[str]) -> dict[str, dict]:
    """{key: {n, r, mad, looser, stricter, pairs}} over `langs`."""
    out = {}
    for label, step, param, n, kind in KEYS:
        pairs = []
        for lang in langs:
            ours = value(table, step, param, n, lang)
            theirs = fw[step][lang][param]
            theirs = dict(map(tuple, theirs)).get(n) if n is not None else theirs
            if ours is not None and theirs is not None:
                pairs.append((lang, float(ours), float(theirs)))
        x, y = [p[1] for p in pairs], [p[2] for p in pairs]
        looser = sum((a < b) if kind == "min" else (a > b) for _, a, b in pairs)
        stricter = sum((a > b) if kind == "min" else (a < b) for _, a, b in pairs)
        out[label] = {
            "n": len(pairs),
            "r": pearson(x, y),
            "mad": statistics.mean(abs(a - b) for a, b in zip(x, y)) if pairs else math.nan,
            "looser": looser,
            "stricter": stricter,
            "pairs": pairs,
        }
    return out


def stop_word_overlap(table: dict, fw: dict, langs: list[str]) -> float:
    """Mean share of FineWeb-2's stop words that are in the table's list for the language (its
    `stop_words`, else the stopwords-iso list gopher_quality takes by default)."""
    from gristmill.filters.gopher_quality import language_stop_words

    shares = []
    for lang in langs:
        theirs = set(fw["gopher_quality"][lang]["stop_words"])
        ours = table.get("gopher_quality", {}).get("per_language", {}).get(lang, {}).get("stop_words")
        ours = set(ours) if ours is not None else set(language_stop_words(lang) or ())
        if theirs:
            shares.append(len(theirs & ours) / len(theirs))
    return statistics.mean(shares) if shares else math.nan


def fmt(x: float, digits: int = 2) -> str:
    return "–" if math.isnan(x) else f"{x:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tables", nargs="*", type=Path, help="calibration files (default: multilingual.yaml's, udhr.yaml)")
    ap.add_argument("--fineweb2", type=Path, help=f"FineWeb-2's configs/ (default {default_configs_dir()})")
    ap.add_argument("--largest", type=int, default=13, help="the languages FineWeb-2 holds the most text of")
    ap.add_argument("--most", type=int, default=4, help="languages shown per key among those that differ most")
    ap.add_argument("--smoke", action="store_true", help="the 20 largest languages only: checks that it runs")
    args = ap.parse_args()

    configs = args.fineweb2 or default_configs_dir()
    tables = args.tables
    if not tables:
        named = yaml.safe_load((ROOT / "configs" / "multilingual.yaml").read_text())["calibration"]
        tables = list(dict.fromkeys([ROOT / named, ROOT / "configs" / "calibration" / "udhr.yaml"]))
    fw = read_fineweb2(configs)
    sizes = read_distribution(configs.parent / "fineweb2-language-distribution.csv")
    by_size = sorted(fw.mapping, key=lambda lang: -sizes.get(fw.mapping[lang], 0))
    if args.smoke:
        by_size = by_size[:20]
    largest = by_size[: args.largest]
    print(f"FineWeb-2: {configs}, {len(fw.mapping)} lid.176 languages mapped")
    print(f"{args.largest} largest (FineWeb-2's text): {', '.join(f'{x}={fw.mapping[x]}' for x in largest)}\n")

    for path in tables:
        table = yaml.safe_load(Path(path).read_text())
        calibrated = {lang for section in table.values() for lang in section["per_language"]}
        langs = [lang for lang in by_size if lang in calibrated]
        top = [lang for lang in largest if lang in calibrated]
        results = {"largest": compare(table, fw.values, top), "all": compare(table, fw.values, langs)}
        shown = Path(path).resolve().relative_to(ROOT) if Path(path).resolve().is_relative_to(ROOT) else path
        print(f"## {shown}: {len(langs)} languages it calibrates that FineWeb-2 has ({len(top)} of the largest)\n")
        print("| key | largest: r | mean abs diff | looser / stricter | all: r | mean abs diff | looser / stricter |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, *_ in KEYS:
            a, b = results["largest"][label], results["all"][label]
            print(
                f"| {label} | {fmt(a['r'])} | {fmt(a['mad'], 3)} | {a['looser']} / {a['stricter']} of {a['n']} "
                f"| {fmt(b['r'])} | {fmt(b['mad'], 3)} | {b['looser']} / {b['stricter']} of {b['n']} |"
            )
        print(
            f"| stop words: share of FineWeb-2's list in the table's | {fmt(stop_word_overlap(table, fw.values, top))} "
            f"| | | {fmt(stop_word_overlap(table, fw.values, langs))} | | |\n"
        )
        for which in ("all", "largest"):
            alpha = results[which]["max_non_alpha_words_ratio"]
            print(f"letter-share bound (max_non_alpha_words_ratio), {which}: r {fmt(alpha['r'], 3)} over {alpha['n']}")
        print()
        print("Languages that differ most (table vs FineWeb-2):\n")
        for label, *_ in KEYS:
            pairs = sorted(results["all"][label]["pairs"], key=lambda p: -abs(p[1] - p[2]))[: args.most]
            shown = ", ".join(f"{lang} {a:g} vs {b:g}" for lang, a, b in pairs if a != b)
            if shown:
                print(f"- {label}: {shown}")
        print()


if __name__ == "__main__":
    main()
