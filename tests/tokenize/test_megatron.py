"""`pipeline tokens export --format megatron`: Megatron's indexed dataset, read back with
megatron-core's own `IndexedDataset` and compared document by document with gristmill's reader.

megatron-core (the `megatron` extra) reads the files; gristmill's writer never imports it.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from gristmill.tokenize import open_tokens
from gristmill.tokenize.megatron import LocalFolder, MegatronExportError, index_header, write_megatron
from gristmill.tokenize.shards import sha256_file
from tests.cli_process import pipeline

from ..conftest import _missing
from .test_tokens import LIES, _edit_manifest


@pytest.fixture(scope="module")
def megatron():
    """megatron-core's indexed-dataset module (the `megatron` extra, which `make test` installs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron.core warns that Apex and Transformer Engine are absent
        try:
            import megatron.core.datasets.indexed_dataset as module
        except ImportError as e:
            _missing(f"megatron-core ({e}; pip install -e '.[megatron]')")
    return module


def export(run_dir: Path, out: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    return pipeline("tokens", "export", run_dir, "--format", "megatron", "-o", out, *extra, **kw)


@pytest.mark.parametrize("which, dtype, code", [("gpt2_run", np.uint16, 8), ("cl100k_run", np.int32, 4)])
def test_megatron_reads_every_document_as_gristmill_does(tmp_path, megatron, request, which, dtype, code):
    run_dir = request.getfixturevalue(which)
    out = tmp_path / "megatron"
    res = export(run_dir, out)
    assert res.returncode == 0, res.stderr
    assert f"--train-data-path {out / 'train'} --valid-data-path {out / 'val'}" in res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["train.bin", "train.idx", "val.bin", "val.idx"]

    toks = open_tokens(run_dir)
    for split in ("train", "val"):
        assert len(toks.shards(split)) >= (2 if split == "train" else 1)  # shard boundaries are crossed
        ours = list(toks.documents(split))
        ds = megatron.IndexedDataset(str(out / split))
        assert ds.index.dtype == dtype and (out / f"{split}.idx").read_bytes()[17] == code
        assert len(ds) == len(ours) == toks.manifest["splits"][split]["documents"]
        # one sequence per document, one document per sequence
        assert np.array_equal(ds.document_indices, np.arange(len(ours) + 1))
        assert np.array_equal(ds.sequence_lengths, [len(d) for d in ours])
        assert int(ds.sequence_lengths.sum()) == toks.manifest["splits"][split]["tokens"]
        for i, doc in enumerate(ours):
            got = ds[i]
            assert got.dtype == dtype and np.array_equal(got, doc.astype(np.int64)), (split, i)
            assert got[-1] == toks.eos_id
        # a slice of documents and a part of one, as Megatron's GPT dataset reads them
        assert all(np.array_equal(a, b) for a, b in zip(ds[3:9], ours[3:9]))
        assert np.array_equal(ds.get(5, offset=2, length=4), ours[5][2:6])
    if dtype == np.int32:  # ids above uint16 went through int32 unchanged
        assert max(int(d.max()) for d in toks.documents("train")) > 65535


def test_files_equal_megatrons_own_writer(tmp_path, megatron, gpt2_run, cl100k_run):
    """The bytes megatron-core's `IndexedDatasetBuilder` writes for the same documents, also
    when the export works in slices far smaller than a shard."""
    for run_dir, dtype in ((gpt2_run, np.uint16), (cl100k_run, np.int32)):
        toks = open_tokens(run_dir)
        for split in toks.splits:
            ref = tmp_path / f"ref-{run_dir.name}-{split}"
            builder = megatron.IndexedDatasetBuilder(f"{ref}.bin", dtype=dtype)
            for doc in toks.documents(split):
                builder.add_document(doc.astype(dtype), [len(doc)])
            builder.finalize(f"{ref}.idx")
            for chunks in ({}, {"chunk_tokens": 1000, "chunk_docs": 7}):
                out = tmp_path / f"ours-{run_dir.name}-{len(chunks)}"
                write_megatron(toks, LocalFolder(out), [split], **chunks)
                for ext in ("bin", "idx"):
                    assert (out / f"{split}.{ext}").read_bytes() == Path(f"{ref}.{ext}").read_bytes(), (
                        run_dir.name,
                        split,
                        ext,
                        chunks,
                    )


def test_header_layout():
    head = index_header(np.dtype(np.int32), 3)
    assert head == b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + b"\x04" + (3).to_bytes(8, "little") + (4).to_bytes(
        8, "little"
    )


def test_one_split_and_its_data_path(tmp_path, megatron, gpt2_run):
    out = tmp_path / "m"
    res = export(gpt2_run, out, "--split", "val")
    assert res.returncode == 0, res.stderr
    assert f"--data-path {out / 'val'}" in res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["val.bin", "val.idx"]
    documents = open_tokens(gpt2_run).manifest["splits"]["val"]["documents"]
    assert len(megatron.IndexedDataset(str(out / "val"))) == documents


def _earlier_export(out: Path) -> dict[str, bytes]:
    out.mkdir()
    files = {"train.bin": b"an earlier export", "train.idx": b"its index", "notes.txt": b"the user's"}
    for name, data in files.items():
        (out / name).write_bytes(data)
    return files


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("lie", LIES, ids=lambda f: f.__name__.strip("_"))
def test_refuses_what_inspect_refuses_and_writes_nothing(tmp_path, gpt2_run, lie):
    root = tmp_path / "tokens"
    shutil.copytree(gpt2_run / "tokens", root)
    want = lie(root, tmp_path)
    out = tmp_path / "megatron"
    before = _earlier_export(out)
    res = export(root, out)
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and re.search(want, res.stderr), res.stderr
    inspect = pipeline("tokens", "inspect", str(root))
    assert inspect.stderr == res.stderr
    assert _files(out) == before


def test_id_at_2_31_is_refused_and_nothing_is_written(tmp_path, cl100k_run):
    """An id int32 cannot hold, in the second train shard: one line naming the shard, document
    and token; the train files already written for the first shard are removed too."""
    root = tmp_path / "tokens"
    shutil.copytree(cl100k_run / "tokens", root)
    victim = root / "train-00001.arrow"
    table = pa.ipc.open_file(pa.BufferReader(victim.read_bytes())).read_all()
    col = table.column("tokens").chunk(0)
    values = col.values.to_numpy().copy()
    values[37] = 2**31
    tokens = pa.LargeListArray.from_arrays(col.offsets, pa.array(values, type=pa.uint32()))
    with pa.OSFile(str(victim), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_batch(pa.record_batch([tokens, table.column("id").chunk(0)], schema=table.schema))
    _edit_manifest(
        root, lambda m: next(e for e in m["shards"] if e["path"] == victim.name).update(sha256=sha256_file(victim))
    )
    doc = int(np.searchsorted(col.offsets.to_numpy(), 37, side="right")) - 1
    out = tmp_path / "megatron"
    before = _earlier_export(out)
    toks = open_tokens(root)  # sha256 verified; the vocabulary check would refuse it first in the CLI
    with pytest.raises(MegatronExportError) as e:
        write_megatron(toks, LocalFolder(out), ["val", "train"], chunk_tokens=16)
    line = str(e.value)
    assert "\n" not in line
    assert re.fullmatch(
        rf"\S+/train-00001\.arrow: token id 2147483648 \(document {doc}, token {37 - int(col.offsets[doc])}\)"
        r" is not below 2\^31: .*",
        line,
    ), line
    assert _files(out) == before  # val was complete: not committed either
    fresh = tmp_path / "new" / "megatron"
    with pytest.raises(MegatronExportError):
        write_megatron(toks, LocalFolder(fresh), ["train"])
    assert not fresh.exists()  # the folder it made is gone again


def test_export_cut_short_leaves_no_partial_file(tmp_path, gpt2_run):
    """A disk that fills mid-export (a file size limit): one line naming the file, nothing of
    the export left, the earlier files untouched."""
    out = tmp_path / "megatron"
    before = _earlier_export(out)
    limit = 64 * 1024
    assert open_tokens(gpt2_run).manifest["splits"]["train"]["tokens"] * 2 > 10 * limit
    args = ["tokens", "export", str(gpt2_run), "--format", "megatron", "-o", str(out)]
    res = subprocess.run(  # a fresh interpreter: the limit must hold from its start
        [sys.executable, "-m", "gristmill.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [f"error: File too large: {out / 'train.bin'}"], res.stderr
    assert _files(out) == before


def test_output_that_is_a_file_is_refused(tmp_path, gpt2_run):
    out = tmp_path / "train.bin"
    out.write_bytes(b"x")
    res = export(gpt2_run, out)
    assert res.returncode == 2 and out.read_bytes() == b"x"
    assert res.stderr == f"error: -o {out}: is a file; --format megatron writes a folder of <split>.bin/.idx\n"


def test_megatron_gpt_dataset_takes_the_prefixes(tmp_path, megatron, gpt2_run):
    """What Megatron-LM builds from `--train-data-path OUT/train --valid-data-path OUT/val`:
    megatron-core's GPT datasets, whose samples hold our documents whole between EOS ids."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    out = tmp_path / "m"
    assert export(gpt2_run, out).returncode == 0
    toks = open_tokens(gpt2_run)

    class Tokenizer:  # what GPTDataset asks of a tokenizer
        eod = toks.eos_id
        pad = -1  # GPT-2 has no pad token; none of ours
        bos = None
        vocab_size = toks.vocab_size
        unique_identifiers = {"class": "gristmill-export-test"}

    cfg = GPTDatasetConfig(
        random_seed=1,
        sequence_length=4096,
        blend_per_split=[([str(out / "train")], None), ([str(out / "val")], None), None],
        tokenizer=Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mid_level_dataset_surplus=0.005,
    )
    train, val, _ = BlendedMegatronDatasetBuilder(GPTDataset, [20, 5, None], lambda: True, cfg).build()
    assert isinstance(train, GPTDataset) and isinstance(val, GPTDataset) and len(train) >= 20
    whole = {split: {d.tobytes() for d in toks.documents(split)} for split in ("train", "val")}
    seen = 0
    for split, ds in (("train", train), ("val", val)):
        for i in range(5):
            s = ds[i]
            stream = np.concatenate([s["tokens"].numpy(), s["labels"].numpy()[-1:]]).astype(np.uint16)
            ends = np.flatnonzero(stream == toks.eos_id)
            for a, b in zip(ends, ends[1:]):  # a document that starts and ends inside the sample
                assert stream[a + 1 : b + 1].tobytes() in whole[split], (split, i, a, b)
                seen += 1
    assert seen > 10
