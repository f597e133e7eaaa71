"""The step reference in docs/steps.md is what the registered steps say of themselves, and the
drop reasons a step declares are the ones it uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gristmill.core.step import STEP_MODULES, registered_steps
from gristmill.pipeline.report.step_reference import BEGIN, DOC, END, block, markdown, update

STEPS_DOC = Path(__file__).resolve().parents[1] / "docs" / "steps.md"


def test_docs_step_reference_is_generated_from_the_steps():
    assert DOC == STEPS_DOC
    text = STEPS_DOC.read_text()
    assert BEGIN in text and END in text
    assert block(text) == markdown(shipped_only=True), (
        "docs/steps.md is stale: run `python -m gristmill.pipeline.report.step_reference` to rewrite it"
    )


def test_update_rewrites_only_the_reference(tmp_path):
    page = tmp_path / "steps.md"
    page.write_text(f"# Steps\n\nbefore\n\n{BEGIN}\n\n- a stale entry\n\n{END}\n\nafter\n")
    assert update(page) is True
    text = page.read_text()
    assert text == f"# Steps\n\nbefore\n\n{markdown(shipped_only=True)}\nafter\n"
    assert update(page) is False and page.read_text() == text


def test_every_shipped_step_module_registers_a_step_with_a_documented_config():
    steps = registered_steps()
    shipped = {cls.__module__ for cls in steps.values()}
    assert set(STEP_MODULES) <= shipped
    for name, cls in steps.items():
        if cls.__module__ not in STEP_MODULES:
            continue
        for field, info in cls.Config.model_fields.items():
            assert info.description, f"{name}.{field} has no description"


@pytest.mark.parametrize("step", ["langid", "gopher_quality", "gopher_repetition", "c4_lines"])
def test_declared_drop_reasons_are_the_ones_used(step, wet_files, lid_model):
    from gristmill.input.wet import WetReader

    cls = registered_steps()[step]
    params = {"model": str(lid_model), "languages": ["en"]} if step == "langid" else {}
    flt = cls(**params)
    docs = list(WetReader([str(p) for p in wet_files]).run())
    list(flt.run(iter(docs)))
    seen = {k[len("dropped_") :] for k in flt.stats.stats if k.startswith("dropped_")}
    patterns = [re.compile("^" + re.sub(r"<[a-z]+>", r"[a-z0-9]+", r) + "$") for r in cls.drop_reasons]
    assert seen, f"{step} dropped nothing on the sample"
    undeclared = [r for r in seen if not any(p.match(r) for p in patterns)]
    assert not undeclared, f"{step} drops under undeclared reasons {undeclared}"


def test_architecture_docs_example_step_works():
    """The "Adding a step" example in docs/architecture.md, executed as written."""
    from datatrove.data import Document

    from gristmill.config import from_dict

    doc_md = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    code = re.search(r"```python\n(# src/gristmill/filters/min_lines.py.*?)```", doc_md, re.S).group(1)
    namespace = {"__name__": "docs_example_min_lines"}
    exec(compile(code, "docs/architecture.md", "exec"), namespace)
    assert registered_steps()["min_lines"] is namespace["MinLines"]
    cfg = from_dict({"input": {"paths": ["x"]}, "steps": [{"min_lines": {"min_lines": 2}}]})
    step = namespace["MinLines"](cfg.specs[0].params)
    assert step.filter_batch([Document(text="one\n\ntwo", id="a")])[0] is True
    assert step.filter_batch([Document(text="one line", id="b")])[0] == (False, "too_few_lines")
