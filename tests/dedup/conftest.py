"""A small ground-truth corpus built from the real texts in ../shared/data (once per run)."""

from __future__ import annotations

import sys

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, made_once

sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.fixture(scope="session")
def dedup_corpus(shared_data, tmp_path_factory):
    from make_dedup_corpus import build

    return made_once(
        tmp_path_factory,
        "dedup_corpus",
        lambda out: build(out, 5000, seed=7, data=shared_data, progress=False, per_file=800),
    )


@pytest.fixture(scope="session")
def corpus_ids(dedup_corpus) -> list[str]:
    return pq.read_table(dedup_corpus / "docs", columns=["id"]).column("id").to_pylist()


@pytest.fixture(scope="session")
def near_dedup_run(dedup_corpus, tmp_path_factory):
    """near_dedup at threshold 0.8 over the corpus in 2 tasks, run once: the recall test reads what
    it kept, the bounded-memory test compares its run in small parts with it. Its stages (read-only)."""
    from gristmill.pipeline.planning.on_parquet import plan_on_parquet, run_on_parquet

    def args(folder):
        return "near_dedup", {"threshold": 0.8}, dedup_corpus / "docs", folder / "run", 2

    folder = made_once(tmp_path_factory, "near_dedup_run", lambda out: run_on_parquet(*args(out)))
    return plan_on_parquet(*args(folder))  # the stages of that run, where it wrote them
