"""Token-shard runs on the real WET sample, each made once per module (see test_tokens.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import _missing


@pytest.fixture(scope="session")
def tokenizer_files(shared_data) -> Path:
    root = shared_data / "tokenizers"
    for rel in ("gpt2/encoder.json", "gpt2/vocab.bpe", "tiktoken/cl100k_base.tiktoken", "gpt-neox/tokenizer.json"):
        if not (root / rel).is_file():
            _missing(f"{root / rel}")
    return root
