"""Merged stats of a run: the documents' journey and the per-stage funnel `pipeline stats` prints.

Each task writes datatrove's per-step stats to `<stage>/stats/NNNNN.json`. We merge them from
those files (not from datatrove's in-memory sum, which covers only the tasks of the latest
invocation), so a resumed run reports the same totals as an uninterrupted one.

Reading (`read_run`, `stage_stats`, `load_scores`: `pipeline stats`, `pipeline report`,
`gristmill.stats`) merges in memory and writes nothing: a finished run can be read from a
read-only copy, and a running one is read without touching the files its run is writing.
Only the run itself, which holds the run directory's lock, writes the merged files
(`merge_run`, `merge_stage`: `<stage>/stats.json`, `<stage>/scores.json`, the run's
`stats.json`) for readers of the directory that are not gristmill.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gristmill.core.files import write_text_atomic
from gristmill.core.messages import format_bytes
from gristmill.input.wet import KEPT_REASONS
from gristmill.pipeline.rundir.layout import completed_ranks


def _total(value) -> float:
    return value["total"] if isinstance(value, dict) else value


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except ValueError as e:  # a task's file cut short (its disk filled), or not ours
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def stage_stats(folder: Path) -> list[dict]:
    """Every task's per-step counters and times summed, in the pipeline's step order (in memory)."""
    steps: list[dict] = []
    files = sorted((folder / "stats").glob("*.json"))
    for path in files:
        for i, step in enumerate(_read_json(path)):
            if i == len(steps):
                steps.append({"name": step["name"], "counters": {}, "time_s": 0.0})
            merged = steps[i]
            merged["time_s"] += _total(step.get("time_stats", 0.0))
            for key, value in step.get("stats", {}).items():
                merged["counters"][key] = merged["counters"].get(key, 0) + _total(value)
    for step in steps:
        step["counters"] = dict(sorted(step["counters"].items()))
    return steps


def merge_stage(folder: Path) -> list[dict]:
    """`stage_stats`, written to `<stage>/stats.json` (by the run, which holds the directory)."""
    steps = stage_stats(folder)
    write_text_atomic(folder / "stats.json", json.dumps(steps, indent=2))
    return steps


def stage_scores(folder: Path) -> dict[str, dict]:
    """Each filter's per-task score histograms and samples merged (in memory); a stage whose
    per-task files are gone keeps what the run merged into `scores.json`."""
    merged = _merge_score_parts(folder)
    if not merged and (folder / "scores.json").is_file():
        merged = _read_json(folder / "scores.json")
    return merged


def _merge_score_parts(folder: Path) -> dict[str, dict]:
    from gristmill.core.scores import merge

    merged = {}
    root = folder / "scores"
    for step_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        parts = [_read_json(p) for p in sorted(step_dir.glob("*.json"))]
        if parts:
            merged[step_dir.name] = merge(parts)
    return merged


def merge_scores(folder: Path) -> dict[str, dict]:
    """Each filter's per-task scores merged into `<stage>/scores.json` (by the run)."""
    merged = _merge_score_parts(folder)
    if merged:
        write_text_atomic(folder / "scores.json", json.dumps(merged))
    return merged


def _plan(run_dir: Path) -> dict:
    return _read_json(run_dir / "plan.json")


def load_scores(run_dir: Path) -> dict[str, dict]:
    """Stage label → step → merged scores (histograms, samples), merged in memory."""
    out = {}
    for stage in _plan(run_dir)["stages"]:
        scores = stage_scores(run_dir / stage["label"])
        if scores:
            out[stage["label"]] = scores
    return out


def domain(url: str | None) -> str | None:
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname if url else None
    except ValueError:
        return None
    return host.removeprefix("www.") if host else None


def top_domains(scores: dict[str, dict], n: int = 15) -> dict[str, list[tuple[str, int]]]:
    """Most frequent domains among the *sampled* kept documents (of the run's last filter) and
    dropped documents (all filters): an estimate from the bounded samples, not exact counts."""
    from collections import Counter

    kept, dropped = Counter(), Counter()
    records = [rec for steps in scores.values() for rec in steps.values()]
    for rec in records:
        for s in rec["samples"]:
            d = domain(s.get("url"))
            if d and not s["kept"]:
                dropped[d] += 1
            elif d and rec is records[-1]:  # kept by the run's last filter
                kept[d] += 1
    return {"kept": kept.most_common(n), "dropped": dropped.most_common(n)}


def read_run(run_dir: Path) -> dict:
    """The run's stats, every stage's tasks merged in memory; nothing is written."""
    stages = []
    for stage in _plan(run_dir)["stages"]:
        folder = run_dir / stage["label"]
        markers = [p.name for p in (folder / "completions").iterdir()] if (folder / "completions").is_dir() else []
        done = len(completed_ranks(markers, stage["tasks"]))
        steps = stage_stats(folder) if (folder / "stats").is_dir() else []
        stages.append({**stage, "tasks_completed": done, "steps": steps})
    return {"run_dir": str(run_dir), "stages": stages}


def merge_run(run_dir: Path) -> dict:
    """`read_run`, written as every stage's `stats.json` and `scores.json` and the run's
    `stats.json`: by the run, which holds the run directory's lock."""
    merged = read_run(run_dir)
    for stage in merged["stages"]:
        folder = run_dir / stage["label"]
        if (folder / "stats").is_dir():
            write_text_atomic(folder / "stats.json", json.dumps(stage["steps"], indent=2))
        merge_scores(folder)
    write_text_atomic(run_dir / "stats.json", json.dumps(merged, indent=2))
    return merged


@dataclass
class FunnelRow:
    stage: str
    step: str
    kind: str
    docs_in: int
    docs_out: int
    bytes_in: int
    bytes_out: int
    time_s: float
    drops: dict[str, int] = field(default_factory=dict)

    @property
    def mb_per_s(self) -> float | None:
        return self.bytes_in / 1e6 / self.time_s if self.time_s > 0 else None


def _row(stage: str, step: dict) -> FunnelRow:
    kind, _, name = step["name"].partition(": ")
    c = {k: int(v) for k, v in step["counters"].items()}
    if "READER" in kind:
        # records lost count in, beside the documents; a record kept with a problem (a wrong
        # Content-Length, bytes that are not UTF-8) is one of the documents already
        bad = {k[4:]: v for k, v in c.items() if k.startswith("bad_") and k[4:] not in KEPT_REASONS}
        skipped = {k: v for k, v in c.items() if k.startswith("skipped_")}
        docs = c.get("documents", 0)
        return FunnelRow(
            stage,
            name,
            "reader",
            docs + sum(bad.values()),
            docs,
            c.get("bytes", 0),
            c.get("bytes", 0),
            step["time_s"],
            {**bad, **skipped},
        )
    if "FILTER" in kind:
        drops = {k.removeprefix("dropped_"): v for k, v in c.items() if k.startswith("dropped_")}
        return FunnelRow(
            stage,
            name,
            "filter",
            c.get("total", 0),
            c.get("forwarded", 0),
            c.get("bytes_in", 0),
            c.get("bytes_out", 0),
            step["time_s"],
            drops,
        )
    docs, size = c.get("documents", c.get("total", 0)), c.get("bytes", 0)
    return FunnelRow(stage, name, "writer" if "WRITER" in kind else "step", docs, docs, size, size, step["time_s"])


def funnel(merged: dict) -> list[FunnelRow]:
    return [_row(stage["label"], step) for stage in merged["stages"] for step in stage["steps"]]


# --- the documents' journey ------------------------------------------------------------------
#
# The funnel above has a row per step of every stage: each stage's reader and writer, and every
# phase of a global step (dedup's hash/find/filter, near dedup's five, tokenization's six). The
# journey keeps the rows that decide what happens to the documents: the reader, then one row per
# YAML step (its phases gathered by step id across their stages), then tokenization. Its
# documents and bytes in and out are read off one row of the funnel each (a filter phase, or the
# reader and writer of the stages the step owns), so they are the funnel's own figures.

#: a YAML step's id (`NN_name`): the name every phase of the step carries in stats
STEP_ID = re.compile(r"\d{2,}_\w+")
#: the journey's name for tokenization when its phases carry no step id (the `tokenize:` section)
TOKENIZE = "tokenize"
#: counters of a funnel row that its documents/bytes/drops columns already show
_BOOKKEEPING = {"documents", "bytes", "total", "forwarded", "dropped", "bytes_in", "bytes_out"}


@dataclass
class JourneyRow:
    """One step of the documents' journey: the reader, a YAML step over all its stages, or
    tokenization. `drops`: documents it dropped, by reason; `counters`: what else its phases
    counted (paragraphs removed, candidate pairs, tokens, records the reader skipped, ...)."""

    step: str
    kind: str  # read | filter | dedup | tokens | step
    stages: list[str]
    docs_in: int
    docs_out: int
    bytes_in: int
    bytes_out: int
    time_s: float
    drops: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())


@dataclass
class _Group:
    """A journey row before its numbers: which funnel rows are its phases, and which funnel row
    (and which side of it, "in" or "out") its documents in and out are read from."""

    key: str
    kind: str
    phases: list[int]
    src_in: tuple[int, str] = (0, "in")
    src_out: tuple[int, str] = (0, "out")


def _tokenize_name(run_dir: Path) -> str:
    """The step id of a `tokenize` entry of the run's `steps:` when its phases do not carry it,
    else the section's name."""
    import yaml

    try:
        cfg = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):  # no readable config: the name alone is still right
        cfg = None
    steps = (cfg.get("steps") if isinstance(cfg, dict) else None) or []
    for i, spec in enumerate(steps):
        name = spec if isinstance(spec, str) else next(iter(spec), None) if isinstance(spec, dict) else None
        if name == TOKENIZE:
            return f"{i:02d}_{TOKENIZE}"
    return TOKENIZE


def _groups(merged: dict, rows: list[FunnelRow]) -> list[_Group]:
    steps = [step for stage in merged["stages"] for step in stage["steps"]]
    types = [step["name"].partition(": ")[0] for step in steps]
    groups: dict[str, _Group] = {}
    dedup: set[str] = set()
    tokenize = None
    first = merged["stages"][0]["label"] if merged["stages"] else None
    for i, (r, t) in enumerate(zip(rows, types)):
        if r.kind == "reader" and r.stage == first and not groups:  # the documents enter the run here
            key, kind = r.step, "read"
        elif STEP_ID.fullmatch(r.step):
            key, kind = r.step, "step"
        elif "TOKENIZER" in t:  # tokenization as its own section: phases named, not numbered
            tokenize = tokenize or _tokenize_name(Path(merged["run_dir"]))
            key, kind = tokenize, "step"
        else:  # a stage's reader or writer, plumbing between the steps
            continue
        groups.setdefault(key, _Group(key, kind, [])).phases.append(i)
        if "DEDUP" in t:
            dedup.add(key)
    owner: dict[str, set[str]] = {}  # stage label -> the groups with a phase in it
    for g in groups.values():
        for i in g.phases:
            owner.setdefault(rows[i].stage, set()).add(g.key)
    prev: tuple[int, str] | None = None
    for g in groups.values():
        filters = [i for i in g.phases if rows[i].kind == "filter"]
        own = {rows[i].stage for i in g.phases if owner[rows[i].stage] == {g.key}}
        readers = [i for i, r in enumerate(rows) if r.stage in own and r.kind == "reader" and i not in g.phases]
        writers = [i for i, r in enumerate(rows) if r.stage in own and r.kind == "writer"]
        counted = [i for i in g.phases if rows[i].docs_out]
        if g.kind == "read":
            g.src_in, g.src_out = (g.phases[0], "in"), (g.phases[0], "out")
        elif filters:  # the filter phase decides: its documents in, kept and dropped
            g.src_in, g.src_out = (filters[0], "in"), (filters[-1], "out")
        elif readers or writers:  # a global step: what its stages read, and what they wrote
            g.src_in = (readers[0], "out") if readers else prev or (g.phases[0], "in")
            # without a writer (tokenization ends the run): the last phase that read documents
            sized = [i for i in counted if rows[i].bytes_out]
            g.src_out = (writers[-1], "out") if writers else ((sized or counted or g.phases)[-1], "out")
        elif counted:  # a streaming step that is no filter counts what it passed
            g.src_in, g.src_out = (counted[0], "in"), (counted[-1], "out")
        else:  # one that counts nothing passes on what it was given
            g.src_in = g.src_out = prev or (g.phases[0], "in")
        c = {k: int(v) for i in g.phases for k, v in steps[i]["counters"].items()}
        if "tokens" in c:
            g.kind = "tokens"
        elif g.key in dedup:
            g.kind = "dedup"
        elif filters:
            g.kind = "filter"
        prev = g.src_out
    return list(groups.values())


def _side(row, side: str) -> tuple[int, int]:
    return (row.docs_in, row.bytes_in) if side == "in" else (row.docs_out, row.bytes_out)


def _journey_counters(steps: list[dict], phases: list[int]) -> dict[str, int]:
    """What the phases counted beyond documents, bytes and drops; a counter that more than one
    phase reports (items hashed then found, tokens encoded then sharded) is the last one's."""
    out: dict[str, int] = {}
    for i in phases:
        for k, v in steps[i]["counters"].items():
            lost = k.startswith("bad_") and k[4:] not in KEPT_REASONS  # a kept record's flaw is a note
            if k in _BOOKKEEPING or k.startswith(("dropped_", "lang_")) or lost:
                continue
            out[k] = int(v)
    return dict(sorted(out.items()))


def journey(merged: dict) -> list[JourneyRow]:
    """The documents' journey through the run: the reader, each YAML step, tokenization."""
    rows = funnel(merged)
    steps = [step for stage in merged["stages"] for step in stage["steps"]]
    out = []
    for g in _groups(merged, rows):
        (i_in, s_in), (i_out, s_out) = g.src_in, g.src_out
        docs_in, bytes_in = _side(rows[i_in], s_in)
        docs_out, bytes_out = _side(rows[i_out], s_out)
        drops: dict[str, int] = {}
        for i in g.phases:
            for reason, n in rows[i].drops.items():
                if not reason.startswith("skipped_"):  # records that are no document: a counter
                    drops[reason] = drops.get(reason, 0) + n
        out.append(
            JourneyRow(
                g.key,
                g.kind,
                list(dict.fromkeys(rows[i].stage for i in g.phases)),
                docs_in,
                docs_out,
                bytes_in,
                bytes_out,
                sum(rows[i].time_s for i in g.phases),
                drops,
                _journey_counters(steps, g.phases),
            )
        )
    return out


def journey_notes(row: JourneyRow) -> str:
    """The counters a reader of the journey wants beside its documents, in words."""
    c, notes = row.counters, []
    if c.get("files"):
        notes.append(f"{c['files']:,} files")
    skipped = sum(v for k, v in c.items() if k.startswith("skipped_"))
    if skipped:
        notes.append(f"{skipped:,} records skipped (not documents)")
    if c.get("download_bytes"):  # streamed from a server or bucket (input.commoncrawl.cache: none)
        why = {k[13:]: v for k, v in c.items() if k.startswith("http_retries_") and v}
        retries = (
            f", {c.get('http_retries', 0):,} retries (" + ", ".join(f"{k}: {v:,}" for k, v in sorted(why.items())) + ")"
        )
        notes.append(f"{format_bytes(c['download_bytes'])} downloaded" + (retries if why else ""))
    flawed = {k[4:]: v for k, v in c.items() if k.startswith("bad_") and k[4:] in KEPT_REASONS and v}
    if flawed:
        notes.append("kept despite " + ", ".join(f"{k} {v:,}" for k, v in sorted(flawed.items())))
    if "emails_replaced" in c or "ips_replaced" in c:  # pii
        notes.append(
            f"{c.get('emails_replaced', 0):,} e-mail and {c.get('ips_replaced', 0):,} IP addresses replaced "
            f"in {c.get('documents_touched', 0):,} documents"
        )
    if "paragraphs_removed" in c:
        notes.append(f"{c['paragraphs_removed']:,} paragraphs removed")
    if "candidate_pairs" in c:
        notes.append(f"{c['candidate_pairs']:,} candidate pairs, {c.get('verified_pairs', 0):,} verified")
    if c.get("clusters"):
        notes.append(f"{c['clusters']:,} clusters")
    per_bucket = _by_bucket(c, "bucket_")
    if per_bucket:  # quality_buckets: documents per bucket, the best last
        notes.append("documents by quality bucket: " + ", ".join(f"{b}: {n:,}" for b, n in per_bucket))
    if "tokens" in c:
        notes.append(f"{c['tokens']:,} tokens" + (f" in {c['shards']:,} shards" if "shards" in c else ""))
    per_bucket = _by_bucket(c, "tokens_bucket_")
    if per_bucket:  # tokenize.bucket_weights: tokens as written, copies included
        notes.append("tokens by quality bucket (with copies): " + ", ".join(f"{b}: {n:,}" for b, n in per_bucket))
    return "; ".join(notes)


def _by_bucket(counters: dict[str, int], prefix: str) -> list[tuple[int, int]]:
    """[(bucket, count)] of the counters named `<prefix>NNN`, by bucket."""
    return sorted(
        (int(k[len(prefix) :]), int(v))
        for k, v in counters.items()
        if k.startswith(prefix) and k[len(prefix) :].isdigit()
    )


def languages(merged: dict) -> dict[str, int]:
    """Documents per language as identified by langid (before its keep-list applies)."""
    counts: dict[str, int] = {}
    for stage in merged["stages"]:
        for step in stage["steps"]:
            for key, value in step["counters"].items():
                if key.startswith("lang_"):
                    counts[key[5:]] = counts.get(key[5:], 0) + int(value)
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


# --- the funnel per language -----------------------------------------------------------------
#
# Every filter records, per language, documents and bytes in and out and drops by reason
# (`core.scores`, merged per stage into scores.json). The other rows of the funnel pass their
# documents through unchanged, so they take the languages of the documents on disk at that point.
# Documents read before langid have no label yet: the rows before the first labelled filter of
# its stage take langid's own labels for the documents that reached it, and count the ones they
# dropped before it (and the reader's bad records) as "unknown".

UNKNOWN = "unknown"


@dataclass
class LanguageRow:
    stage: str
    step: str
    kind: str
    docs_in: int = 0
    docs_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    drops: dict[str, int] = field(default_factory=dict)


def _add(acc: dict[str, int], lang: str, n: int) -> None:
    if n:
        acc[lang] = acc.get(lang, 0) + n


def _cells(d_in: dict, d_out: dict, b_in: dict, b_out: dict, drops: dict) -> dict[str, dict]:
    """Per-language {docs_in, docs_out, bytes_in, bytes_out, drops} of one row (`drops`: reason →
    language → documents)."""
    out: dict[str, dict] = {}
    for key, counts in (("docs_in", d_in), ("docs_out", d_out), ("bytes_in", b_in), ("bytes_out", b_out)):
        for lang, n in counts.items():
            out.setdefault(lang, {"drops": {}})[key] = n
    for reason, by_lang in drops.items():
        for lang, n in by_lang.items():
            out.setdefault(lang, {"drops": {}})["drops"][reason] = n
    return out


def _unlabelled(row: FunnelRow) -> dict[str, dict]:
    unknown = lambda n: {UNKNOWN: n} if n else {}  # noqa: E731
    return _cells(
        unknown(row.docs_in),
        unknown(row.docs_out),
        unknown(row.bytes_in),
        unknown(row.bytes_out),
        {r: {UNKNOWN: n} for r, n in row.drops.items() if n},
    )


def _from_record(rec: dict[str, dict]) -> dict[str, dict]:
    drops: dict[str, dict[str, int]] = {}
    for lang, v in rec.items():
        for reason, n in v["dropped"].items():
            drops.setdefault(reason, {})[lang] = n
    pick = lambda key: {lang: v[key] for lang, v in rec.items() if v[key]}  # noqa: E731
    return _cells(pick("in"), pick("kept"), pick("bytes_in"), pick("bytes_out"), drops)


def _passed(docs: dict[str, int], size: dict[str, int], lose: int, lose_bytes: int, drops: dict) -> dict[str, dict]:
    """A row whose kept documents are `docs` (bytes `size`) and that lost `lose` unlabelled ones."""
    d_in, b_in = dict(docs), dict(size)
    _add(d_in, UNKNOWN, lose)
    _add(b_in, UNKNOWN, lose_bytes)
    return _cells(d_in, dict(docs), b_in, dict(size), drops)


def _sizes(size: dict[str, int], total: int) -> dict[str, int]:
    """The bytes of a pass-through row per language: the documents' own when the row counts the
    same bytes, none when it counts none (a phase reading only keys), else all unlabelled."""
    if total == sum(size.values()):
        return dict(size)
    return {UNKNOWN: total} if total else {}


def language_cells(merged: dict, scores: dict[str, dict] | None = None) -> list[dict[str, dict]]:
    """For each row of `funnel(merged)`: language → {docs_in, docs_out, bytes_in, bytes_out, drops}.
    Per row, the languages' counts sum to the row's own."""
    scores = load_scores(Path(merged["run_dir"])) if scores is None else scores
    rows = funnel(merged)
    cells: list[dict[str, dict] | None] = [None] * len(rows)
    records = [scores.get(r.stage, {}).get(r.step, {}).get("languages") if r.kind == "filter" else None for r in rows]
    # the first filter that saw labelled documents (langid, or a stage reading labelled Parquet)
    first = next((i for i, rec in enumerate(records) if rec and set(rec) - {UNKNOWN}), None)
    if first is not None:
        docs = {k: v["in"] for k, v in records[first].items() if v["in"]}
        size = {k: v["bytes_in"] for k, v in records[first].items() if v["bytes_in"]}
        i = first - 1
        while i >= 0 and rows[i].stage == rows[first].stage:
            r = rows[i]
            if sum(docs.values()) != r.docs_out:  # a row that is not in the documents' path
                break
            out_size = _sizes(size, r.bytes_out)
            cells[i] = _passed(
                docs,
                out_size,
                r.docs_in - r.docs_out,
                r.bytes_in - sum(out_size.values()),
                {reason: {UNKNOWN: n} for reason, n in r.drops.items() if n},
            )
            docs = {k: v.get("docs_in", 0) for k, v in cells[i].items() if v.get("docs_in")}
            size = {k: v.get("bytes_in", 0) for k, v in cells[i].items() if v.get("bytes_in")}
            i -= 1
    current: tuple[dict, dict] | None = None  # languages of the documents in flight / on disk
    for i, r in enumerate(rows):
        if cells[i] is None and records[i] is not None:
            cells[i] = _from_record(records[i])
        elif (
            cells[i] is None
            and r.kind != "filter"
            and current
            and r.docs_in == r.docs_out == sum(current[0].values()) > 0
        ):
            cells[i] = _cells(
                current[0], current[0], _sizes(current[1], r.bytes_in), _sizes(current[1], r.bytes_out), {}
            )
        elif cells[i] is None:  # no record (a run from before languages were counted), or rows we cannot follow
            cells[i] = _unlabelled(r)
        # only readers and filters change which documents flow on; a phase of dedup or tokenize
        # reads them (or only their keys) without passing them on
        if r.kind in ("reader", "filter"):
            c = cells[i]
            current = (
                {k: v["docs_out"] for k, v in c.items() if v.get("docs_out")},
                {k: v["bytes_out"] for k, v in c.items() if v.get("bytes_out")},
            )
    return cells


def language_funnel(merged: dict, scores: dict[str, dict] | None = None) -> dict[str, list[LanguageRow]]:
    """Language → its rows of the funnel (aligned with `funnel(merged)`), most documents first."""
    rows = funnel(merged)
    cells = language_cells(merged, scores)
    langs = {lang for c in cells for lang in c}
    first_in = lambda lang: next((c[lang].get("docs_in", 0) for c in cells if lang in c), 0)  # noqa: E731
    out = {}
    for lang in sorted(langs, key=lambda la: (-first_in(la), la)):
        out[lang] = [
            LanguageRow(r.stage, r.step, r.kind, **{k: v for k, v in c.get(lang, {}).items()})
            for r, c in zip(rows, cells)
        ]
    return out


def language_journey(merged: dict, scores: dict[str, dict] | None = None) -> dict[str, list[LanguageRow]]:
    """Language → its rows of the journey (aligned with `journey(merged)`; `stage`: the step's
    stages, comma-separated), most documents first. Per row, the languages add up to the
    journey's own: each side is read off the same funnel row as the journey's."""
    rows = funnel(merged)
    cells = language_cells(merged, scores)
    groups = _groups(merged, rows)
    langs = {lang for c in cells for lang in c}
    out: dict[str, list[LanguageRow]] = {}
    for lang in langs:
        lrows = []
        for g in groups:
            (i_in, s_in), (i_out, s_out) = g.src_in, g.src_out
            c_in, c_out = cells[i_in].get(lang, {}), cells[i_out].get(lang, {})
            drops: dict[str, int] = {}
            for i in g.phases:
                for reason, n in cells[i].get(lang, {}).get("drops", {}).items():
                    if n and not reason.startswith("skipped_"):
                        drops[reason] = drops.get(reason, 0) + n
            lrows.append(
                LanguageRow(
                    ", ".join(dict.fromkeys(rows[i].stage for i in g.phases)),
                    g.key,
                    g.kind,
                    c_in.get(f"docs_{s_in}", 0),
                    c_out.get(f"docs_{s_out}", 0),
                    c_in.get(f"bytes_{s_in}", 0),
                    c_out.get(f"bytes_{s_out}", 0),
                    drops,
                )
            )
        out[lang] = lrows
    return dict(sorted(out.items(), key=lambda kv: (-(kv[1][0].docs_in if kv[1] else 0), kv[0])))


def language_summary(by_language: dict[str, list[LanguageRow]]) -> list[dict]:
    """One line per language: documents read, kept at the end of the run, and drops per step."""
    out = []
    for lang, rows in by_language.items():
        read = rows[0].docs_in if rows else 0
        # the documents on disk at the end: the last filter's or writer's (token stages count
        # the same documents but not their bytes)
        last = next((r for r in reversed(rows) if r.kind in ("filter", "writer")), rows[-1] if rows else None)
        drops: dict[str, int] = {}
        for r in rows:
            # records that are no documents (a WARC file's requests, metadata, non-HTML) were never read
            lost = sum(n for reason, n in r.drops.items() if not reason.startswith("skipped_"))
            if lost:
                drops[r.step] = drops.get(r.step, 0) + lost
        out.append(
            {
                "language": lang,
                "read": read,
                "kept": last.docs_out if last else 0,
                "bytes_kept": last.bytes_out if last else 0,
                "kept_share": (last.docs_out / read) if read and last else None,
                "drops_by_step": drops,
            }
        )
    return out


def journey_json(row: JourneyRow) -> dict:
    return {**asdict(row), "dropped": row.dropped, "notes": journey_notes(row)}


def as_json(merged: dict, language: str | None = None) -> dict:
    """`journey`: the documents' journey (one row per deciding step); `funnel`: every step of
    every stage (`pipeline stats --stages`); per language, both."""
    scores = load_scores(Path(merged["run_dir"]))
    by_lang = language_funnel(merged, scores)
    journey_by_lang = language_journey(merged, scores)
    if language is not None:
        return {
            "run_dir": merged["run_dir"],
            "language": language,
            "journey": [asdict(r) for r in journey_by_lang[language]],
            "funnel": [asdict(r) for r in by_lang[language]],
        }
    return {
        "run_dir": merged["run_dir"],
        "stages": [{k: s[k] for k in ("label", "tasks", "tasks_completed")} for s in merged["stages"]],
        "journey": [journey_json(r) for r in journey(merged)],
        "funnel": [{**asdict(r), "mb_per_s": r.mb_per_s} for r in funnel(merged)],
        "languages": languages(merged),
        "by_language": {
            s["language"]: {
                **s,
                "journey": [asdict(r) for r in journey_by_lang[s["language"]]],
                "funnel": [asdict(r) for r in by_lang[s["language"]]],
            }
            for s in language_summary(by_lang)
        },
    }
