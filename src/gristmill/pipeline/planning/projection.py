"""`pipeline plan`: what a run will cost, per stage, before anything runs.

Two sources, kept apart in the output:
- memory per task from the steps' memory models (`Step.memory_bytes` and `Step.document_bytes`,
  evaluated on the input size and the largest record, `input.max_record_bytes`, as `pipeline
  run` does before it starts), the part of it the largest record accounts for, and the limit
  each task has;
- CPU-hours, disk and wall time from the scale benchmark's measurements
  (`scale_calibration.json`, written by `benchmarks/scale_run.py --write-calibration`; a default
  measured on generated Common Crawl ships in this package): for each stage, a line through its
  measured points, CPU seconds = a x tasks / calibrated tasks + b x input GB (a, b >= 0),
  disk = d0 + d1 x input GB; and,
  for reference, the peak RSS measured at the largest calibrated size. Memory is projected by
  the models alone: a line through two small measurements of a bounded stage would extrapolate
  its constant overheads. A stage is matched to the calibrated config with the same stage
  name and steps; one that matches none is shown without a projection (not calibrated);
- the stages the scale runs cannot load (their work there is near nothing) from unit costs
  measured at snapshot-like sizes: the near-dedup cluster stages from CPU per node, per edge and
  per pair of partitions on a generated graph of 1e7 documents (`calibration["cluster"]`,
  `benchmarks/cluster_throughput.py --calibrate`), the tokenizer's one-task stages and
  `shard_lengths` from CPU per file, document, bucket and shard on generated metadata
  (`calibration["single_task"]`, `benchmarks/single_task_stages.py`).
A figure extended more than `EXTRAPOLATION_MARK` (100x) beyond the size it was measured at is
marked `*`; the total adds every stage's (and names those without a projection).
Wall time: each stage's CPU over the tasks that run at once (`--cores`, or every task of the
stage on Slurm), stages one after another.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gristmill.config import RunConfig
from gristmill.core.messages import format_bytes
from gristmill.core.step import Stage
from gristmill.input.sources import CC_WET_FILE_BYTES, fetcher_for, resolve
from gristmill.input.wet import WetReader
from gristmill.pipeline.planning.planner import estimate_memory, input_traffic, plan

CALIBRATION_FILE = "scale_calibration.json"
#: the shipped calibration, which `benchmarks/*.py --write-calibration` rewrite
CALIBRATION_PATH = Path(__file__).with_name(CALIBRATION_FILE)
#: a projection extended beyond this multiple of its largest calibrated input is marked as such
EXTRAPOLATION_MARK = 100.0


def load_calibration(path: str | Path | None = None) -> dict:
    if path is not None:
        try:
            return json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"calibration file {path}: {e}") from None
    return json.loads(resources.files("gristmill.pipeline.planning").joinpath(CALIBRATION_FILE).read_text())


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x through the points, with a >= 0 (no negative fixed cost)
    and b >= 0 (no cost falls as data grows: a falling figure is fixed cost being amortised);
    one point gives a line through the origin."""
    n = len(xs)
    if n == 1 or len(set(xs)) == 1:
        return 0.0, (sum(ys) / sum(xs)) if sum(xs) else 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    if b < 0:  # all fixed cost
        return my, 0.0
    if a < 0:  # refit through the origin
        return 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return a, b


def cluster_unit_costs(entry: dict) -> dict[str, dict]:
    """The cluster stages' unit costs from one removal rule's calibration graphs
    (`benchmarks/cluster_throughput.py --calibrate`): stage ("edges", "round_1", ..., "finish") ->
    CPU s per node and per edge (solved from graphs of the same nodes and different edge counts,
    both >= 0), per pair of partitions (a round's task reads a slice of every sender's part: P^2
    reads a round; from one graph on two partition counts), the tracemalloc peak per node of a
    partition, and the messages sent per node.
    A round a graph did not need costs it nothing (its tasks read the summaries and end)."""
    graphs = entry["graphs"]
    top = max(g["final_round"] for g in graphs)
    names = ["edges"] + [f"round_{r}" for r in range(1, top + 1)] + ["finish"]

    def cost(g: dict, name: str) -> tuple[float, float, float]:
        if name.startswith("round_"):
            r = int(name[6:])
            x = g["rounds"][r - 1] if r <= len(g["rounds"]) else {"cpu_s": 0.0, "peak_mb": 0.0, "sent": 0}
            return x["cpu_s"], x["peak_mb"], x.get("sent", 0)
        return g["stages"][name]["cpu_s"], g["stages"][name]["peak_mb"], 0

    pairs = entry.get("pairs", [])
    out = {}
    for name in names:
        pts = [(g["nodes"], g["edges"], *cost(g, name)) for g in graphs]
        per_node, per_edge = _two_costs([(n, e, c) for n, e, c, _, _ in pts])
        per_pair = 0.0
        if len(pairs) >= 2:  # the same graph on more partitions: what a (receiver, sender) pair costs
            lo, hi = min(pairs, key=lambda g: g["partitions"]), max(pairs, key=lambda g: g["partitions"])
            d = hi["partitions"] ** 2 - lo["partitions"] ** 2
            per_pair = max((cost(hi, name)[0] - cost(lo, name)[0]) / d, 0.0) if d else 0.0
        out[name] = {
            "per_node": per_node,
            "per_edge": per_edge,
            "per_pair": per_pair,
            "peak_bytes_per_node": max(m * 1e6 / (n / g["partitions"]) for (n, _, _, m, _), g in zip(pts, graphs)),
            "sent_per_node": max(s / n for n, _, _, _, s in pts),
        }
    return out


def _two_costs(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(a, b) >= 0 with CPU = a x nodes + b x edges through the points (least squares; one of
    them 0 where the other alone fits better)."""
    snn = sum(n * n for n, _, _ in points)
    see = sum(e * e for _, e, _ in points)
    sne = sum(n * e for n, e, _ in points)
    snc = sum(n * c for n, _, c in points)
    sec = sum(e * c for _, e, c in points)
    det = snn * see - sne * sne
    if det > 1e-9 * snn * see:
        a, b = (snc * see - sec * sne) / det, (sec * snn - snc * sne) / det
        if a >= 0 and b >= 0:
            return a, b
    only_n, only_e = snc / snn if snn else 0.0, sec / see if see else 0.0
    err_n = sum((c - only_n * n) ** 2 for n, _, c in points)
    err_e = sum((c - only_e * e) ** 2 for _, e, c in points)
    return (max(only_n, 0.0), 0.0) if err_n <= err_e else (0.0, max(only_e, 0.0))


def _steps_key(steps: list[str]) -> tuple[str, ...]:
    """Step names without their position prefix (`03_c4_lines` -> `c4_lines`)."""
    return tuple(re.sub(r"^\d+_", "", s) for s in steps)


@dataclass
class StageModel:
    config: str
    cpu: tuple[float, float]  # CPU s = a + b * GB
    #: the largest peak RSS of a task measured (MB), at `rss_at_gb`: memory is projected by the
    #: steps' models, which the scale run checks against these measurements
    rss_mb: float
    rss_at_gb: float
    disk: tuple[float, float]  # MB = d0 + d1 * GB
    points: int
    #: tasks of the stage in the calibration runs: the fixed cost `cpu[0]` is per run of that
    #: many tasks (each opens its inputs, loads models), so it is scaled by the tasks projected
    tasks: int = 1
    #: CPU s measured at the largest calibrated size
    cpu_top: float = 0.0
    #: documents into the stage per GB of input at the largest calibrated size (None: not counted)
    docs_per_gb: float | None = None

    @classmethod
    def fit(cls, config: str, points: list[dict]) -> StageModel:
        gb = [p["input_gb"] for p in points]
        top = max(points, key=lambda p: p["input_gb"])
        return cls(
            config,
            _fit(gb, [p["cpu_s"] or 0 for p in points]),
            top["max_rss_mb"] or 0,
            top["input_gb"],
            _fit(gb, [p["disk_mb"] for p in points]),
            len(points),
            max(top["tasks"], 1),
            top["cpu_s"] or 0.0,
            top["docs_in"] / top["input_gb"] if top.get("docs_in") and top["input_gb"] else None,
        )


def stage_models(calibration: dict, sizes: set[float] | None = None) -> dict[tuple, list[StageModel]]:
    """(stage name, steps) -> the models of every calibrated config that has that stage; `sizes`
    keeps only the points measured at those input sizes (GB, as the benchmark named them)."""
    out: dict[tuple, list[StageModel]] = {}
    for name, cfg in calibration["configs"].items():
        for stage, entry in cfg["stages"].items():
            pts = [
                p
                for p in entry["points"]
                if p["cpu_s"] is not None and (sizes is None or any(abs(p["nominal_gb"] - s) < 1e-9 for s in sizes))
            ]
            if pts:
                out.setdefault((stage, _steps_key(entry["steps"])), []).append(StageModel.fit(name, pts))
    return out


@dataclass
class StageProjection:
    stage: Stage
    model: StageModel | None
    cpu_s: float | None
    #: measured peak RSS of a task at the largest calibrated size (not a projection)
    rss_mb: float | None
    disk_mb: float | None
    wall_s: float | None
    estimate_bytes: int
    limit_bytes: int
    limit_setting: str
    #: the part of `estimate_bytes` for documents as long as `input.max_record_bytes`
    record_bytes: int = 0
    #: compressed input bytes the stage downloads (Common Crawl from a server or bucket)
    ingress_bytes: float = 0.0
    #: disk of the download cache the stage fills (`cache: keep`); 0 when it streams
    cache_bytes: float = 0.0
    #: where the input comes from, for the footer (the stage that reads it only)
    traffic_note: str = ""
    #: the input size over the largest size the stage was calibrated at (its CPU-h, wall and disk
    #: are a line through the calibration extended this far); None when not extrapolated (a
    #: bounded stage capped at what was measured) or not calibrated
    extrapolated: float | None = None

    @property
    def fits(self) -> bool:
        return self.estimate_bytes <= self.limit_bytes


def project(
    cfg: RunConfig,
    stages: list[Stage],
    gb: float,
    calibration: dict,
    cores: int | None,
    prefer: str | None = None,
    sizes: set[float] | None = None,
) -> list[StageProjection]:
    models = stage_models(calibration, sizes)
    estimates = {e.stage.label: e for e in estimate_memory(cfg, stages)}
    preferred = prefer or _best_config(stages, models)
    out = []
    for stage in stages:
        cands = models.get((stage.name, _steps_key(stage.step_names)), [])
        m = next((c for c in cands if c.config == preferred), cands[0] if cands else None)
        e = estimates[stage.label]
        traffic = {}
        reader = stage.pipeline[0] if stage.pipeline else None
        if isinstance(reader, WetReader):  # the stage that reads the input files
            t = input_traffic(cfg, gb * 1e9, reader.sources)
            traffic = {"ingress_bytes": t.ingress, "cache_bytes": t.cache, "traffic_note": t.note}
        if m is None and stage.name == "shard_lengths" and calibration.get("single_task"):
            # divided out of shard_plan after the scale runs: its unit costs alone
            m = StageModel("single_task", (0.0, 0.0), 0.0, 0.0, (0.0, 0.0), 1, stage.tasks)
            cands = [m]
        if stage.name in CLUSTER_STAGES and calibration.get("cluster"):
            out.append(_cluster_projection(cfg, stage, e, gb, calibration["cluster"], cores, out, traffic))
            continue
        if m is None:
            out.append(
                StageProjection(
                    stage, None, None, None, None, None, e.bytes, e.limit, e.limit_setting, e.record_bytes, **traffic
                )
            )
            continue
        cpu = m.cpu[0] * stage.tasks / m.tasks + m.cpu[1] * gb
        if any(getattr(s, "bounded_work", False) for s in stage.pipeline):
            # its work stops growing once its input reaches the configured bound: no more than the
            # most it cost in any calibrated run (the permissive runs fill the tokenizer's sample
            # from 0.25 GB on; a filtering config's line would grow without bound)
            cpu = min(cpu, max(c.cpu_top for c in cands))
        bounded = any(getattr(s, "bounded_work", False) for s in stage.pipeline)
        reach = None if bounded or m.rss_at_gb <= 0 else gb / m.rss_at_gb
        rss = None if m.config == "single_task" else m.rss_mb  # no task of it ran in a scale run
        disk = max(m.disk[0] + m.disk[1] * gb, 0.0)
        if stage.name in SINGLE_TASK_STAGES and calibration.get("single_task"):
            cpu, reach = _single_task_cpu(
                stage, stages, gb, models, preferred, calibration["single_task"], cpu, reach, m.cpu[0]
            )
        at_once = stage.tasks if cfg.executor.type == "slurm" and cores is None else min(cores or 1, stage.tasks)
        wall = cpu / max(at_once, 1)
        out.append(
            StageProjection(
                stage,
                m,
                cpu,
                rss,
                disk,
                wall,
                e.bytes,
                e.limit,
                e.limit_setting,
                e.record_bytes,
                **traffic,
                extrapolated=reach,
            )
        )
    return out


#: the tokenizer's one-task stages, projected from their unit costs at snapshot-like sizes
#: (`calibration["single_task"]`, `benchmarks/single_task_stages.py`)
SINGLE_TASK_STAGES = ("shard_lengths", "shard_plan", "manifest", "tokenizer")


def _single_task_cpu(stage, stages, gb, models, preferred, cal: dict, cpu: float, reach, fixed: float = 0.0):
    """(CPU s, extrapolation) of a tokenizer stage from what it walks: `shard_lengths` (divided
    over the buckets) every encode file (encode tasks x buckets) and every document's key;
    `shard_plan` each bucket's running sums; `manifest` a list per shard task and a link per
    shard (at least the scale run's fixed cost of the stage: its task's start); `tokenizer` its
    bounded cost measured by the scale run plus a file per sample task to merge."""

    def model_of(name: str):
        st = next((s for s in stages if s.name == name), None)
        cands = models.get((st.name, _steps_key(st.step_names)), []) if st else []
        return st, next((c for c in cands if c.config == preferred), cands[0] if cands else None)

    step = stage.pipeline[0]
    if stage.name == "tokenizer":
        sample, _ = model_of("tokenizer_sample")
        files = sample.tasks if sample else 1
        merge = cal["tokenizer_merge"]
        return cpu + merge["cpu_s"] * files / merge["files"], None
    enc, enc_model = model_of("tokenize")
    documents = enc_model.docs_per_gb * gb if enc_model and enc_model.docs_per_gb else 0.0
    if stage.name == "shard_lengths":
        sp = cal["shard_lengths"]
        files = (enc.tasks if enc else 1) * step.buckets
        est = sp["per_file_s"] * files + sp["per_document_s"] * documents
        return est, max(files / sp["files_point"]["files"], documents / sp["docs_point"]["documents"])
    if stage.name == "shard_plan":
        pl = cal["shard_plan"]
        return pl["cpu_s"] * step.buckets / pl["buckets"], step.buckets / pl["buckets"]
    shards_stage, shards_model = model_of("shards")
    tokens = (shards_model.disk[0] + shards_model.disk[1] * gb) * 1e6 / 2 if shards_model else 0.0  # uint16
    shards = tokens / max(step.shard_tokens, 1)
    mf = cal["manifest"]
    lists = shards_stage.tasks if shards_stage else 1
    est = mf["cpu_s"] * (lists + shards) / (mf["buckets"] + mf["shards"])
    return max(est, fixed), (lists + shards) / (mf["buckets"] + mf["shards"])


#: the near-dedup cluster stages, projected from their unit costs on a generated graph
#: (`calibration["cluster"]`, `benchmarks/cluster_throughput.py --calibrate`), not from the scale
#: runs (whose near-empty graphs measure only the tasks' start)
CLUSTER_STAGES = (
    "near_dedup_cluster_edges",
    "near_dedup_cluster_round",
    "near_dedup_cluster_rest",
    "near_dedup_cluster",
)


def _cluster_projection(cfg, stage: Stage, e, gb: float, cal: dict, cores, done: list, traffic: dict):
    """A cluster stage's CPU from the calibrated per-node and per-edge costs of its removal rule:
    nodes = `CANDIDATE_SHARE` x documents into near dedup (the calibrated signature stage's
    documents per GB, else the planner's estimate), edges = nodes x the calibration graph's
    edges per node. Round r costs what round r cost on the graph (nothing past its last round);
    the rest stage the rounds past `cluster_rounds`, in one task."""
    from gristmill.dedup.near import CANDIDATE_SHARE

    step = stage.pipeline[0]
    params = step.params
    rule = cal["removal"].get(params.config.removal)
    if rule is None:
        return StageProjection(stage, None, None, None, None, None, e.bytes, e.limit, e.limit_setting, e.record_bytes)
    costs = cluster_unit_costs(rule)
    base = min(rule["graphs"], key=lambda g: g["edges"] / g["nodes"])  # the graph of the default density
    sig = next(
        (
            p
            for p in done
            if p.stage.name == "near_dedup_signature"
            and getattr(p.stage.pipeline[-1], "params", None) is params
            and p.model is not None
            and p.model.docs_per_gb
        ),
        None,
    )
    documents = sig.model.docs_per_gb * gb if sig else (stage.work.documents if stage.work else gb * 300_000)
    nodes = CANDIDATE_SHARE * documents
    edges = nodes * base["edges"] / base["nodes"]
    final = base["final_round"]
    if stage.name == "near_dedup_cluster_round":
        names = [f"round_{step.round}"] if step.round <= final else []
    elif stage.name == "near_dedup_cluster_rest":
        names = [f"round_{r}" for r in range(params.cluster_rounds + 1, final + 1)]
    else:
        names = ["edges" if stage.name == "near_dedup_cluster_edges" else "finish"]
    picked = [costs[n] for n in names if n in costs]
    parts = max(params.cluster_tasks, 1)
    cpu = sum(c["per_node"] * nodes + c["per_edge"] * edges + c.get("per_pair", 0.0) * parts**2 for c in picked)
    # what a round writes: its partitions' state (41 B a node) and its messages (17 B each); the
    # edges stage two entries an edge (16 B each)
    if stage.name == "near_dedup_cluster_edges":
        disk = 32 * edges
    elif stage.name == "near_dedup_cluster":
        disk = 24 * nodes
    else:
        disk = sum(41 * nodes + 17 * c["sent_per_node"] * nodes for c in picked)
    peak = max((c["peak_bytes_per_node"] for c in picked), default=0.0) * base["nodes"] / base["partitions"]
    model = StageModel(
        f"graph {base['nodes'] / 1e6:g}M", (0.0, 0.0), peak / 1e6, 0.0, (0.0, 0.0), len(rule["graphs"]), parts
    )
    at_once = stage.tasks if cfg.executor.type == "slurm" and cores is None else min(cores or 1, stage.tasks)
    return StageProjection(
        stage,
        model,
        cpu,
        peak / 1e6,
        disk / 1e6,
        cpu / max(at_once, 1),
        e.bytes,
        e.limit,
        e.limit_setting,
        e.record_bytes,
        **traffic,
        extrapolated=nodes / base["nodes"],
    )


def _best_config(stages: list[Stage], models: dict) -> str | None:
    """The calibrated config sharing the most stages (name and steps) with this plan."""
    score: dict[str, int] = {}
    for stage in stages:
        for m in models.get((stage.name, _steps_key(stage.step_names)), []):
            score[m.config] = score.get(m.config, 0) + 1
    return max(score, key=score.get) if score else None


def plan_for_size(cfg: RunConfig, gb: float | None, files: int | None) -> tuple[list[Stage], float]:
    """The stages of `cfg` for an input of `gb` GB or `files` WET files (or its own input), without
    downloading anything and without refusing stages that do not fit (they are flagged)."""
    if gb is None and files is None:
        sources = resolve(cfg.input, fetcher_for(cfg.input.commoncrawl))
        size = sources.compressed_bytes(cfg.input.commoncrawl is not None)
    else:
        size = gb * 1e9 if gb is not None else files * CC_WET_FILE_BYTES
        sources = []
    return plan(cfg, input_size=size, sources=sources, check_memory=False), size


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _fmt_h(h: float) -> str:
    return f"{h:,.0f}" if h >= 10 else f"{h:.2g}"


def _fmt_mb(mb: float | None) -> str:
    return "—" if mb is None else format_bytes(mb * 1e6)


def render(
    projections: list[StageProjection], gb: float, cores: int | None, slurm: bool
) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, footer lines) of the projection table."""
    max_record_bytes = max((p.stage.work.max_document_bytes for p in projections if p.stage.work), default=0)
    header = [
        "stage", "tasks", "CPU-h", "wall", "mem/task", "largest record", "limit", "measured", "disk", "ingress",
        "cache", "from", "extrapolated",
    ]  # fmt: skip
    rows = []
    for p in projections:
        flag = "" if p.fits else " ✗"
        far = "*" if p.cpu_s is not None and p.extrapolated and p.extrapolated > EXTRAPOLATION_MARK else ""
        rows.append(
            [
                p.stage.label,
                str(p.stage.tasks),
                "—" if p.cpu_s is None else _fmt_h(p.cpu_s / 3600) + far,
                _fmt_s(p.wall_s) + far,
                _fmt_mb(p.estimate_bytes / 1e6) + flag,
                _fmt_mb(p.record_bytes / 1e6),
                _fmt_mb(p.limit_bytes / 1e6),
                "—" if p.model is None or p.rss_mb is None else _fmt_mb(p.rss_mb),
                _fmt_mb(p.disk_mb) + far,
                _fmt_mb(p.ingress_bytes / 1e6),
                _fmt_mb(p.cache_bytes / 1e6),
                "—" if p.model is None else p.model.config,
                f"{p.extrapolated:,.0f}x" if p.extrapolated and p.extrapolated > EXTRAPOLATION_MARK else "",
            ]
        )
    known = [p for p in projections if p.cpu_s is not None]
    cpu = sum(p.cpu_s for p in known)
    wall = sum(p.wall_s for p in known)
    disk = sum(p.disk_mb for p in known)
    where = "every task of a stage at once (Slurm)" if slurm and cores is None else f"{cores or 1} cores"
    footer = [
        f"input: {gb:,.0f} GB of compressed WET (~{gb * 300_000:.3g} documents at 300k per GB)",
        "mem/task: the steps' memory models (upper bounds; ✗: over the limit); largest record: the part of "
        f"mem/task for documents as long as input.max_record_bytes ({max_record_bytes / (1 << 20):g} MiB); "
        "measured: the largest task's peak RSS in the calibration run of the same stage (config: from; "
        "graph: the cluster stages' generated graph, one partition's tracemalloc peak); "
        "CPU-h, wall and disk: lines through the calibration runs (the cluster stages: per-node and per-edge "
        "costs on that graph, nodes = documents into near dedup x CANDIDATE_SHARE)",
        f"total: {_fmt_h(cpu / 3600)} CPU-hours, {_fmt_s(wall)} wall on {where}, {_fmt_mb(disk)} written "
        f"(stage folders, token shards included)"
        + (
            f"; of {len(projections)} stages, {len(known)} projected: the {len(projections) - len(known)} "
            "not calibrated (below) are not in it"
            if len(known) < len(projections)
            else f"; all {len(projections)} stages in it"
        ),
    ]
    far = [p for p in known if p.extrapolated and p.extrapolated > EXTRAPOLATION_MARK]
    if far:
        share = sum(p.wall_s for p in far) / wall if wall else 0.0
        footer.append(
            f"extrapolated: * marks the {len(far)} stages whose CPU-h, wall and disk extend their calibration "
            f"more than {EXTRAPOLATION_MARK:g}x beyond its largest size (column extrapolated: how far; "
            f"{share:.0%} of the total wall): lines through smaller measurements, not measurements at this size"
        )
    for p in projections:
        if p.traffic_note:
            footer.append(
                f"ingress: {_fmt_mb(p.ingress_bytes / 1e6)} downloaded by {p.stage.label}; cache: "
                f"{_fmt_mb(p.cache_bytes / 1e6)} of disk for downloads; {p.traffic_note}"
            )
    missing = [p.stage.label for p in projections if p.cpu_s is None]
    if missing:
        footer.append(
            f"not calibrated (no projection; run benchmarks/scale_run.py with this config): {', '.join(missing)}"
        )
    over = [p for p in projections if not p.fits]
    for p in over:
        fix = (
            "; lower input.max_record_bytes"
            if p.record_bytes and p.estimate_bytes - p.record_bytes <= p.limit_bytes
            else ""
        )
        footer.append(
            f"✗ {p.stage.label}: needs ~{_fmt_mb(p.estimate_bytes / 1e6)} per task "
            f"({_fmt_mb(p.record_bytes / 1e6)} of it for the largest record), "
            f"over the {_fmt_mb(p.limit_bytes / 1e6)} of {p.limit_setting}{fix}"
        )
    return header, rows, footer


def gpu_column(stages: list[Stage], header: list[str], rows: list[list[str]], footer: list[str]) -> None:
    """A plan with a stage that holds a GPU step (`Step.gpus_per_task`): GPU-hours per stage,
    from each GPU step's measured throughput (`Step.gpu_seconds`)."""
    gpu_stages = [s for s in stages if s.gpus_per_task]
    if not gpu_stages:
        return
    header.append("GPU-h")
    total = 0.0
    for stage, row in zip(stages, rows):
        secs = [s.gpu_seconds(stage.work) for s in stage.pipeline if getattr(s, "gpus_per_task", 0)]
        secs = [x for x in secs if x is not None] if stage.work is not None else []
        if not stage.gpus_per_task or not secs:
            row.append("—")
            continue
        hours = sum(secs) / 3600 * stage.gpus_per_task
        total += hours
        row.append(_fmt_h(hours))
    labels = ", ".join(s.label for s in gpu_stages)
    footer.append(
        f"GPU-h: {_fmt_h(total)} GPU-hours in {labels} (a GPU per task: local runs one task per visible GPU, "
        "Slurm asks --gres=gpu:N, Ray num_gpus), from the throughput measured on one H200 "
        "over every document read (an upper bound: the filters before it drop most) "
        "(benchmarks/classifier_throughput.py) scaled by parameters x tokens"
    )
