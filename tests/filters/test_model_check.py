"""Damaged model files are one clear error in the planning process, before any stage starts.

Built from the real models: truncated copies (cut in the header, the dictionary, the matrices,
one byte short), flipped bytes, a text file named .ftz. fastText segfaults, allocates many GB,
or silently scores with zeros on such files; KenLM loads a binary cut in its vocabulary list.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from gristmill.config import from_dict
from gristmill.filters import model_check
from gristmill.filters.kenlm import KenLM
from gristmill.filters.langid import LangId
from gristmill.filters.model_check import ModelError, trial_load
from gristmill.filters.quality import Quality
from gristmill.pipeline.planning.planner import plan
from tests.cli_process import pipeline

LID_CUTS = [2, 4, 60, 100, 5000, 500000, 900000, 937000, 938012]  # 900000: fastText segfaults


def copy_cut(src: Path, dst: Path, cut: int) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes()[:cut])
    return dst


def flipped(src: Path, dst: Path, offset: int) -> Path:
    data = bytearray(src.read_bytes())
    for i in range(offset, offset + 16):
        data[i] ^= 0xFF
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("cut", LID_CUTS)
def test_truncated_lid_model_is_refused_when_the_step_is_built(tmp_path, lid_model, cut):
    bad = copy_cut(lid_model, tmp_path / f"cut{cut}" / "lid.176.ftz", cut)
    with pytest.raises(ModelError) as e:
        LangId(model=str(bad))
    msg = str(e.value)
    assert msg.startswith(f"{bad}: ") and "\n" not in msg
    assert "not a fastText model" in msg if cut < 4 else "truncated or corrupt fastText model" in msg
    assert "expected the 938,013-byte lid.176.ftz" in msg


@pytest.mark.parametrize("offset", [8, 60, 400000, 937000])
def test_flipped_bytes_in_lid_model_are_refused(tmp_path, lid_model, offset):
    """At 400000 and 937000 fastText loads the damaged file and predicts: only the published
    file's sha256 tells."""
    bad = flipped(lid_model, tmp_path / "lid.176.ftz", offset)
    with pytest.raises(ModelError, match=r"corrupt fastText model .*expected the 938,013-byte lid.176.ftz") as e:
        LangId(model=str(bad))
    assert str(bad) in str(e.value)


def test_text_file_named_ftz_is_refused(tmp_path, wet_files):
    bad = tmp_path / "lid.176.ftz"
    bad.write_text("this is a text file, not a model\n" * 100)
    with pytest.raises(ModelError, match=rf"{bad}: not a fastText model \(it starts with b'this is a text f'"):
        LangId(model=str(bad))


@pytest.mark.parametrize("fraction", [0.0001, 0.01, 0.5, 0.999])
def test_truncated_quality_model_is_refused(tmp_path, quality_model, fraction):
    size = quality_model.stat().st_size
    bad = copy_cut(quality_model, tmp_path / "en.bin", int(size * fraction))
    with pytest.raises(ModelError, match=r"truncated or corrupt fastText model \(the file ends at byte") as e:
        Quality(model=str(bad))
    assert str(e.value).startswith(f"{bad}: ")
    assert "expected a complete fastText classifier" in str(e.value)


def test_quality_model_cut_one_byte_short_is_refused(tmp_path, quality_model):
    """fastText loads this one without complaint (its last weight partly zero)."""
    bad = copy_cut(quality_model, tmp_path / "en.bin", quality_model.stat().st_size - 1)
    with pytest.raises(ModelError, match="inside the output matrix"):
        Quality(model=str(bad))


def _word_boundary_cut(data: bytes) -> int:
    return data.rindex(b"\0", 0, len(data) - 1) + 1  # drops exactly the last vocabulary word


@pytest.mark.parametrize("cut", ["5000", "half", "vocab", "word", "one byte short"])
def test_truncated_kenlm_binary_is_refused(tmp_path, kenlm_model, cut):
    data = kenlm_model.read_bytes()
    n = {
        "5000": 5000,
        "half": len(data) // 2,
        "vocab": len(data) - 1000,
        "word": _word_boundary_cut(data),
        "one byte short": len(data) - 1,
    }[cut]
    bad = copy_cut(kenlm_model, tmp_path / "en.arpa.bin", n)
    with pytest.raises(ModelError, match=r"truncated or corrupt KenLM binary") as e:
        KenLM(models={"en": str(bad)}, default_language="en")
    assert str(e.value).startswith(f"{bad}: ") and "\n" not in str(e.value)


def test_trial_load_survives_a_segfault(tmp_path, kenlm_model):
    """The child process takes the crash (a real one, in native code); planning only hears of it."""
    crash = "import ctypes, sys; ctypes.string_at(0)"
    with pytest.raises(ModelError, match="^KenLM could not load it: killed by SIGSEGV$"):
        trial_load(crash, kenlm_model, "KenLM")


@pytest.mark.parametrize(
    ("offset", "value", "reason"),
    [
        (32, 99, "unknown fastText loss 99"),  # Args: magic, version, dim, ws, epoch, minCount, neg, wordNgrams, loss
        (36, 1, "not a supervised fastText model"),  # model: cbow
        (4, 13, "fastText file format version 13"),
        (8, 0, "impossible vector dimension 0 in the header"),
    ],
)
def test_a_header_damaged_inside_its_layout_is_refused(tmp_path, lid_model, offset, value, reason):
    """Values that keep the layout intact but no fastText model has (fastText refused an unknown
    loss on load; gristmill's reader refuses them all before any prediction)."""
    data = bytearray(lid_model.read_bytes())
    struct.pack_into("<i", data, offset, value)
    bad = tmp_path / "langid.ftz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=rf"^{bad}: truncated or corrupt fastText model \({reason}"):
        LangId(model=str(bad))


def test_a_model_is_read_once_per_file_version(tmp_path, lid_model, monkeypatch):
    calls = []
    real = model_check.read_model
    monkeypatch.setattr(model_check, "read_model", lambda *a: calls.append(a) or real(*a))
    good = tmp_path / "lid.176.ftz"
    good.write_bytes(lid_model.read_bytes())
    for _ in range(3):
        LangId(model=str(good))
    assert len(calls) == 1
    os.utime(good, ns=(0, 12345))  # a new mtime: another version of the file, checked again
    LangId(model=str(good))
    assert len(calls) == 2


def test_model_changed_after_planning_is_not_loaded(tmp_path, lid_model):
    model = tmp_path / "lid.176.ftz"
    model.write_bytes(lid_model.read_bytes())
    step = LangId(model=str(model))
    model.write_bytes(lid_model.read_bytes()[:900000])  # replaced by a broken copy before the task ran
    with pytest.raises(ModelError, match="changed since the run was planned"):
        next(step.run(iter([])))


def _cfg(tmp_path: Path, wet_files, step: dict) -> dict:
    return {
        "run_dir": str(tmp_path / "run"),
        "executor": {"type": "local", "tasks": 2, "workers": 2},
        "input": {"paths": [str(p) for p in wet_files]},
        "steps": [step],
    }


def _bad_models(tmp_path: Path, lid_model, kenlm_model, quality_model) -> dict[str, tuple[dict, Path]]:
    lid = copy_cut(lid_model, tmp_path / "models" / "lid.176.ftz", 900000)
    lm = copy_cut(kenlm_model, tmp_path / "models" / "kenlm" / "en.arpa.bin", kenlm_model.stat().st_size // 2)
    q = copy_cut(quality_model, tmp_path / "models" / "quality" / "en.bin", quality_model.stat().st_size - 1)
    return {
        "langid": ({"langid": {"model": str(lid)}}, lid),
        "kenlm": ({"kenlm": {"models": {"en": str(lm)}}}, lm),
        "quality": ({"quality": {"model": str(q)}}, q),
    }


@pytest.mark.parametrize("kind", ["langid", "kenlm", "quality"])
def test_planning_raises_and_cli_exits_2_with_one_line(
    tmp_path, wet_files, lid_model, kenlm_model, quality_model, kind
):
    step, bad = _bad_models(tmp_path, lid_model, kenlm_model, quality_model)[kind]
    cfg = _cfg(tmp_path, wet_files, step)
    with pytest.raises(ModelError, match=str(bad)):
        plan(from_dict(cfg))
    path = tmp_path / "crawl.yaml"
    path.write_text(json.dumps(cfg))
    res = pipeline("run", str(path), timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: truncated or corrupt"), res.stderr
    assert not (tmp_path / "run").exists()  # no stage started, nothing written
