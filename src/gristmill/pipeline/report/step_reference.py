"""The step reference, written from the registered steps: `pipeline steps` prints it, and
docs/steps.md holds this text between its markers (a test keeps the two equal;
`python -m gristmill.pipeline.report.step_reference` rewrites it there).

Each step contributes its YAML name, the first paragraph of its docstring (or of its module's),
what it writes onto documents, and every parameter of its `Config` with default and description.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

from gristmill.core.configlib import FilterConfig
from gristmill.core.step import STEP_MODULES, registered_steps

BEGIN = "<!-- steps: written by `pipeline steps --markdown`; edit the steps' docstrings and Configs -->"
END = "<!-- /steps -->"
#: the page that holds the reference, in a source checkout (the path tests and `update` use)
DOC = Path(__file__).resolve().parents[4] / "docs" / "steps.md"


def _summary(cls) -> str:
    doc = inspect.getdoc(cls) if cls.__doc__ else inspect.getdoc(sys.modules[cls.__module__])
    return " ".join((doc or "").split("\n\n")[0].split())


def _default(field) -> str:
    if field.is_required():
        return "required"
    return json.dumps(field.get_default(call_default_factory=True), ensure_ascii=False, default=str)


def reference(shipped_only: bool = False) -> list[dict]:
    """Every registered step (a plugin's or a test's too), or gristmill's own (`STEP_MODULES`)."""
    out = []
    for name, cls in registered_steps().items():
        if shipped_only and cls.__module__ not in STEP_MODULES:
            continue
        # a filter's own parameters first, then FilterConfig's `per_language`, which overrides them
        fields = sorted(cls.Config.model_fields.items(), key=lambda item: item[0] in FilterConfig.model_fields)
        params = [{"name": p, "default": _default(f), "description": f.description or ""} for p, f in fields]
        out.append(
            {
                "name": name,
                "module": cls.__module__,
                "summary": _summary(cls),
                "kind": "streaming" if cls.streamable else "global (plans its own stages)",
                "writes": sorted(cls.output_fields),
                "drops": list(cls.drop_reasons),
                "params": params,
            }
        )
    return out


def markdown(shipped_only: bool = False) -> str:
    lines = [BEGIN, ""]
    for step in reference(shipped_only):
        path = "src/" + step["module"].replace(".", "/") + ".py"
        writes = f" Writes {', '.join(f'`{w}`' for w in step['writes'])}." if step["writes"] else ""
        drops = f" Drop reasons: {', '.join(f'`{d}`' for d in step['drops'])}." if step["drops"] else ""
        lines.append(f"- **`{step['name']}`** ({step['kind']}; `{path}`) — {step['summary']}{writes}{drops}")
        for p in step["params"]:
            desc = f": {p['description']}" if p["description"] else ""
            lines.append(f"  - `{p['name']}` = `{p['default']}`{desc}")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def block(text: str) -> str:
    """The reference as it stands in a page's text: BEGIN to END, markers included."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"no step reference markers ({BEGIN} ... {END})")
    return text[text.index(BEGIN) : text.index(END) + len(END)] + "\n"


def update(path: Path = DOC) -> bool:
    """Rewrite the reference between the page's markers from the shipped steps; True if it changed."""
    text = path.read_text()
    new = markdown(shipped_only=True)
    if block(text) == new:
        return False
    start, end = text.index(BEGIN), text.index(END) + len(END)
    path.write_text(text[:start] + new.removesuffix("\n") + text[end:])
    return True


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DOC
    print(f"{target}: {'rewritten' if update(target) else 'already up to date'}")
