"""The command line's own argument checks: a bad number is one line, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gristmill.cli import MAX_PLAN_GB, main

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "crawl.yaml")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--gb", "inf"], "argument --gb: expected a size in GB above 0 and at most 10,000,000 (10 PB, "),
        (["--gb", "1e300"], "argument --gb: expected a size in GB above 0 and at most 10,000,000"),
        (["--gb", "nan"], "argument --gb: expected a size in GB above 0"),
        (["--gb", "-5"], "argument --gb: expected a size in GB above 0"),
        (["--gb", "0"], "argument --gb: expected a size in GB above 0"),
        (["--gb", "lots"], "argument --gb: expected a size in GB, e.g. 150, got 'lots'"),
        (["--files", "0"], "argument --files: expected between 1 and 66,666,666 WET files"),
        (["--files", "-2"], "argument --files: expected between 1 and 66,666,666 WET files"),
        (["--files", "66666667"], "argument --files: expected between 1 and 66,666,666 WET files"),
        (["--cores", "0"], "argument --cores: expected at least 1 core, got 0"),
        (["--cores", "-3"], "argument --cores: expected at least 1 core, got -3"),
        (["--cores", "1.5"], "argument --cores: expected a number of cores, e.g. 16, got '1.5'"),
    ],
)
def test_plan_refuses_sizes_and_cores_it_cannot_project(args, line, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", CONFIG, *args])
    assert e.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"pipeline plan: error: {line}"), last


def test_plan_projects_the_largest_size_it_accepts(monkeypatch):
    """The bound itself projects (no overflow in any memory model): a table, every stage flagged
    or not, and no traceback; 1e300 GB used to end in OverflowError."""
    monkeypatch.chdir(REPO)
    for args in (["--gb", str(MAX_PLAN_GB)], ["--files", "66666666"]):
        res = subprocess.run(
            [sys.executable, "-m", "gristmill.cli", "plan", "configs/slurm-crawl.yaml", *args, "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode in (0, 1), res.stderr
        assert "Traceback" not in res.stderr and '"stages"' in res.stdout
