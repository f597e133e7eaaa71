"""`quality_buckets` on the real sample: signals ranked over the run, combined, cut into buckets by
percentiles, the low buckets dropped; `tokenize.bucket_weights` repeating the high ones. Every
figure is recomputed here from the documents the run wrote, by a plain reading of the rule."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from gristmill.config import ConfigError, from_dict
from gristmill.filters.quality_buckets import BucketCuts, QualityBucketsConfig, SampleSignals, combine
from gristmill.pipeline.report.journey import journey, journey_notes, merge_run
from gristmill.pipeline.runner import run

BUCKETS, DROP_BELOW, WEIGHTS = 4, 1, {3: 3, 2: 2}
SIGNALS = [{"field": "quality_score"}, {"field": "perplexity", "better": "lower", "weight": 2.0}]


def _config(run_dir: Path, wet_files, lid_model, kenlm_model, quality_model) -> dict:
    return {
        "run_dir": str(run_dir),
        "executor": {"tasks": 2, "workers": 2},
        "input": {"paths": [str(p) for p in wet_files]},
        "steps": [
            # every language kept: KenLM has an English model only, so the others have no perplexity
            {"langid": {"model": str(lid_model), "languages": None, "min_score": 0.3}},
            {"kenlm": {"models": {"en": str(kenlm_model)}}},
            {"quality": {"model": str(quality_model), "min_score": 0.0}},
            {
                "quality_buckets": {
                    "signals": SIGNALS,
                    "combine": "weighted",
                    "buckets": BUCKETS,
                    "drop_below": DROP_BELOW,
                }
            },
        ],
        "output": {"dropped_sample": 0},
        "tokenize": {
            "tokenizer": {"train": {"vocab_size": 512}, "check_docs": 16},
            "shard_tokens": 50_000,
            "val_fraction": 0.2,
            "bucket_weights": {str(k): v for k, v in WEIGHTS.items()},
        },
    }


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory, wet_files, lid_model, kenlm_model, quality_model) -> Path:
    run_dir = tmp_path_factory.mktemp("qb") / "run"
    run(from_dict(_config(run_dir, wet_files, lid_model, kenlm_model, quality_model)))
    return run_dir


def _table(folder: Path) -> dict:
    return pq.read_table(folder, columns=None).to_pydict()


def _mid_rank(values: list[float], x: float) -> float:
    """The share of `values` below `x`, those equal counted half: the rule, written plainly (as
    (2·below + equal) / 2n, the one rounding the step's binary searches give)."""
    return (2 * sum(v < x for v in values) + sum(v == x for v in values)) / (2.0 * len(values))


def test_buckets_are_the_percentiles_of_the_combined_rank_over_the_run(bucketed):
    (stage,) = [p for p in bucketed.iterdir() if p.name.endswith("_quality_buckets")]
    reader_in = sorted(p for p in bucketed.iterdir() if p.name.endswith("_curate"))[0] / "output"
    docs = _table(reader_in)  # every document the step saw (curate's output: its input)
    out = _table(stage / "output")
    n = len(docs["id"])
    assert n > 300 and len(out["id"]) < n  # the sample's documents, and some dropped
    q = docs["quality_score"]
    pp = docs["perplexity"]
    assert any(v is None for v in pp) and any(v is not None for v in pp)  # non-English pages have none
    q_ref, pp_ref = [v for v in q], [v for v in pp if v is not None]
    combined = {}
    for i, doc_id in enumerate(docs["id"]):
        r_q = _mid_rank(q_ref, q[i])
        r_pp = 1.0 - _mid_rank(pp_ref, pp[i]) if pp[i] is not None else 0.0  # missing: rank 0
        combined[doc_id] = (1.0 * r_q + 2.0 * r_pp) / 3.0  # weights 1 and 2: exact products, one rounding
    values = list(combined.values())
    bucket = {k: min(int(_mid_rank(values, v) * BUCKETS), BUCKETS - 1) for k, v in combined.items()}
    kept = dict(zip(out["id"], zip(out["quality_ensemble"], out["quality_bucket"])))
    assert set(kept) == {k for k, b in bucket.items() if b >= DROP_BELOW}
    for doc_id, (score, b) in kept.items():
        assert b == bucket[doc_id] and score == np.float32(combined[doc_id]), doc_id  # the column is float32
    sizes = collections.Counter(bucket.values())
    assert all(abs(sizes[b] - n / BUCKETS) <= 0.1 * n for b in range(BUCKETS)), sizes  # ~1/N of the documents each
    # the drops are a filter's: counted by reason, and the counts per bucket are the stage's
    stats = json.loads((stage / "stats.json").read_text())
    counters = {k: v for s in stats for k, v in s["counters"].items()}
    assert counters["dropped_low_quality_bucket"] == sizes[0]
    assert {b: counters[f"bucket_{b:03d}"] for b in range(BUCKETS)} == {b: sizes[b] for b in range(BUCKETS)}
    assert counters["missing_perplexity"] == sum(v is None for v in pp)
    # what `pipeline stats`, the report and the notebook API say on the step's and tokenize's rows
    rows = {r.step: journey_notes(r) for r in journey(merge_run(bucketed))}
    (step,) = [k for k in rows if k.endswith("quality_buckets")]
    assert (
        f"documents by quality bucket: 0: {sizes[0]:,}, 1: {sizes[1]:,}, 2: {sizes[2]:,}, 3: {sizes[3]:,}" in rows[step]
    )
    (tokenize,) = [k for k in rows if k.endswith("tokenize")]
    assert "tokens by quality bucket (with copies): 1: " in rows[tokenize]


def test_weighted_shards_repeat_the_high_buckets_as_the_manifest_says(bucketed):
    (stage,) = [p for p in bucketed.iterdir() if p.name.endswith("_quality_buckets")]
    kept = dict(zip(*(lambda t: (t["id"], t["quality_bucket"]))(_table(stage / "output"))))
    manifest = json.loads((bucketed / "tokens" / "manifest.json").read_text())
    rows = collections.Counter()
    splits = {}
    for shard in manifest["shards"]:
        t = pa.ipc.open_file(pa.memory_map(str(bucketed / "tokens" / shard["path"]))).read_all()
        for row_id in t.column("id").to_pylist():
            base = re.sub(r"#\d+$", "", row_id)  # a copy: <id>#2, <id>#3
            rows[base] += 1
            splits.setdefault(base, set()).add(shard["split"])
    assert set(rows) == set(kept)  # every kept document, and nothing else
    for doc_id, b in kept.items():
        want = 1 if "val" in splits[doc_id] else WEIGHTS.get(b, 1)
        assert rows[doc_id] == want and len(splits[doc_id]) == 1, (doc_id, b, rows[doc_id], splits[doc_id])
    assert any(rows[d] == 3 for d in kept) and any("val" in splits[d] for d in kept)
    w = manifest["weighting"]
    assert w["field"] == "quality_bucket" and w["weights"] == {str(k): v for k, v in sorted(WEIGHTS.items())}
    per_bucket = collections.Counter(kept.values())
    for b, entry in w["buckets"].items():
        mine = [d for d in kept if kept[d] == int(b)]
        assert entry["documents"] == per_bucket[int(b)] and entry["rows"] == sum(rows[d] for d in mine), b
        assert entry["epochs"] == WEIGHTS.get(int(b), 1)
    assert manifest["totals"]["documents"] == sum(rows.values())
    assert sum(e["row_tokens"] for e in w["buckets"].values()) == manifest["totals"]["tokens"]


def _docs(n: int, seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        meta = {"quality_score": float(rng.random())}
        if i % 7:  # one in seven without a perplexity
            meta["perplexity"] = float(rng.lognormal(7, 1))
        out.append(Document(text=f"doc {i}", id=f"<urn:{i}>", metadata=meta))
    return out


@pytest.mark.parametrize("tasks", [1, 3, 8])
def test_the_run_sample_is_the_same_for_any_number_of_tasks(tmp_path, tasks):
    """The tasks' samples merged give the sample one task would have taken: the same cuts."""
    cfg = QualityBucketsConfig.model_validate(
        {"signals": SIGNALS, "combine": "weighted", "buckets": BUCKETS, "sample_docs": 150}
    )
    docs = _docs(1000)

    def cuts(tasks: int, root: Path) -> dict:
        sample = SampleSignals(["quality_score", "perplexity"], cfg.sample_docs)
        sample.stage_folder = root / "sample"
        for r in range(tasks):
            list(sample.run(iter(docs[r::tasks]), rank=r, world_size=tasks))
        step = BucketCuts(cfg, root / "sample" / "output")
        step.stage_folder, step.sample_tasks = root / "cuts", tasks
        list(step.run())
        with np.load(root / "cuts" / "output" / "cuts.npz") as z:
            return {k: z[k] for k in z.files}

    one, many = cuts(1, tmp_path / "one"), cuts(tasks, tmp_path / "many")
    assert one.keys() == many.keys() and all(np.array_equal(one[k], many[k]) for k in one)
    assert len(one["combined"]) == 150 and len(one["signal_1"]) < 150  # sampled; perplexity missing on some
    # a missing value ranks 0 and a worse perplexity (higher) ranks lower
    values = np.array([[0.5, np.nan], [0.5, 100.0], [0.5, 1100.0]])
    got = combine(values, [one["signal_0"], one["signal_1"]], cfg)
    assert got[1] > got[2] > got[0]
    # max_rank: a document's best rank, each rank the share of the sample below it (ties half)
    best = combine(values, [one["signal_0"], one["signal_1"]], cfg.model_copy(update={"combine": "max_rank"}))
    r_q = _mid_rank(one["signal_0"].tolist(), 0.5)
    r_pp = [1.0 - _mid_rank(one["signal_1"].tolist(), v) for v in (100.0, 1100.0)]
    assert best.tolist() == [r_q, max(r_q, r_pp[0]), max(r_q, r_pp[1])]


def test_bad_settings_are_one_line_each(tmp_path, wet_files, lid_model, kenlm_model, quality_model):
    base = _config(tmp_path / "run", wet_files, lid_model, kenlm_model, quality_model)
    from gristmill.pipeline.planning.planner import plan

    def planned(cfg):
        return plan(from_dict(cfg), check_memory=False)

    bad = json.loads(json.dumps(base))
    bad["steps"][3]["quality_buckets"]["signals"] = [{"field": "judged_score"}]
    with pytest.raises(
        ConfigError, match=r"^steps\[3\]\.quality_buckets\.signals\[0\]\.field: no earlier step writes "
    ):
        planned(bad)
    bad = json.loads(json.dumps(base))
    bad["steps"][3]["quality_buckets"]["drop_below"] = BUCKETS
    with pytest.raises(ConfigError, match=r"drop_below \(4\) must be below buckets \(4\)"):
        from_dict(bad)
    bad = json.loads(json.dumps(base))
    del bad["steps"][3]
    with pytest.raises(ConfigError, match=r"^tokenize\.bucket_weights: the documents have no quality_bucket column"):
        planned(bad)
    bad = json.loads(json.dumps(base))
    bad["tokenize"]["bucket_weights"] = {"3": -1}
    with pytest.raises(ConfigError, match=r"bucket_weights: buckets and weights are 0 or more"):
        from_dict(bad)
