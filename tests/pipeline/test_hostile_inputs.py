"""Inputs a glob can reach that are no WET file (a FIFO, a device, a socket, a file of secrets),
and crawl records carrying NUL and escape bytes: refused or reported in one inert line, counted
once."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from gristmill.config import ConfigError, from_dict
from gristmill.input.sources import fetcher_for, resolve
from gristmill.input.wet import WetRecord, iter_wet_records, printable
from tests.cli_process import pipeline

SECRET = "root:$6$Zr0Jx8Qk$Vd1yqk7P7nQ0H2mVbG1Yy9Z8r.hT3sF0Lq6p0e1Q2w3E4r5T6y7U8i9O0pA1sD2fG3hJ4k:19000:0:99999:7:::\n"


def _cli(*args, timeout=120) -> subprocess.CompletedProcess:
    # a FIFO opened for reading would wait here forever: the timeout
    return pipeline(*args, env={**os.environ, "COLUMNS": "200"}, timeout=timeout, text=False)


def _config(tmp_path: Path, paths: list, **extra) -> Path:
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "executor": {"type": "local", "tasks": 1, "workers": 1},
        "input": {"paths": [str(p) for p in paths]},
        "steps": [],
        "output": {"dropped_sample": 0.0},
        **extra,
    }
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture
def odd_files(tmp_path):
    """A FIFO, a Unix socket and two character devices, each with the type its message names."""
    fifo = tmp_path / "in" / "crawl-00001.warc.wet.gz"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    sock_path = tmp_path / "in" / "crawl-00002.warc.wet.gz"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    yield {
        fifo: "a FIFO",
        sock_path: "a socket",
        Path("/dev/null"): "a character device",
        Path("/dev/zero"): "a character device",
    }
    sock.close()


def test_fifo_device_and_socket_are_refused_when_planned(odd_files, tmp_path, wet_files):
    for path, what in odd_files.items():
        cfg = from_dict(json.loads(_config(tmp_path, [wet_files[1], path]).read_text()))
        with pytest.raises(ConfigError) as e:
            resolve(cfg.input, fetcher_for(cfg.input.commoncrawl))
        assert str(e.value) == f"input.paths[1]: {path} is {what}, not a file"
    # reached by a glob beside a real file: the glob's match is named
    good = tmp_path / "in" / "crawl-00000.warc.wet.gz"
    os.symlink(wet_files[1], good)
    cfg = from_dict(json.loads(_config(tmp_path, [tmp_path / "in" / "*.warc.wet.gz"]).read_text()))
    with pytest.raises(ConfigError, match=r"input.paths\[0\]: .*crawl-00001.warc.wet.gz is a FIFO, not a file"):
        resolve(cfg.input, fetcher_for(cfg.input.commoncrawl))


def test_a_fifo_input_is_one_line_and_exit_2_not_a_hang(odd_files, tmp_path, wet_files):
    fifo = next(p for p, what in odd_files.items() if what == "a FIFO")
    res = _cli("run", _config(tmp_path, [wet_files[1], fifo]))
    stderr = res.stderr.decode()
    assert res.returncode == 2, stderr
    assert stderr.strip().splitlines() == [f"error: input.paths[1]: {fifo} is a FIFO, not a file"]
    assert not (tmp_path / "run").exists()


def test_a_broken_link_among_the_inputs_is_named(tmp_path, wet_files):
    link = tmp_path / "gone.warc.wet.gz"
    os.symlink(tmp_path / "moved-away.warc.wet.gz", link)
    cfg = from_dict(json.loads(_config(tmp_path, [wet_files[1], link]).read_text()))
    with pytest.raises(ConfigError, match=rf"^input.paths\[1\]: {link}: No such file or directory$"):
        resolve(cfg.input, fetcher_for(cfg.input.commoncrawl))


def test_a_file_of_secrets_is_reported_without_its_content(tmp_path, wet_files):
    shadow = tmp_path / "etc" / "shadow"
    shadow.parent.mkdir()
    shadow.write_text(SECRET * 3)
    res = _cli("run", _config(tmp_path, [wet_files[1], tmp_path / "etc" / "*"]))
    stderr = res.stderr.decode()
    assert res.returncode == 0, stderr
    lines = [ln for ln in stderr.splitlines() if str(shadow) in ln]
    assert lines and all("not_gzip does not start with a gzip header (1f 8b 08) or WARC/" in ln for ln in lines)
    logs = b"".join(p.read_bytes() for p in (tmp_path / "run").rglob("*.log"))
    for what in (stderr.encode(), logs):  # neither the terminal nor the task's log
        assert b"root:" not in what and b"$6$" not in what and b"Zr0J" not in what and b"Vd1yqk" not in what
    stats = json.loads(_cli("stats", tmp_path / "run", "--json").stdout)
    assert stats["journey"][0]["docs_out"] == 43 and stats["journey"][0]["drops"] == {"not_gzip": 1}


# --- NUL and escape bytes from the crawl ---------------------------------------------------------

NUL_ID = "<urn:uuid:\x00\x1b[2Jcafe>"


def _wet_with_nuls(src: Path, dest: Path, n: int = 21) -> int:
    """`n` records of a real WET file, one gzip member each; every third carries NULs in its text
    and a Content-Length that leaves out the NUL padding after it (as a crawler that padded its
    buffer writes), and the first has NUL and ESC in its record id. Returns the flawed count."""
    records = [r for r in iter_wet_records(src) if isinstance(r, WetRecord)][:n]
    flawed = 0
    with open(dest, "wb") as out:
        out.write(
            gzip.compress(
                b"WARC/1.0\r\nWARC-Type: warcinfo\r\nWARC-Record-ID: <urn:uuid:0>\r\nContent-Length: 0\r\n\r\n\r\n\r\n"
            )
        )
        for i, rec in enumerate(records):
            body, rid = rec.text.encode(), rec.record_id
            declared = len(body)
            if i % 3 == 0:
                body = b"\x00\x00" + rec.text[:-2].encode() + b"\x00\r\n\r\n\x00\x00\x00\x00"
                declared = len(body) - 8
                rid = NUL_ID if i == 0 else rid
                flawed += 1
            head = (
                f"WARC/1.0\r\nWARC-Type: conversion\r\nWARC-Target-URI: {rec.url}\r\n"
                f"WARC-Record-ID: {rid}\r\nContent-Length: {declared}\r\n\r\n"
            ).encode()
            out.write(gzip.compress(head + body + b"\r\n\r\n"))
    return flawed


def test_nul_bytes_are_escaped_in_every_line_and_each_record_counted_once(tmp_path, wet_files):
    wet = tmp_path / "nul.warc.wet.gz"
    flawed = _wet_with_nuls(wet_files[1], wet)
    assert flawed == 7
    res = _cli("run", _config(tmp_path, [wet]))
    assert res.returncode == 0, res.stderr.decode()
    logs = b"".join(p.read_bytes() for p in (tmp_path / "run").rglob("*.log"))
    for what in (res.stderr, logs):  # what the terminal and the task's log received
        assert b"\x00" not in what and b"\x1b" not in what
    warned = [ln for ln in res.stderr.decode().splitlines() if "wrong_content_length" in ln]
    assert len(warned) == flawed
    assert any("<urn:uuid:\\x00\\x1b[2Jcafe>" in ln for ln in warned), warned
    stats = json.loads(_cli("stats", tmp_path / "run", "--json").stdout)
    read = stats["journey"][0]
    # 21 records: 21 documents, 7 of them with a flaw noted, none counted twice
    assert (read["docs_in"], read["docs_out"], read["dropped"]) == (21, 21, 0), read
    assert "kept despite wrong_content_length 7" in read["notes"], read["notes"]
    assert stats["funnel"][0]["docs_in"] == 21 and stats["funnel"][-1]["docs_out"] == 21
    shown = _cli("stats", tmp_path / "run").stdout
    assert b"\x00" not in shown and b"\x1b" not in shown


def test_printable_escapes_what_a_terminal_would_act_on():
    assert printable("a\x00b\x1b[2Jc\x07\u202ed\x9b") == "a\\x00b\\x1b[2Jc\\x07\\u202ed\\x9b"
    assert printable("plain text, ünïcode, 中文") == "plain text, ünïcode, 中文"
