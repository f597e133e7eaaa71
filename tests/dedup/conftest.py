"""A small ground-truth corpus built from the real texts in ../shared/data (once per session)."""

from __future__ import annotations

import sys

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.fixture(scope="session")
def dedup_corpus(shared_data, tmp_path_factory):
    from make_dedup_corpus import build

    out = tmp_path_factory.mktemp("dedup_corpus")
    build(out, 5000, seed=7, data=shared_data, progress=False, per_file=800)
    return out


@pytest.fixture(scope="session")
def corpus_ids(dedup_corpus) -> list[str]:
    return pq.read_table(dedup_corpus / "docs", columns=["id"]).column("id").to_pylist()
