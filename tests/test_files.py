"""Files written whole (`gristmill.core.files`) by several writers at once: each near-dedup
signature task writes its stage's `lsh.json`, and a temporary name they shared was renamed away
under the others ("No such file ... lsh.json.tmp -> lsh.json")."""

from __future__ import annotations

import json
import multiprocessing
import threading
from pathlib import Path

import numpy as np

from gristmill.core.files import save_npy_atomic, temporary_path, write_text_atomic

WRITES = 300


def _write_many(path: str, writer: int, errors) -> None:
    body = json.dumps({"writer": writer, "pad": "x" * 20_000})  # a write that takes a while
    for _ in range(WRITES):
        try:
            write_text_atomic(Path(path), body)
        except Exception as e:  # noqa: BLE001 - the test counts every failure
            errors.append(f"{type(e).__name__}: {e}")
            return


def _process_writer(path: str, writer: int, queue) -> None:
    errors: list[str] = []
    _write_many(path, writer, errors)
    queue.put(errors)


def test_concurrent_writers_of_one_file_all_succeed_and_leave_one_whole_file(tmp_path):
    path = tmp_path / "stage" / "lsh.json"
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_process_writer, args=(str(path), w, queue)) for w in range(4)]
    thread_errors: list[str] = []
    threads = [threading.Thread(target=_write_many, args=(str(path), 10 + w, thread_errors)) for w in range(3)]
    for p in procs:
        p.start()
    for t in threads:
        t.start()
    # a reader meanwhile: every read is one writer's file whole
    seen = set()
    while any(p.is_alive() for p in procs) or any(t.is_alive() for t in threads):
        if path.exists():
            seen.add(json.loads(path.read_text())["writer"])
    for t in threads:
        t.join()
    errors = [e for p in procs for e in queue.get(timeout=60)] + thread_errors
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert errors == []
    final = json.loads(path.read_text())
    assert final["writer"] in {0, 1, 2, 3, 10, 11, 12} and len(final["pad"]) == 20_000
    assert seen and seen <= {0, 1, 2, 3, 10, 11, 12}
    assert sorted(p.name for p in path.parent.iterdir()) == ["lsh.json"]  # no temporary file left


def test_temporary_names_differ_per_writer_and_end_in_tmp(tmp_path):
    names = {temporary_path(tmp_path / "a.npy") for _ in range(1000)}
    assert len(names) == 1000 and all(n.name.startswith("a.npy.") and n.name.endswith(".tmp") for n in names)
    save_npy_atomic(tmp_path / "a.npy", np.arange(3))
    assert np.load(tmp_path / "a.npy").tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["a.npy"]
