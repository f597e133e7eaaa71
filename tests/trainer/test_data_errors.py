"""Token data the trainer cannot use: each fault is one line naming the file, exit code 2, and no
rank trains — through `pipeline train` (checked before torchrun starts) and from the ranks
themselves when torchrun starts them without that check (as the Slurm job does)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from gristmill.cli import main as cli_main
from gristmill.trainer.launch import write_resolved
from gristmill.trainer.train import InputError, train
from tests.cli_process import pipeline

from .conftest import tiny_cfg, tokenizer_json, write_token_dir

VOCAB, BAD_ID = 300, 4000


def _docs(bad: bool = False) -> dict:
    rng = np.random.default_rng(0)
    docs = {"train": [rng.integers(2, VOCAB, 50).tolist() for _ in range(100)], "val": [[5, 6, 7] * 10] * 10}
    if bad:
        docs["train"][57][3] = BAD_ID  # shards of 40 documents: document 17 of train-00001
    return docs


def _manifest(root: Path, edit) -> None:
    path = root / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


def _rehash(root: Path, name: str) -> None:
    """The manifest made to agree with the file as it is now (so only the deeper check can object)."""
    digest = hashlib.sha256((root / name).read_bytes()).hexdigest()
    _manifest(root, lambda m: next(e for e in m["shards"] if e["path"] == name).update(sha256=digest))


def ids_beyond_vocab(tmp: Path) -> Path:
    return write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs(bad=True))


def missing_shard(tmp: Path) -> Path:
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs())
    (root / "train-00002.arrow").unlink()
    return root


def sha256_mismatch(tmp: Path) -> Path:
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs())
    data = bytearray((root / "train-00000.arrow").read_bytes())
    data[len(data) // 2] ^= 0x01
    (root / "train-00000.arrow").write_bytes(bytes(data))
    return root


def wrong_dtype(tmp: Path) -> Path:
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs(), dtype=pa.uint32())
    _manifest(root, lambda m: m.update(dtype="uint16"))
    return root


def not_arrow(tmp: Path) -> Path:
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs())
    (root / "train-00001.arrow").write_text("<html>503 Service Unavailable</html>\n")
    _rehash(root, "train-00001.arrow")
    return root


def manifest_not_json(tmp: Path) -> Path:
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs())
    (root / "manifest.json").write_text('{"format": "gristmill-tokens", "version": 1, "shards": [')
    return root


def manifest_without_vocab(tmp: Path) -> Path:
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs())
    _manifest(root, lambda m: m["tokenizer"].pop("vocab_size"))
    return root


def tokenizer_swapped(tmp: Path) -> Path:
    """Another tokenizer of the same size in place of the one the shards were written with."""
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs())
    (root / "tokenizer.json").write_text(tokenizer_json(VOCAB, prefix="other"))
    return root


def manifest_vocab_below_the_tokenizers(tmp: Path) -> Path:
    """vocab_size edited down while every id stays below it: only the tokenizer can tell."""
    docs = {"train": [[5, 6, 7, 8] * 20] * 100, "val": [[5, 6, 7] * 10] * 10}
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=docs)
    _manifest(root, lambda m: m["tokenizer"].update(vocab_size=100))
    return root


def shard_path_leaves_the_directory(tmp: Path) -> Path:
    """A shard moved out of the token directory and named `../…` (its sha256 still matches)."""
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs())
    (root / "train-00001.arrow").rename(tmp / "elsewhere.arrow")
    _manifest(root, lambda m: m["shards"][1].update(path="../elsewhere.arrow"))
    return root


def shard_path_absolute(tmp: Path) -> Path:
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs())
    (root / "train-00001.arrow").rename(tmp / "elsewhere.arrow")
    _manifest(root, lambda m: m["shards"][1].update(path=str(tmp / "elsewhere.arrow")))
    return root


def shard_symlink_leaves_the_directory(tmp: Path) -> Path:
    root = write_token_dir(tmp / "tokens", vocab=VOCAB, docs=_docs())
    (root / "train-00001.arrow").rename(tmp / "elsewhere.arrow")
    (root / "train-00001.arrow").symlink_to(tmp / "elsewhere.arrow")
    return root


FAULTS = {
    ids_beyond_vocab: r"train-00001\.arrow: token id 4000 \(document 17, token 3; largest id 4000\) is not below the"
    r" vocabulary size 300 of manifest\.json",
    missing_shard: r"train-00002\.arrow: shard listed in manifest\.json is missing",
    sha256_mismatch: r"train-00000\.arrow: sha256 [0-9a-f]{64} does not match manifest\.json",
    wrong_dtype: r"train-00000\.arrow: expected a `tokens` column of large_list<uint16> "
    r"\(the dtype in manifest\.json\),"
    r" found large_list<item: uint32",
    not_arrow: r"train-00001\.arrow: not a readable Arrow IPC file",
    manifest_not_json: r"manifest\.json: not valid JSON",
    manifest_without_vocab: r"manifest\.json: tokenizer\.vocab_size: expected a non-negative integer",
    tokenizer_swapped: r"tokens/tokenizer\.json: sha256 [0-9a-f]{64} does not match manifest\.json \([0-9a-f]{64}\)",
    manifest_vocab_below_the_tokenizers: r"tokens/manifest\.json: tokenizer\.vocab_size is 100, but \S+/tokenizer\.json"
    r" holds ids up to 299 \(vocabulary size 300\)",
    shard_path_leaves_the_directory: r"tokens/manifest\.json: shards\[1\]\.path '\.\./elsewhere\.arrow' leads"
    r" outside the token directory \(to \S+/elsewhere\.arrow\)",
    shard_path_absolute: r"tokens/manifest\.json: shards\[1\]\.path '\S+/elsewhere\.arrow' is an absolute path",
    shard_symlink_leaves_the_directory: r"tokens/manifest\.json: shards\[1\]\.path 'train-00001\.arrow' leads outside"
    r" the token directory \(to \S+/elsewhere\.arrow\)",
}


def _one_error_line(code: int, out: str, err: str, pattern: str) -> None:
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in out


# the one fault run through the `pipeline` command in its own process (its exit code and stderr
# as a user sees them); the others call the same command's entry point in this process
THROUGH_THE_COMMAND = ids_beyond_vocab


@pytest.mark.parametrize("fault", list(FAULTS), ids=lambda f: f.__name__)
def test_pipeline_train_names_the_bad_file_in_one_line(fault, tmp_path, capsys):
    """Found by `pipeline train` itself, before torchrun starts any rank."""
    tokens = fault(tmp_path)
    out = tmp_path / "out"
    argv = [
        "train",
        "tiny",
        "--out",
        str(out),
        *("--set", f"data.tokens={tokens}", "--set", "steps=3", "--set", "data.seq_len=32"),
        *("--set", "log.progress=false", "--set", "log.tensorboard=false"),
    ]
    if fault is THROUGH_THE_COMMAND:
        res = pipeline(*argv)
        _one_error_line(res.returncode, res.stdout, res.stderr, FAULTS[fault])
    else:
        capsys.readouterr()
        code = cli_main(argv)
        res = capsys.readouterr()
        _one_error_line(code, res.out, res.err, FAULTS[fault])
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()


def test_train_refuses_ids_beyond_the_vocabulary_before_the_first_step(tmp_path):
    """On main these reached the embedding: IndexError mid-step (on a GPU, a device-side assert)."""
    tokens = ids_beyond_vocab(tmp_path)
    with pytest.raises(InputError, match=FAULTS[ids_beyond_vocab]):
        train(tiny_cfg(tokens, 3), tmp_path / "out")
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_ranks_started_without_the_launcher_report_once(tmp_path):
    """torchrun starting the ranks directly (as the Slurm job does): rank 0 checks the shards,
    both ranks stop, the user reads one line."""
    tokens = ids_beyond_vocab(tmp_path)
    out = tmp_path / "out"
    cfg = write_resolved(tiny_cfg(tokens, 3).model_copy(update={"out_dir": str(out)}), out)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gristmill.trainer.torchrun",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "gristmill.trainer.train",
            str(cfg),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    _one_error_line(res.returncode, res.stdout, res.stderr, FAULTS[ids_beyond_vocab])
