"""Token shards end to end on the real WET sample: the contract the trainer reads.

Each run below happens once per module. The curation keeps every document (no filter steps),
so the shards cover the sample's English, Chinese, Russian, Persian... pages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from gristmill.config import ConfigError, from_dict
from gristmill.pipeline.planning.planner import plan
from gristmill.pipeline.runner import run
from gristmill.tokenize import TokenShardError, encode, open_tokens, token_dtype, tokenizer
from gristmill.tokenize.shards import sha256_file
from tests.cli_process import pipeline

from ..conftest import WET_2017
from .conftest import config


@pytest.fixture(scope="module")
def gpt2_cfg(wet_files, tokenizer_files):
    return lambda run_dir, tasks=4: config(run_dir, wet_files, {"path": str(tokenizer_files / "gpt2")}, tasks)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, wet_files) -> Path:
    run_dir = tmp_path_factory.mktemp("tok") / "trained"
    run(from_dict(config(run_dir, wet_files, {"train": {"vocab_size": 1024}}, tasks=2, shard_tokens=400_000)))
    return run_dir


@pytest.fixture(scope="module")
def cl100k_run(tmp_path_factory, shared_data, tokenizer_files) -> Path:
    """Only the 2017 file (43 documents): also the 'before documents were added' run of the split test."""
    run_dir = tmp_path_factory.mktemp("tok") / "cl100k"
    run(
        from_dict(
            config(
                run_dir,
                [shared_data / WET_2017],
                {"path": str(tokenizer_files / "tiktoken" / "cl100k_base.tiktoken")},
                tasks=2,
            )
        )
    )
    return run_dir


RUNS = ["gpt2_run", "trained_run", "cl100k_run"]


def curated(run_dir: Path) -> dict[str, str]:
    t = pq.read_table(run_dir / "01_curate" / "output", columns=["id", "text"])
    return dict(zip(t.column("id").to_pylist(), t.column("text").to_pylist()))


def test_plan_puts_token_stages_last(tmp_path, gpt2_cfg):
    stages = plan(from_dict(gpt2_cfg(tmp_path / "p")))
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
    assert [s.tasks for s in stages] == [2, 4, 1, 4, 4, 1, 4, 1]  # curate: one task per WET file at most
    readers = [stages[1].pipeline[0], stages[3].pipeline[0]]
    assert [r.run_folder.path(r.folder) for r in readers] == [stages[0].output] * 2


@pytest.mark.parametrize("which", RUNS)
def test_every_document_round_trips_and_ends_in_eos(which, request):
    run_dir = request.getfixturevalue(which)
    texts = curated(run_dir)
    toks = open_tokens(run_dir)
    tok = toks.tokenizer()
    seen = []
    for split in ("train", "val"):
        for shard in toks.shards(split):
            for doc_id, i in zip(shard.ids, range(shard.documents)):
                ids = shard.document(i)
                assert ids[-1] == toks.eos_id and (ids == toks.eos_id).sum() == 1, doc_id
                assert tok.decode(ids[:-1].tolist(), skip_special_tokens=False) == texts[doc_id], doc_id
                seen.append(doc_id)
    assert sorted(seen) == sorted(texts) and len(texts) >= 43  # every document exactly once


@pytest.mark.parametrize("which", RUNS)
def test_manifest_counts_equal_what_shards_hold(which, request):
    root = request.getfixturevalue(which) / "tokens"
    m = json.loads((root / "manifest.json").read_text())
    assert m["format"] == "gristmill-tokens" and m["version"] == 1 and m["seed"] == 7
    by_split = {"train": [0, 0], "val": [0, 0]}
    for entry in m["shards"]:
        # plain pyarrow, as the README tells users to read a shard
        table = pa.ipc.open_file(pa.memory_map(str(root / entry["path"]))).read_all()
        assert table.schema.names == ["tokens", "id"]
        assert table.num_rows == entry["documents"]
        assert len(table.column("tokens").combine_chunks().values) == entry["tokens"]
        by_split[entry["split"]][0] += entry["documents"]
        by_split[entry["split"]][1] += entry["tokens"]
    for split, (docs, tokens) in by_split.items():
        assert m["splits"][split]["documents"] == docs and m["splits"][split]["tokens"] == tokens
        shards = [e for e in m["shards"] if e["split"] == split]
        assert [e["path"] for e in shards] == [f"{split}-{i:05d}.arrow" for i in range(len(shards))]
        assert all(e["tokens"] >= m["shard_tokens"] for e in shards[:-1])  # only the last shard is short
    assert m["totals"] == {
        "documents": sum(d for d, _ in by_split.values()),
        "tokens": sum(t for _, t in by_split.values()),
    }
    assert m["totals"]["documents"] == len(curated(root.parent))
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["manifest.json", "tokenizer.json", *(e["path"] for e in m["shards"])]
    )
    open_tokens(root).check()  # the check of inspect, export and training: tokenizer, shards, ids


@pytest.mark.parametrize("which", RUNS)
def test_tiktoken_gives_hf_ids_on_the_whole_sample(which, request):
    run_dir = request.getfixturevalue(which)
    toks = open_tokens(run_dir)
    assert toks.manifest["tokenizer"]["engine"] == "tiktoken"
    hf = toks.tokenizer()
    fast = encode.tiktoken_from_hf(hf)
    assert fast.encoding is not None, fast.reason
    texts = list(curated(run_dir).values())
    assert encode.compare(hf, fast.encoding, texts) == (len(texts), None)
    # and the shards hold exactly those ids
    want = dict(zip(curated(run_dir), encode.hf_encode_batch(hf, texts)))
    for split in toks.splits:
        for shard in toks.shards(split):
            for doc_id, i in zip(shard.ids, range(shard.documents)):
                assert shard.document(i)[:-1].tolist() == want[doc_id]


def test_gpt2_tiktoken_matches_tiktokens_own_gpt2(gpt2_run, tokenizer_files):
    """The GPT-2 files converted to tokenizer.json, then to tiktoken, equal tiktoken's own r50k ranks."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    ranks = data_gym_to_mergeable_bpe_ranks(
        str(tokenizer_files / "gpt2" / "vocab.bpe"), str(tokenizer_files / "gpt2" / "encoder.json")
    )
    ref = tiktoken.Encoding("r50k", pat_str=tokenizer.GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    texts = list(curated(gpt2_run).values())
    ours = encode.tiktoken_from_hf(open_tokens(gpt2_run).tokenizer()).encoding
    assert ours.encode_ordinary_batch(texts) == ref.encode_ordinary_batch(texts)


def test_non_plain_bpe_falls_back_to_hf(tokenizer_files):
    neox = tokenizer.load(tokenizer_files / "gpt-neox" / "tokenizer.json")
    fast = encode.tiktoken_from_hf(neox)
    assert fast.encoding is None and "normalizer" in fast.reason
    enc = encode.Encoder(neox, "hf")
    ids = enc.encode_batch(["Hello world <|endoftext|>"])[0]
    assert neox.token_to_id("<|endoftext|>") not in ids  # document text never yields a special id
    with pytest.raises(ValueError, match="normalizer"):
        encode.Encoder(neox, "tiktoken")


def test_split_is_stable_when_documents_are_added(gpt2_run, cl100k_run):
    small, big = open_tokens(cl100k_run), open_tokens(gpt2_run)  # 43 documents, then 609 (the same 43 among them)
    ids = lambda t, split: {i for s in t.shards(split) for i in s.ids}  # noqa: E731
    assert ids(small, "val") and ids(small, "train")
    assert ids(small, "val") <= ids(big, "val")
    assert ids(small, "train") <= ids(big, "train")
    share = len(ids(big, "val")) / (len(ids(big, "val")) + len(ids(big, "train")))
    assert 0.1 < share < 0.3  # val_fraction 0.2 of 609 documents


def test_shuffle_mixes_documents_from_both_files(gpt2_run):
    """The global shuffle interleaves the two WET files' documents (input order would not)."""
    texts = curated(gpt2_run)
    order = [i for s in open_tokens(gpt2_run).shards("train") for i in s.ids]
    first_2017 = set(list(texts)[566:])  # curate writes the 2014 file's documents, then 2017's
    positions = [k for k, i in enumerate(order) if i in first_2017]
    assert positions and positions[0] < len(order) // 2 and positions[-1] > len(order) // 2


def test_output_is_byte_identical_for_1_and_4_tasks(tmp_path, gpt2_cfg, gpt2_run):
    one = tmp_path / "one"
    run(from_dict(gpt2_cfg(one, tasks=1)))
    files = lambda d: {p.name: p.read_bytes() for p in sorted((d / "tokens").iterdir())}  # noqa: E731
    a, b = files(one), files(gpt2_run)
    assert len(a) > 4 and a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    # 4 shard tasks' buckets, written by the encode tasks that got documents (curate wrote 2 files);
    # a bucket file is made on its first document, so tasks without documents leave none
    encoded = gpt2_run / "04_tokenize" / "output"
    assert sorted(p.name for p in encoded.iterdir()) == [f"{b:05d}" for b in range(4)]
    assert sorted({p.name for p in encoded.glob("*/*.arrow")}) == ["00000.arrow", "00001.arrow"]


def test_tampered_or_truncated_shard_is_named(tmp_path, gpt2_run):
    root = tmp_path / "tokens"
    shutil.copytree(gpt2_run / "tokens", root)
    open_tokens(root)  # intact copy verifies
    victim = root / "train-00001.arrow"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit inside the token values
    victim.write_bytes(bytes(data))
    with pytest.raises(TokenShardError, match=r"train-00001\.arrow: sha256 .* does not match"):
        open_tokens(root)
    lazy = open_tokens(root, verify="lazy")
    lazy.shard("train-00000.arrow")  # an intact shard opens
    with pytest.raises(TokenShardError, match=r"train-00001\.arrow"):
        lazy.shards("train")
    res = pipeline("tokens", "inspect", str(root))
    assert res.returncode == 2 and "train-00001.arrow" in res.stderr

    victim.write_bytes(bytes(data[: len(data) - 4096]))  # truncated
    with pytest.raises(TokenShardError, match=r"train-00001\.arrow"):
        open_tokens(root)
    with pytest.raises(TokenShardError, match=r"train-00001\.arrow"):  # even unverified, it cannot pass as whole
        open_tokens(root, verify=False).shard("train-00001.arrow")


def _edit_manifest(root: Path, edit) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    edit(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def _put_id_beyond_the_vocabulary(root: Path) -> str:
    """Token 1234 of train-00001.arrow set to 60000 (fits uint16, beyond GPT-2's 50257), and the
    manifest's sha256 made to match; returns the pattern of the error that names it."""
    victim = root / "train-00001.arrow"
    table = pa.ipc.open_file(pa.BufferReader(victim.read_bytes())).read_all()  # not mapped: rewritten below
    col = table.column("tokens").chunk(0)
    values = col.values.to_numpy().copy()
    values[1234] = 60000
    tokens = pa.LargeListArray.from_arrays(col.offsets, pa.array(values, type=pa.uint16()))
    with pa.OSFile(str(victim), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_batch(pa.record_batch([tokens, table.column("id").chunk(0)], schema=table.schema))
    _edit_manifest(
        root, lambda m: next(e for e in m["shards"] if e["path"] == victim.name).update(sha256=sha256_file(victim))
    )
    doc = int(np.searchsorted(col.offsets.to_numpy(), 1234, side="right")) - 1
    return rf"train-00001\.arrow: token id 60000 \(document {doc}, .*\) is not below the vocabulary size 50257"


def test_ids_beyond_the_vocabulary_fail_inspect(tmp_path, gpt2_run):
    """A shard with an id the tokenizer does not have, and a manifest written for it (so its
    sha256 verifies): `tokens inspect` names the shard, the id and the vocabulary size."""
    root = tmp_path / "tokens"
    shutil.copytree(gpt2_run / "tokens", root)
    want = _put_id_beyond_the_vocabulary(root)
    open_tokens(root)  # the sha256 checks pass: only the id check can object
    with pytest.raises(TokenShardError, match=want):
        open_tokens(root).check()
    open_tokens(root).check("val")  # the other split is sound
    res = pipeline("tokens", "inspect", str(root))
    assert res.returncode == 2 and "sha256 verified" not in res.stdout
    assert len(res.stderr.strip().splitlines()) == 1 and re.search(want, res.stderr), res.stderr


def test_token_dtype_follows_vocab_size(gpt2_run, cl100k_run):
    assert token_dtype(65536) == pa.uint16() and token_dtype(65537) == pa.uint32()
    for run_dir, dtype, vocab in ((gpt2_run, "uint16", 50257), (cl100k_run, "uint32", 100277)):
        toks = open_tokens(run_dir)
        assert toks.manifest["dtype"] == dtype and toks.vocab_size == vocab
        shard = toks.shards("train")[0]
        assert shard.table.schema.field("tokens").type == pa.large_list(
            pa.field("item", getattr(pa, dtype)(), nullable=False)
        )
        assert shard.tokens.dtype == np.dtype(dtype)
    assert open_tokens(cl100k_run).shards("train")[0].tokens.max() > 65535 or open_tokens(cl100k_run).eos_id > 65535


def test_token_stream_is_zero_copy(gpt2_run):
    shard = open_tokens(gpt2_run).shards("train")[0]
    buf = shard.table.column("tokens").chunk(0).values.buffers()[1]
    assert shard.tokens.ctypes.data == buf.address  # the numpy view points into the mapped file
    assert not shard.tokens.flags.owndata


def test_training_is_deterministic_and_cli_matches_the_run(tmp_path, trained_run):
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"tok{seed}.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gristmill.cli",
                "tokenizer",
                "train",
                str(trained_run / "01_curate" / "output"),
                "--vocab-size",
                "1024",
                "-o",
                str(out),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    # the run trained on the same documents (all of them, in id-hash order): the same file
    assert outs[0] == (trained_run / "tokens" / "tokenizer.json").read_bytes()
    toks = open_tokens(trained_run)
    assert toks.vocab_size == 1024 and (toks.eos_id, toks.bos_id, toks.manifest["tokenizer"]["pad_id"]) == (0, 1, 2)


def test_export_bin_is_the_train_stream(tmp_path, gpt2_run):
    out = tmp_path / "train.bin"
    res = pipeline("tokens", "export", str(gpt2_run), "--format", "bin", "-o", str(out))
    assert res.returncode == 0, res.stderr
    toks = open_tokens(gpt2_run)
    flat = np.memmap(out, dtype=np.uint16, mode="r")
    assert np.array_equal(flat, np.concatenate(list(toks.stream("train"))))
    assert len(flat) == toks.manifest["splits"]["train"]["tokens"]
    shown = pipeline("tokens", "inspect", str(gpt2_run), env={**os.environ, "COLUMNS": "120"})
    assert shown.returncode == 0, shown.stderr
    assert f"{toks.manifest['totals']['tokens']:,}" in shown.stdout and "document lengths" in shown.stdout


def _ids_beyond_the_vocabulary(root: Path, tmp: Path) -> str:
    return _put_id_beyond_the_vocabulary(root)


def _manifest_vocab_below_the_tokenizers(root: Path, tmp: Path) -> str:
    _edit_manifest(root, lambda m: m["tokenizer"].update(vocab_size=50000))
    return (
        r"tokens/manifest\.json: tokenizer\.vocab_size is 50000, but \S+/tokenizer\.json holds ids up to 50256"
        r" \(vocabulary size 50257\)"
    )


def _manifest_vocab_below_the_ids(root: Path, tmp: Path) -> str:
    """A smaller tokenizer put in, and the manifest's sha256 and vocab_size made to match it: every
    file agrees with the manifest, only the ids can tell."""
    small = tokenizer.train(["the shards were written with another tokenizer"] * 20, 300)
    (root / "tokenizer.json").write_text(small.to_str())
    size = max(small.get_vocab(with_added_tokens=True).values()) + 1
    _edit_manifest(root, lambda m: m["tokenizer"].update(vocab_size=size, sha256=sha256_file(root / "tokenizer.json")))
    return rf"train-00000\.arrow: token id \d+ \(document \d+, token \d+; .*\) is not below the vocabulary size {size}"


def _tokenizer_swapped(root: Path, tmp: Path) -> str:
    data = Path(os.environ.get("GRISTMILL_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
    shutil.copyfile(data / "tokenizers/gpt-neox/tokenizer.json", root / "tokenizer.json")
    return r"tokens/tokenizer\.json: sha256 [0-9a-f]{64} does not match manifest\.json"


def _shard_path_leaves_the_directory(root: Path, tmp: Path) -> str:
    (root / "train-00001.arrow").rename(tmp / "elsewhere.arrow")
    _edit_manifest(root, lambda m: m["shards"][1].update(path="../elsewhere.arrow"))
    return r"tokens/manifest\.json: shards\[1\]\.path '\.\./elsewhere\.arrow' leads outside the token directory"


LIES = [
    _ids_beyond_the_vocabulary,
    _manifest_vocab_below_the_tokenizers,
    _manifest_vocab_below_the_ids,
    _tokenizer_swapped,
    _shard_path_leaves_the_directory,
]


@pytest.mark.parametrize("lie", LIES, ids=lambda f: f.__name__.strip("_"))
def test_export_refuses_what_inspect_refuses_and_writes_nothing(tmp_path, gpt2_run, lie):
    """Every lie of a token directory: `tokens export` stops with the line `tokens inspect` prints
    (one check, `TokenDir.check`), exit 2, and an earlier export at the output path is untouched."""
    root = tmp_path / "tokens"
    shutil.copytree(gpt2_run / "tokens", root)
    want = lie(root, tmp_path)
    out = tmp_path / "train.bin"
    out.write_bytes(b"an earlier export")
    lines = {}
    for cmd in (["export", str(root), "-o", str(out)], ["inspect", str(root)]):
        res = pipeline("tokens", *cmd)
        assert res.returncode == 2, res.stdout + res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and re.search(want, res.stderr), res.stderr
        lines[cmd[0]] = res.stderr
    assert lines["export"] == lines["inspect"]
    assert out.read_bytes() == b"an earlier export"
    left = {p.name for p in tmp_path.iterdir() if p.is_file()} - {"elsewhere.arrow"}  # the moved shard
    assert left == {"train.bin"}  # no train.bin.tmp


def test_export_cut_short_leaves_no_partial_file(tmp_path, gpt2_run):
    """A disk that fills mid-export (here a file size limit): the error names the output, no
    half-written file is left behind, and the earlier export is untouched."""
    import resource

    out = tmp_path / "train.bin"
    out.write_bytes(b"an earlier export")
    limit = 64 * 1024  # well below the split's size (checked below), far above anything else written
    res = subprocess.run(
        [sys.executable, "-m", "gristmill.cli", "tokens", "export", str(gpt2_run), "-o", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert open_tokens(gpt2_run).manifest["splits"]["train"]["tokens"] * 2 > 10 * limit
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [f"error: File too large: {out}"], res.stderr
    assert out.read_bytes() == b"an earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin"]


def test_export_names_a_split_the_manifest_lacks(tmp_path, gpt2_run):
    out = tmp_path / "x.bin"
    res = pipeline("tokens", "export", str(gpt2_run), "--split", "test", "-o", str(out))
    assert res.returncode == 2 and not out.exists(), res.stderr
    assert re.fullmatch(
        r"error: --split test: \S+/manifest\.json has no shards of this split \(it has: train, val\)\n", res.stderr
    ), res.stderr


def test_a_manifest_of_no_shards_is_one_line_for_inspect_and_every_export(tmp_path, gpt2_run):
    """A token directory whose manifest names no shard and no split (no document reached
    tokenization): `tokens inspect` and each export format say so in one line, exit 2, no
    StopIteration traceback, nothing written."""
    root = tmp_path / "tokens"
    shutil.copytree(gpt2_run / "tokens", root)
    _edit_manifest(root, lambda m: m.update(shards=[], splits={}))
    want = rf"error: {re.escape(str(root))}/manifest\.json: no shards in any split \(no documents were tokenized\)"
    for cmd, what in (
        (["inspect", str(root)], "inspect"),
        (["inspect", str(root), "--split", "train"], "inspect"),
        (["export", str(root), "-o", str(tmp_path / "x.bin")], "export"),
        (["export", str(root), "--format", "megatron", "-o", str(tmp_path / "meg")], "export"),
    ):
        res = pipeline("tokens", *cmd)
        assert res.returncode == 2, res.stdout + res.stderr
        assert re.fullmatch(want + f": nothing to {what}\n", res.stderr), res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"]
    # splits listed but every one empty: the same
    _edit_manifest(root, lambda m: m.update(splits={"train": {"shards": 0, "documents": 0, "tokens": 0}}))
    res = pipeline("tokens", "export", str(root), "--format", "megatron", "-o", str(tmp_path / "meg"))
    assert res.returncode == 2 and "nothing to export" in res.stderr and "Traceback" not in res.stderr, res.stderr
    # a split the manifest lacks, for inspect as for export
    shutil.rmtree(root)
    shutil.copytree(gpt2_run / "tokens", root)
    res = pipeline("tokens", "inspect", str(root), "--split", "test")
    assert res.returncode == 2 and "--split test: " in res.stderr and "has no shards of this split" in res.stderr


def test_tokenize_config_errors_name_the_key(tmp_path, wet_files):
    cfg = config(tmp_path / "e", wet_files, {"path": "x", "train": {"vocab_size": 512}})
    with pytest.raises(ConfigError, match=r"tokenize.tokenizer: give exactly one of `path`"):
        from_dict(cfg)
    cfg["tokenize"]["tokenizer"] = {"train": {"vocab_size": 100}}
    with pytest.raises(ConfigError, match=r"tokenize.tokenizer.train.vocab_size"):
        from_dict(cfg)
    cfg["tokenize"]["tokenizer"] = {"path": str(tmp_path / "missing.json")}
    with pytest.raises(ConfigError, match=r"tokenize.tokenizer.path: .*missing.json: tokenizer file not found"):
        run(from_dict(cfg))
    # written as the step it is, the error names the step's key
    step = {**cfg, "steps": [{"tokenize": {**cfg.pop("tokenize"), "tokenizer": {"train": {"vocab_size": 100}}}}]}
    with pytest.raises(ConfigError, match=r"\n  steps\[0\]\.tokenize\.tokenizer\.train\.vocab_size: "):
        from_dict(step)
    assert not (tmp_path / "e").exists()  # refused before the run directory is touched


def test_sample_of_the_tasks_samples_is_the_sample_of_all(wet_files):
    """The tokenizer's sample is taken per task, then over the union: the same documents as one
    pass over everything, for any split, including budgets met inside one task's share."""
    from datatrove.data import Document

    from gristmill.input.wet import WetReader
    from gristmill.tokenize.stages import hash_sample, hash_sample_entries

    docs = list(WetReader([str(p) for p in wet_files]).run())
    for budget in (50_000, 400_000, 10**9):
        whole = hash_sample(docs, budget)
        for parts in (2, 5, 13):
            union = [
                Document(text=t, id=i) for r in range(parts) for i, t in hash_sample_entries(docs[r::parts], budget)
            ]
            assert hash_sample(union, budget) == whole
        assert 0 < len(whole) <= len(docs)
    assert len(hash_sample(docs, 50_000)) < len(hash_sample(docs, 400_000)) < len(docs)


def test_tokenizer_reads_the_samples_merged_and_stops_at_the_budget(wet_files, tmp_path):
    """The tokenizer task merges the sample tasks' files in key order and stops once it holds
    the budget: the selection is the one-pass one, and it reads a prefix, not every sample."""
    from gristmill.input.wet import WetReader
    from gristmill.tokenize.stages import TokenizerSampleStep, hash_sample, read_samples

    docs = list(WetReader([str(p) for p in wet_files]).run())
    for budget in (50_000, 400_000, 10**9):
        step = TokenizerSampleStep(budget)
        step.stage_folder = tmp_path / f"b{budget}"
        for r in range(5):
            list(step.run(iter(docs[r::5]), rank=r, world_size=5))
        read = list(read_samples(step.stage_folder / "output", budget))
        assert hash_sample(read, budget) == hash_sample(docs, budget)
        read_bytes = sum(len(d.text.encode()) for d in read)
        if budget < 10**9:
            # a prefix: at most the budget and the one document that crosses it (plus key ties)
            assert read_bytes < budget + max(len(d.text.encode()) for d in docs)
        else:
            assert len(read) == len(docs)


def test_a_failed_encode_task_leaves_no_bucket_file(tmp_path, gpt2_run):
    """A failure while a task encodes (the encoder, or a step before it) removes the bucket files
    it had started: a half-written `.arrow.tmp` would otherwise sit in the stage folder."""
    from gristmill.tokenize.stages import EncodeStep

    tokenizer_folder = next(gpt2_run.glob("*_tokenizer")) / "output"
    step = EncodeStep(tokenizer_folder, seed=0, val_fraction=0.1, threads=1, batch_docs=2, buckets=3)
    step.stage_folder = tmp_path

    def documents():
        for i, text in enumerate(list(curated(gpt2_run).values())[:5]):
            yield Document(text=text, id=f"doc-{i}")
        raise RuntimeError("the step before encode failed")

    with pytest.raises(RuntimeError, match="the step before encode failed"):
        list(step.run(documents(), 0, 1))
    assert step.stats["documents"].total == 4  # two batches were written before the failure
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
