"""`pipeline calibrate --from-fineweb2`: FineWeb-2's per-language thresholds as a calibration file.

FineWeb-2 (github huggingface/fineweb-2, Apache-2.0) publishes one YAML per language and script
(`configs/deu_Latn.yml`: ISO 639-3 code and ISO 15924 script), set with model ablations on web
text, and the datatrove pipeline that applied them (`fineweb-2-pipeline.py`). This module reads
those files from where they lie (never a copy in the repository) and writes gristmill's
`calibration:` file, `{step: {per_language: {lid.176 label: {param: value}}}}`:

* languages: each lid.176 label names one or more ISO 639-3 codes (`LID176_ISO639_3`: the
  language's own code; for a macrolanguage, the member FineWeb-2 files it under, e.g. zh ->
  cmn, et -> ekk, no -> nob, fa -> fas); of the configs with one of those codes, in any
  script, the one FineWeb-2 holds the most text of (train bytes in its
  `fineweb2-language-distribution.csv`) is the label's: sr -> srp_Cyrl, not srp_Latn;
  ms -> zsm_Latn; uz -> uzn_Cyrl (FineWeb-2 holds more Cyrillic Uzbek than Latin).
* keys: those FineWeb-2's pipeline passes per language to datatrove's Gopher and FineWeb
  quality filters, under gristmill's step of the same rule (`KEYS`); its stop-word list goes
  into `gopher_quality`'s `stop_words` (the entries that gristmill's tokenizer leaves as one
  token: the others can never match a word) with FineWeb-2's `min_stop_words` of 2; the
  FineWeb quality filter's keys go under `fineweb_quality` with datatrove's parameter names,
  with FineWeb-2's two settings for every language (`char_duplicates_ratio` 0.1 and
  `short_line_thr` off).
* not mapped (`UNMAPPED`, also in the file's header): `language_score` (a GlotLID confidence,
  which says nothing of a lid.176 score), FineWeb-2's global switch-offs of the paragraph
  rules and of `dup_line_char_frac` (set for trafilatura's output, not WET text), and the C4
  rules (FineWeb-2 runs none; `c4_lines` keeps its own values).

`calibration_rules.guard_table` then holds the result to the rules every calibration file keeps (n-gram
bounds falling with n, top-n-gram bounds at most 0.5, a letter-share bound of at least 0.5,
no value that switches a rule off unless `--allow-off`); each departure from FineWeb-2 is
listed in the file's header.
"""

from __future__ import annotations

import csv
import math
import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gristmill.config import ConfigError
from gristmill.core.files import write_text_atomic
from gristmill.core.step import registered_steps
from gristmill.pipeline.calibration.rules import (
    Change,
    changes_comment,
    comment,
    dump_table,
    grouped_changes,
    guard_table,
    prune_defaults,
)
from gristmill.text.words import split_words

__all__ = [
    "KEYS",
    "LID176_ISO639_3",
    "UNMAPPED",
    "FineWeb2",
    "as_table",
    "cmd_from_fineweb2",
    "default_configs_dir",
    "language_map",
    "merge",
    "read_fineweb2",
]

#: lid.176 label -> the ISO 639-3 codes FineWeb-2 may file the language under: its own code,
#: or for a macrolanguage its members that lid.176 has no label of its own for (ar: not arz,
#: which lid.176 labels apart). Wikipedia codes that are not ISO codes are resolved: als
#: (Alemannic) -> gsw, bh (Bihari) -> bho/mag, sh (Serbo-Croatian) -> hbs's members, nah
#: (Nahuatl, a collective code) -> the Nahuatl languages, eml (Emilian-Romagnol) -> egl/rgn,
#: of which FineWeb-2 has none. English keeps the defaults (FineWeb-2 has no English config).
LID176_ISO639_3: dict[str, tuple[str, ...]] = {
    "af": ("afr",), "als": ("gsw",), "am": ("amh",), "an": ("arg",),
    "ar": ("arb", "ary", "apc", "acm", "aeb", "ajp", "acq", "ayl", "ars"), "arz": ("arz",),
    "as": ("asm",), "ast": ("ast",), "av": ("ava",), "az": ("azj", "aze"), "azb": ("azb",),
    "ba": ("bak",), "bar": ("bar",), "bcl": ("bcl",), "be": ("bel",), "bg": ("bul",),
    "bh": ("bho", "mag"), "bn": ("ben",), "bo": ("bod",), "bpy": ("bpy",), "br": ("bre",),
    "bs": ("bos",), "bxr": ("bxr",), "ca": ("cat",), "cbk": ("cbk",), "ce": ("che",),
    "ceb": ("ceb",), "ckb": ("ckb",), "co": ("cos",), "cs": ("ces",), "cv": ("chv",),
    "cy": ("cym",), "da": ("dan",), "de": ("deu",), "diq": ("diq", "kiu"), "dsb": ("dsb",),
    "dty": ("dty",), "dv": ("div",), "el": ("ell",), "eml": ("egl", "rgn"), "en": (),
    "eo": ("epo",), "es": ("spa",), "et": ("ekk", "est"), "eu": ("eus",),
    "fa": ("fas", "pes", "prs"), "fi": ("fin",), "fr": ("fra",), "frr": ("frr",),
    "fy": ("fry",), "ga": ("gle",), "gd": ("gla",), "gl": ("glg",), "gn": ("gug", "grn"),
    "gom": ("gom",), "gu": ("guj",), "gv": ("glv",), "he": ("heb",), "hi": ("hin",),
    "hif": ("hif",), "hr": ("hrv",), "hsb": ("hsb",), "ht": ("hat",), "hu": ("hun",),
    "hy": ("hye",), "ia": ("ina",), "id": ("ind",), "ie": ("ile",), "ilo": ("ilo",),
    "io": ("ido",), "is": ("isl",), "it": ("ita",), "ja": ("jpn",), "jbo": ("jbo",),
    "jv": ("jav",), "ka": ("kat",), "kk": ("kaz",), "km": ("khm",), "kn": ("kan",),
    "ko": ("kor",), "krc": ("krc",), "ku": ("kmr", "kur"), "kv": ("kpv", "kom"), "kw": ("cor",),
    "ky": ("kir",), "la": ("lat",), "lb": ("ltz",), "lez": ("lez",), "li": ("lim",),
    "lmo": ("lmo",), "lo": ("lao",), "lrc": ("lrc",), "lt": ("lit",), "lv": ("lvs", "lav"),
    "mai": ("mai",), "mg": ("plt", "mlg"), "mhr": ("mhr",), "min": ("min",), "mk": ("mkd",),
    "ml": ("mal",), "mn": ("khk", "mon"), "mr": ("mar",), "mrj": ("mrj",), "ms": ("zsm", "msa"),
    "mt": ("mlt",), "mwl": ("mwl",), "my": ("mya",), "myv": ("myv",), "mzn": ("mzn",),
    "nah": ("nah", "nhe", "nhw", "nch", "ngu", "nhi", "azz", "nci"), "nap": ("nap",),
    "nds": ("nds",), "ne": ("npi", "nep"), "new": ("new",), "nl": ("nld",), "nn": ("nno",),
    "no": ("nob", "nor"), "oc": ("oci",), "or": ("ory", "ori"), "os": ("oss",), "pa": ("pan",),
    "pam": ("pam",), "pfl": ("pfl",), "pl": ("pol",), "pms": ("pms",), "pnb": ("pnb",),
    "ps": ("pbt", "pbu", "pst", "pus"), "pt": ("por",), "qu": ("quz", "quy", "que"),
    "rm": ("roh",), "ro": ("ron",), "ru": ("rus",), "rue": ("rue",), "sa": ("san",),
    "sah": ("sah",), "sc": ("srd", "sro", "src", "sdc", "sdn"), "scn": ("scn",), "sco": ("sco",),
    "sd": ("snd",), "sh": ("hbs", "hrv", "bos", "srp", "cnr"), "si": ("sin",), "sk": ("slk",),
    "sl": ("slv",), "so": ("som",), "sq": ("als", "aln", "sqi"), "sr": ("srp",), "su": ("sun",),
    "sv": ("swe",), "sw": ("swh", "swc", "swa"), "ta": ("tam",), "te": ("tel",), "tg": ("tgk",),
    "th": ("tha",), "tk": ("tuk",), "tl": ("fil", "tgl"), "tr": ("tur",), "tt": ("tat",),
    "tyv": ("tyv",), "ug": ("uig",), "uk": ("ukr",), "ur": ("urd",), "uz": ("uzn", "uzs", "uzb"),
    "vec": ("vec",), "vep": ("vep",), "vi": ("vie",), "vls": ("vls",), "vo": ("vol",),
    "wa": ("wln",), "war": ("war",), "wuu": ("wuu",), "xal": ("xal",), "xmf": ("xmf",),
    "yi": ("ydd", "yid"), "yo": ("yor",), "yue": ("yue",), "zh": ("cmn", "zho"),
}  # fmt: skip

#: FineWeb-2 config key -> (gristmill step, parameter): what its pipeline passes per language
KEYS: dict[str, tuple[str, str]] = {
    "min_avg_word_length": ("gopher_quality", "min_avg_word_length"),
    "max_avg_word_length": ("gopher_quality", "max_avg_word_length"),
    "max_non_alpha_words_ratio": ("gopher_quality", "max_non_alpha_words_ratio"),
    "stopwords": ("gopher_quality", "stop_words"),
    "dup_line_frac": ("gopher_repetition", "dup_line_frac"),
    "top_n_grams": ("gopher_repetition", "top_n_grams"),
    "dup_n_grams": ("gopher_repetition", "dup_n_grams"),
    "line_punct_thr": ("fineweb_quality", "line_punct_thr"),
    "new_line_ratio": ("fineweb_quality", "new_line_ratio"),
}

#: what FineWeb-2's pipeline sets alike for every language, besides its config files
GLOBAL: dict[str, dict[str, float | int]] = {
    "gopher_quality": {"min_stop_words": 2},  # gristmill's default too
    # "we removed short_line_thr and changed char_dup_ratio from 0.01 to 0.1" (its README):
    # short_line_thr=999 there; 1.0 here, the lowest bound a share never exceeds
    "fineweb_quality": {"char_duplicates_ratio": 0.1, "short_line_thr": 1.0},
}

#: what FineWeb-2 sets that the file does not carry, and why (the file's header lists them)
UNMAPPED: tuple[tuple[str, str], ...] = (
    (
        "language_score",
        "a GlotLID confidence (FineWeb-2's minimum per language, 0.3 to 0.9); lid.176's scores "
        "are another model's, on other labels, and no page set scored by both is at hand to "
        "map one onto the other: langid's min_score stays the run config's",
    ),
    (
        "dup_para_frac, dup_para_char_frac = 0",
        "FineWeb-2 switches the paragraph rules off for every language because trafilatura "
        "keeps no paragraphs; WET text has them, and gristmill's defaults stay",
    ),
    (
        "dup_line_char_frac = 0",
        "switched off by FineWeb-2 for every language in favour of the FineWeb quality filter's "
        "char_duplicates_ratio (0.1); gopher_repetition keeps it, so a run without "
        "fineweb_quality keeps a bound on repeated line characters",
    ),
    (
        "C4 filters",
        "FineWeb-2 runs none ('they seemed to degrade performance'); c4_lines keeps its values",
    ),
    (
        "line_punct_exclude_zero, short_line_length",
        "not set by FineWeb-2 (datatrove's defaults, False and 30, apply)",
    ),
)

_MAX_CONFIG_BYTES = 1 << 20  # a FineWeb-2 config is ~1 KB: a larger file is not one


def default_configs_dir() -> Path:
    """`${GRISTMILL_DATA:-../shared/data}/reference/fineweb-2/configs`."""
    return Path(os.environ.get("GRISTMILL_DATA") or "../shared/data") / "reference" / "fineweb-2" / "configs"


def _read_small(path: Path, what: str, limit: int) -> str:
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what}: {path}: not a regular file")
        if st.st_size > limit:
            raise ConfigError(f"{what}: {path}: {st.st_size} bytes, more than any FineWeb-2 file ({limit} at most)")
        with open(path, "rb") as f:
            return f.read(limit + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what}: {path}: cannot read ({getattr(e, 'strerror', None) or e})") from None


def read_distribution(path: Path) -> dict[str, int]:
    """{config name (`deu_Latn`): bytes of its train split} from `fineweb2-language-distribution.csv`."""
    text = _read_small(path, "--from-fineweb2", 64 << 20)
    sizes: dict[str, int] = {}
    for i, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            if row["split"] == "train" and not row["subset"].endswith("_removed"):
                sizes[row["subset"]] = int(row["utf8_bytes"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(
                f"--from-fineweb2: {path}: line {i}: expected columns subset, split and utf8_bytes (a number)"
            ) from None
    if not sizes:
        raise ConfigError(f"--from-fineweb2: {path}: no train split of any language in it")
    return sizes


def language_map(names: list[str], sizes: dict[str, int]) -> dict[str, str]:
    """{lid.176 label: FineWeb-2 config name}: of the configs whose ISO 639-3 code is one of the
    label's (`LID176_ISO639_3`), the one with the most train bytes (ties: by name)."""
    by_code: dict[str, list[str]] = {}
    for name in names:
        by_code.setdefault(name.split("_")[0], []).append(name)
    out = {}
    for label, codes in LID176_ISO639_3.items():
        candidates = [n for code in codes for n in by_code.get(code, [])]
        if candidates:
            out[label] = min(candidates, key=lambda n: (-sizes.get(n, 0), n))
    return out


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    return value


def _pairs(value, where: str) -> list[list]:
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
        raise ConfigError(f"{where}: expected a list of [n, fraction] pairs, got {value!r}")
    out = []
    for i, (n, v) in enumerate(value):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{where}[{i}]: expected an n of at least 1, got {n!r}")
        out.append([n, _number(v, f"{where}[{i}]")])
    return out


@dataclass
class FineWeb2:
    """FineWeb-2's thresholds for the lid.176 labels: `values` holds, per step and language,
    every parameter FineWeb-2 sets (also where it equals gristmill's default, so that a merge
    onto another table replaces that table's value)."""

    configs_dir: Path
    mapping: dict[str, str]  # lid.176 label -> config name
    values: dict[str, dict[str, dict]] = field(default_factory=dict)  # step -> lang -> param -> value
    #: (lang, entries left out of its stop-word list: gristmill's tokenizer splits them, so they never match)
    split_stop_words: list[tuple[str, list[str]]] = field(default_factory=list)
    #: (step, lang, param, FineWeb-2's value) of its negative values, FineWeb-2's off-switch, written as 0
    negative: list[tuple[str, str, str, float]] = field(default_factory=list)
    unmapped_labels: list[str] = field(default_factory=list)  # lid.176 labels FineWeb-2 has no config for


def read_fineweb2(configs_dir: Path, distribution: Path | None = None, languages: list[str] | None = None) -> FineWeb2:
    """FineWeb-2's configs for every lid.176 label (or those asked) but English."""
    configs_dir = Path(configs_dir)
    if not configs_dir.is_dir():
        raise ConfigError(
            f"--from-fineweb2 {configs_dir}: not a directory (FineWeb-2's configs/, e.g. {default_configs_dir()})"
        )
    distribution = distribution or configs_dir.parent / "fineweb2-language-distribution.csv"
    if not distribution.is_file():
        raise ConfigError(
            f"--from-fineweb2 {configs_dir}: {distribution} not found (FineWeb-2's language distribution, "
            "which picks a language's script and member language by the text FineWeb-2 holds)"
        )
    names = sorted(p.stem for p in configs_dir.glob("*.yml"))
    if not names:
        raise ConfigError(f"--from-fineweb2 {configs_dir}: no FineWeb-2 config (*.yml) in it")
    mapping = language_map(names, read_distribution(distribution))
    wanted = [x for x in LID176_ISO639_3 if x != "en"] if languages is None else languages
    out = FineWeb2(configs_dir, {}, unmapped_labels=sorted(x for x in wanted if x not in mapping and x != "en"))
    for label in sorted(wanted):
        if label == "en" or label not in mapping:
            continue
        name = mapping[label]
        out.mapping[label] = name
        path = configs_dir / f"{name}.yml"
        try:
            cfg = yaml.safe_load(_read_small(path, "--from-fineweb2", _MAX_CONFIG_BYTES))
        except yaml.YAMLError as e:
            raise ConfigError(f"--from-fineweb2: {path}: not valid YAML: {e}") from None
        if not isinstance(cfg, dict):
            raise ConfigError(f"--from-fineweb2: {path}: expected a mapping of thresholds, got {cfg!r}")
        missing = sorted(set(KEYS) - set(cfg))
        if missing:
            raise ConfigError(f"--from-fineweb2: {path}: no {', '.join(missing)} (a FineWeb-2 config has each)")
        for key, (step, param) in KEYS.items():
            where = f"--from-fineweb2: {path}: {key}"
            value = cfg[key]
            if key == "stopwords":
                if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
                    raise ConfigError(f"{where}: expected a list of words, got {value!r}")
                kept = [w for w in value if split_words(w, label) == [w]]
                if len(kept) < len(value):
                    out.split_stop_words.append((label, [w for w in value if w not in kept]))
                value = kept
            elif key.endswith("_n_grams"):
                value = _pairs(value, where)
            else:
                value = _number(value, where)
                if value == -1:  # FineWeb-2's -1: `ratio < -1` never holds, its way to switch a rule off
                    out.negative.append((step, label, param, value))
                    value = 0
                elif value < 0:  # no threshold, and not FineWeb-2's off-switch: a damaged config
                    raise ConfigError(f"{where}: {value:g} is no threshold (FineWeb-2 writes -1 to switch a rule off)")
            out.values.setdefault(step, {}).setdefault(label, {})[param] = value
        for step, params in GLOBAL.items():
            out.values.setdefault(step, {}).setdefault(label, {}).update(params)
    return out


def as_table(fw: FineWeb2) -> dict:
    """`{step: {per_language: {lang: {param: value}}}}` of every value FineWeb-2 sets."""
    return {
        step: {"per_language": {lang: dict(params) for lang, params in langs.items()}}
        for step, langs in fw.values.items()
    }


def merge(base: dict, overlay: dict) -> dict:
    """`base` (a calibration table) with each value of `overlay` replacing base's, per step,
    language and parameter; base's other values, and its languages not in overlay, stay."""
    out: dict = {}
    for table in (base, overlay):
        for step, section in table.items():
            per = out.setdefault(step, {"per_language": {}})["per_language"]
            for lang, params in section["per_language"].items():
                per.setdefault(lang, {}).update(params)
    return out


def read_table(path: str) -> dict:
    """A calibration file (`--base`): `{step: {per_language: {lang: {param: value}}}}`."""
    try:
        table = yaml.safe_load(_read_small(Path(path), "--base", 64 << 20))
    except yaml.YAMLError as e:
        raise ConfigError(f"--base {path}: not valid YAML: {e}") from None
    if not isinstance(table, dict) or not all(
        isinstance(section, dict)
        and set(section) == {"per_language"}
        and isinstance(section["per_language"], dict)
        and all(isinstance(v, dict) for v in section["per_language"].values())
        for section in table.values()
    ):
        raise ConfigError(
            f"--base {path}: expected a calibration file, `step: {{per_language: {{lang: {{param: value}}}}}}`"
        )
    return table


def header(fw: FineWeb2, changes: list[Change], args, commented: bool) -> str:
    command = "pipeline calibrate --from-fineweb2" + (
        f" {shlex.quote(args.from_fineweb2)}" if args.from_fineweb2 else ""
    )
    command += (f" --base {shlex.quote(args.base)}" if args.base else "") + (" --allow-off" if args.allow_off else "")
    command += (f" --languages {args.languages}" if args.languages else "") + f" -o {shlex.quote(args.output)}"
    text = comment(
        "Written by `pipeline calibrate --from-fineweb2` (gristmill.pipeline.calibration.fineweb2): FineWeb-2's "
        "per-language filter thresholds for lid.176 languages. Numbers derived from FineWeb-2's configs/*.yml "
        "and fineweb2-language-distribution.csv (github huggingface/fineweb-2, Apache-2.0), read from "
        f"{args.from_fineweb2 or '${GRISTMILL_DATA:-../shared/data}/reference/fineweb-2/configs'}; no file of "
        "FineWeb-2 is copied."
    )
    text += comment(f"Command: {command}")
    if args.base:
        text += comment(
            f"Merged onto {args.base}: FineWeb-2's values replace its values key by key; its other keys "
            "(c4_lines, the document length and line rules, the paragraph rules) and its languages FineWeb-2 "
            "has no config for stay."
        )
    text += comment(
        f"Languages ({len(fw.mapping)}): each lid.176 label's FineWeb-2 config is, of those whose ISO 639-3 "
        "code is one of the label's (fineweb2_calibration.LID176_ISO639_3: its code, or the members of its "
        "macrolanguage), the one FineWeb-2 holds the most text of: "
        + " ".join(f"{lang}={name}" for lang, name in sorted(fw.mapping.items()))
        + "."
        + (f" No FineWeb-2 config: {', '.join(fw.unmapped_labels)}." if fw.unmapped_labels else "")
        + " English keeps the defaults."
    )
    text += comment(
        "Mapped: "
        + ", ".join(f"{key} -> {step}.{param}" for key, (step, param) in KEYS.items())
        + "; FineWeb-2's settings for every language: "
        + ", ".join(f"{step}.{param} = {value}" for step, params in GLOBAL.items() for param, value in params.items())
        + " (its short_line_thr of 999, off)."
    )
    text += "# Not mapped:\n" + "".join(comment(f"{key}: {why}", "  ") for key, why in UNMAPPED)
    if fw.split_stop_words:
        n = sum(len(words) for _, words in fw.split_stop_words)
        text += comment(
            f"Stop words: {n} entries of {len(fw.split_stop_words)} languages' lists are left out, gristmill's "
            "tokenizer splits them, so they could never match a word: "
            + "; ".join(f"{lang}: {' '.join(map(repr, words))}" for lang, words in fw.split_stop_words)
        )
    if fw.negative:
        text += comment(
            "FineWeb-2's -1 (its way to switch a rule off) is written as 0, gristmill's: "
            + ", ".join(f"{lang} {step}.{param}" for step, lang, param, _ in fw.negative)
        )
    if changes:
        text += "# Departures from FineWeb-2 (calibration_rules.guard_table: the rules every calibration file keeps):\n"
        text += changes_comment(changes)
    if args.allow_off:
        text += comment(
            "--allow-off: FineWeb-2's values that switch a rule off are kept (0, or a mean word length of 1)."
        )
    if commented:
        text += comment(
            "fineweb_quality is not a step of this gristmill: its section is written below as comments, which "
            "`calibration:` ignores; the same command writes it as a section once the step exists."
        )
    return text + "# Use it as `calibration: FILE` in a run config; a step's own per_language wins.\n"


def cmd_from_fineweb2(args, languages: list[str] | None, console) -> int:
    """`pipeline calibrate --from-fineweb2 [DIR] [--base FILE] [--allow-off] -o FILE`."""
    from rich.text import Text

    configs = Path(args.from_fineweb2) if args.from_fineweb2 else default_configs_dir()
    fw = read_fineweb2(configs, languages=languages)
    if not fw.mapping:
        raise ConfigError(f"--from-fineweb2 {configs}: no config for {', '.join(languages or [])} in it")
    table, changes = guard_table(as_table(fw), args.allow_off)
    if args.base:
        # FineWeb-2's values, already held to the rules, replace the base's; what the rules then
        # change is the base's
        table, base_changes = guard_table(merge(read_table(args.base), table), args.allow_off)
        changes += base_changes
    table = prune_defaults(table)
    commented = table.pop("fineweb_quality", None) if "fineweb_quality" not in registered_steps() else None
    body = dump_table(table)
    if commented:
        section = dump_table({"fineweb_quality": commented})
        body += "".join(f"# {line}\n" for line in section.splitlines())
    write_text_atomic(Path(args.output), header(fw, changes, args, commented is not None) + body)
    for line in grouped_changes(changes):
        console.print(Text(line), soft_wrap=True)
    n_values = sum(len(v) for step in table.values() for v in step["per_language"].values())
    console.print(
        f"wrote {args.output}: {len(fw.mapping)} languages from FineWeb-2's configs, {n_values} values differing "
        "from the defaults"
        + (" (fineweb_quality's as comments: no such step here)" if commented else "")
        + (f"; {len(changes)} values changed or left out (above)" if changes else "")
        + (f"; no FineWeb-2 config: {', '.join(fw.unmapped_labels)}" if fw.unmapped_labels else "")
    )
    return 0
