"""Token-shard runs on the real WET sample: GPT-2's, made once per test run and read by the token and
Megatron tests (they copy it to change it); the others once per module (see test_tokens.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gristmill.config import from_dict
from gristmill.pipeline.runner import run

from ..conftest import WET_2017, _missing, made_once

#: documents on which the tokenizer stage checks that tiktoken gives HF's ids before using it: the
#: default (1,000) is the whole sample here, 3.5 CPU s of HF encoding in every run; these tests are
#: about the shards (test_tiktoken_gives_hf_ids_on_the_whole_sample compares the two on all of it)
CHECK_DOCS = 64


def config(run_dir: Path, files, tokenizer_cfg: dict, tasks: int = 4, **tokenize) -> dict:
    tokenizer_cfg = {"check_docs": CHECK_DOCS, **tokenizer_cfg}
    return {
        "run_dir": str(run_dir),
        "executor": {"tasks": tasks, "workers": 1},
        "input": {"paths": [str(p) for p in files]},
        "steps": [],
        "output": {"dropped_sample": 0},
        "tokenize": {"tokenizer": tokenizer_cfg, "shard_tokens": 150_000, "val_fraction": 0.2, "seed": 7, **tokenize},
    }


@pytest.fixture(scope="session")
def tokenizer_files(shared_data) -> Path:
    root = shared_data / "tokenizers"
    for rel in ("gpt2/encoder.json", "gpt2/vocab.bpe", "tiktoken/cl100k_base.tiktoken", "gpt-neox/tokenizer.json"):
        if not (root / rel).is_file():
            _missing(f"{root / rel}")
    return root


@pytest.fixture(scope="session")
def gpt2_run(tmp_path_factory, wet_files, tokenizer_files) -> Path:
    """GPT-2's vocabulary on both WET files, 4 tasks: uint16 shards, several per split."""

    def make(folder: Path) -> None:
        run(from_dict(config(folder / "gpt2", wet_files, {"path": str(tokenizer_files / "gpt2")})))

    return made_once(tmp_path_factory, "tokens_gpt2", make) / "gpt2"


@pytest.fixture(scope="session")
def cl100k_run(tmp_path_factory, shared_data, tokenizer_files) -> Path:
    """cl100k: uint32 shards (ids up to 100276, so above 65535), small ones so that a split spans several."""

    def make(folder: Path) -> None:
        tok = {"path": str(tokenizer_files / "tiktoken" / "cl100k_base.tiktoken")}
        run(from_dict(config(folder / "cl100k", [shared_data / WET_2017], tok, tasks=1, shard_tokens=20_000)))

    return made_once(tmp_path_factory, "tokens_cl100k", make) / "cl100k"
