"""The parallel shuffle: N encode tasks bucket by shuffle-key range, P shard tasks write the shards.

Whatever N and P, `tokens/` must hold the bytes the single global sort gives: the same documents in
the same order, cut into the same shards. The runs use the real WET sample (609 documents, every
one kept) and GPT-2's vocabulary; `shard_tokens` is small enough that shards span buckets.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xxhash

from gristmill.config import from_dict
from gristmill.pipeline.planning.planner import plan
from gristmill.pipeline.runner import run
from gristmill.tokenize import encode, open_tokens
from gristmill.tokenize.shards import bucket_of, is_val, plan_shards, shuffle_key
from gristmill.tokenize.stages import ManifestStep, ShardPlanStep, ShardStep
from tests.cli_process import pipeline

from .test_tokens import config, curated

TASKS = [(1, 1), (2, 3), (4, 2), (1, 7)]  # (encode tasks, shard tasks)
SEED, VAL, SHARD_TOKENS = 7, 0.2, 150_000


def tokens_files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / "tokens").iterdir())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, wet_files, tokenizer_files) -> dict[tuple[int, int], Path]:
    out = {}
    for n, p in TASKS:
        run_dir = tmp_path_factory.mktemp("par") / f"e{n}s{p}"
        cfg = config(run_dir, wet_files, {"path": str(tokenizer_files / "gpt2")}, tasks=2, shard_tasks=p)
        cfg["tokenize"]["tasks"] = n
        run(from_dict(cfg))
        out[(n, p)] = run_dir
    return out


def test_plan_has_the_parallel_stages(tmp_path, wet_files, tokenizer_files):
    cfg = config(tmp_path / "p", wet_files, {"path": str(tokenizer_files / "gpt2")}, tasks=4)
    cfg["tokenize"] |= {"tasks": 2, "shard_tasks": 5}
    stages = plan(from_dict(cfg))
    assert [s.label for s in stages] == [
        "01_curate",
        "02_tokenizer_sample",
        "03_tokenizer",
        "04_tokenize",
        "05_shard_lengths",
        "06_shard_plan",
        "07_shards",
        "08_manifest",
    ]
    assert [s.tasks for s in stages] == [2, 2, 1, 2, 5, 1, 5, 1]  # curate: one task per WET file at most
    assert stages[3].pipeline[1].buckets == 5  # encode tasks write one bucket per shard task
    del cfg["tokenize"]["shard_tasks"]
    assert [s.tasks for s in plan(from_dict(cfg))] == [2, 2, 1, 2, 2, 1, 2, 1]  # default: the encode tasks


def test_buckets_are_ordered_key_ranges():
    rng = np.random.default_rng(0)
    keys = sorted(int(k) for k in rng.integers(0, 2**64, size=2000, dtype=np.uint64))
    for p in (1, 2, 3, 7, 1000):
        b = [bucket_of(k, p) for k in keys]
        assert b == sorted(b) and 0 <= b[0] and b[-1] < p  # key order is bucket order
        assert bucket_of(0, p) == 0 and bucket_of(2**64 - 1, p) == p - 1
    assert len({bucket_of(k, 7) for k in keys}) == 7


def test_shards_are_byte_identical_for_any_encode_and_shard_tasks(runs):
    ref = tokens_files(runs[(1, 1)])
    assert len(ref) > 6  # manifest, tokenizer and several shards of each split
    for (n, p), run_dir in runs.items():
        got = tokens_files(run_dir)
        assert got.keys() == ref.keys(), (n, p)
        for name in ref:
            assert got[name] == ref[name], (n, p, name)
        # the work really was divided: P bucket folders, written by the encode tasks that had documents
        # (the curation writes 2 Parquet files, so at most 2 encode tasks get any)
        buckets = sorted((run_dir / "04_tokenize" / "output").iterdir())
        assert [b.name for b in buckets] == [f"{i:05d}" for i in range(p)]
        ranks = {f.stem for b in buckets for f in b.glob("*.arrow")}
        assert ranks == {f"{r:05d}" for r in range(min(n, 2))}, (n, p)
        assert len(list((run_dir / "07_shards" / "output").glob("*.json"))) == p


def test_a_shard_spans_buckets_and_a_bucket_holds_several_shards(runs):
    pieces = [
        s["pieces"] for s in json.loads((runs[(1, 7)] / "06_shard_plan" / "output" / "plan.json").read_text())["shards"]
    ]
    assert max(len(p) for p in pieces) >= 3  # one shard read from three shard tasks' buckets
    owners = [p[0][0] for p in pieces]
    assert any(owners.count(o) >= 2 for o in owners)


def reference_cuts(texts: dict[str, str], lengths: dict[str, int], shard_tokens: int) -> dict[str, list[list[str]]]:
    """An independent reference: sort every document by (xxh3_64(id, seed), xxh3_64(text)), split by
    id hash, close a shard after the document that brings it to shard_tokens."""
    order = sorted(texts, key=lambda i: (shuffle_key(i, SEED), xxhash.xxh3_64_intdigest(texts[i])))
    out = {}
    for split in ("train", "val"):
        want, cur, count = [], [], 0
        for doc_id in (i for i in order if is_val(i, VAL) == (split == "val")):
            cur.append(doc_id)
            count += lengths[doc_id]
            if count >= shard_tokens:
                want.append(cur)
                cur, count = [], 0
        if cur:
            want.append(cur)
        out[split] = want
    return out


@pytest.fixture(scope="module")
def reference(runs):
    texts = curated(runs[(1, 1)])
    fast = encode.tiktoken_from_hf(open_tokens(runs[(1, 1)]).tokenizer()).encoding
    lengths = dict(zip(texts, (len(t) + 1 for t in fast.encode_ordinary_batch(list(texts.values())))))
    return texts, lengths, fast


def test_order_and_cuts_are_the_single_global_sort(runs, reference):
    texts, lengths, fast = reference
    toks = open_tokens(runs[(2, 3)])
    want = reference_cuts(texts, lengths, SHARD_TOKENS)
    for split in ("train", "val"):
        shards = toks.shards(split)
        assert [list(s.ids) for s in shards] == want[split]
        assert [s.tokens.size for s in shards] == [sum(lengths[i] for i in w) for w in want[split]]
    # the token stream: every shard's values buffer in order is each document's ids + EOS, in that order
    stream = np.concatenate(list(toks.stream("train")))
    ids = [i for s in toks.shards("train") for i in s.ids]
    expect = np.concatenate([np.append(fast.encode_ordinary(texts[i]), toks.eos_id) for i in ids])
    assert np.array_equal(stream, expect)


@pytest.mark.parametrize("shard_tokens", [1, 5_000, 40_000, 10**9])
def test_plan_cuts_where_the_sequential_rule_does(runs, reference, shard_tokens):
    """From one document a shard to one shard a split spanning all 7 buckets."""
    texts, lengths, _ = reference
    want = reference_cuts(texts, lengths, shard_tokens)
    got = plan_shards(runs[(1, 7)] / "04_tokenize" / "output", 7, shard_tokens)
    for split in ("train", "val"):
        mine = [s for s in got["shards"] if s["split"] == split]
        assert [s["path"] for s in mine] == [f"{split}-{i:05d}.arrow" for i in range(len(want[split]))]
        assert [s["documents"] for s in mine] == [len(w) for w in want[split]]
        assert [s["tokens"] for s in mine] == [sum(lengths[i] for i in w) for w in want[split]]
        for s in mine:
            assert sum(stop - first for _, first, stop in s["pieces"]) == s["documents"]
            assert s["owner"] == s["pieces"][0][0] and all(first < stop for _, first, stop in s["pieces"])
    if shard_tokens == 10**9:
        assert [len(s["pieces"]) for s in got["shards"]] == [7, 7]


def test_reader_and_inspect_accept_the_output(runs):
    root = runs[(1, 7)]
    toks = open_tokens(root)
    toks.check()
    assert toks.manifest["totals"]["documents"] == len(curated(root))
    res = pipeline("tokens", "inspect", str(root))
    assert res.returncode == 0, res.stderr
    assert f"{toks.manifest['totals']['tokens']:,}" in res.stdout


def test_shard_task_refuses_a_plan_for_another_task_count(runs):
    run_dir = runs[(2, 3)]
    step = ShardStep(
        run_dir / "04_tokenize" / "output", run_dir / "06_shard_plan" / "output", run_dir / "03_tokenizer" / "output"
    )
    step.stage_folder = run_dir / "07_shards"
    with pytest.raises(ValueError, match=r"plan\.json: planned for 3 shard tasks, this stage runs 2"):
        list(step.run(rank=0, world_size=2))


def test_manifest_names_a_missing_shard_task(tmp_path, runs):
    run_dir = runs[(2, 3)]
    shards = tmp_path / "shards"
    shards.mkdir()
    for f in ("00000.json", "00002.json"):  # task 1 never finished
        (shards / f).write_bytes((run_dir / "07_shards" / "output" / f).read_bytes())
    step = ManifestStep(
        run_dir / "06_shard_plan" / "output",
        shards,
        run_dir / "03_tokenizer" / "output",
        tmp_path / "tokens",
        seed=SEED,
        val_fraction=VAL,
        shard_tokens=SHARD_TOKENS,
    )
    step.stage_folder = tmp_path
    with pytest.raises(FileNotFoundError, match=r"00001\.json: shard task 1 left no list of its shards"):
        list(step.run())
    assert not (tmp_path / "tokens").exists()  # nothing half-written


def test_plan_refuses_encode_output_of_the_one_file_per_task_layout(tmp_path, runs):
    """A run directory made before the encode tasks bucketed their output: named, not planned as empty."""
    encoded = tmp_path / "encoded"
    encoded.mkdir()
    (encoded / "00000.arrow").write_bytes(
        next((runs[(1, 1)] / "04_tokenize" / "output" / "00000").glob("*.arrow")).read_bytes()
    )
    step = ShardPlanStep(encoded, buckets=1, shard_tokens=SHARD_TOKENS)
    step.stage_folder = tmp_path / "plan"
    with pytest.raises(ValueError, match=r"encoded/00000\.arrow: encode output of an older layout; rerun with --force"):
        list(step.run())
    assert not (tmp_path / "plan").exists()


def test_the_plan_from_the_divided_lengths_is_the_plan_from_the_encode_files(runs, tmp_path):
    """`shard_lengths` (P tasks) and `shard_plan` (1 task, a binary search per cut) give the cuts
    the one task walking every encode file gives; a bucket whose sums are missing is one line."""
    from gristmill.tokenize.shards import plan_shards
    from gristmill.tokenize.stages import ShardPlanStep

    run_dir = runs[(1, 7)]
    enc = run_dir / "04_tokenize" / "output"
    planned = json.loads((run_dir / "06_shard_plan" / "output" / "plan.json").read_text())
    shard_tokens = planned["shard_tokens"]
    assert plan_shards(enc, 7, shard_tokens) == planned
    lengths = run_dir / "05_shard_lengths" / "output"
    assert len(list(lengths.glob("train_*.npy"))) == 7 and len(list(lengths.glob("val_*.npy"))) == 7
    partial = tmp_path / "lengths"
    partial.mkdir()
    for f in lengths.glob("*.npy"):
        if f.name != "train_00004.npy":
            (partial / f.name).write_bytes(f.read_bytes())
    step = ShardPlanStep(enc, buckets=7, shard_tokens=shard_tokens, lengths=partial)
    step.stage_folder = tmp_path / "plan"
    with pytest.raises(ValueError, match=r"train_00004\.npy: lengths of bucket 4 unreadable") as e:
        list(step.run(rank=0, world_size=1))
    assert "\n" not in str(e.value)
