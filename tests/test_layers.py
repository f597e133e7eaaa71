"""Imports run one way (docs/architecture.md, "Layers"); no module imports itself through others.

Read from the source with `ast`, so a lazy import inside a function counts like any other:
deferring an import hides a dependency from the reader, it does not remove it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# (prefix, layer); the longest matching prefix wins. Lower layers never import higher ones.
LAYERS = [
    ("gristmill", 0),
    ("gristmill.core", 0),
    ("gristmill.compat", 0),
    ("gristmill.dirlock", 0),
    ("gristmill.text", 1),
    ("gristmill.input", 1),
    ("gristmill.filters", 2),
    ("gristmill.dedup", 2),
    ("gristmill.tokenize", 2),
    ("gristmill.config", 3),
    ("gristmill.pipeline", 3),
    ("gristmill.stats", 3),
    ("gristmill.cli", 4),
    ("gristmill.ablation", 4),
]
# The trainer stands beside the pipeline: it may use the core and the token-shard reader alone,
# and the pipeline starts it through its torch-free launcher alone.
TRAINER = "gristmill.trainer"
TRAINER_MAY_IMPORT = (
    "gristmill.core.configlib",
    "gristmill.core.messages",
    "gristmill.dirlock",
    "gristmill.compat",
    "gristmill.tokenize.reader",
    "gristmill.trainer",
)
PIPELINE_MAY_IMPORT_OF_TRAINER = ("gristmill.trainer.launch",)
# Evaluation (tasks, scoring, statistics) sits below the trainer: it knows no model of ours and
# uses the core and the token-shard reader alone; the trainer scores with it (during training, and
# `pipeline eval`: trainer/evaluate.py, which loads the models). Only the CLI imports it otherwise.
EVALUATION = "gristmill.evaluation"
EVALUATION_MAY_IMPORT = tuple(p for p in TRAINER_MAY_IMPORT if p != TRAINER) + ("gristmill.evaluation",)
# The top: the CLI, and the ablation (`pipeline ablate`), which runs the pipeline, the trainer's
# launcher and plan, and compares with evaluation, as the CLI's commands do one by one.
TOP = ("gristmill.cli", "gristmill.ablation")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "gristmill").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    typing_only = set()  # `if TYPE_CHECKING:` imports are for annotations, not run
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            typing_only.update(id(n) for b in node.body for n in ast.walk(b))
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t == "gristmill" or t.startswith("gristmill."))
    return found - {name}


def _layer(module: str) -> int:
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def _in(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in graph.items():
        for t in sorted(targets):
            if t == "gristmill":  # the package itself: its version, nothing else
                continue
            if _in(mod, [EVALUATION]):
                if not _in(t, EVALUATION_MAY_IMPORT):
                    bad.append(f"{mod} -> {t} (evaluation uses the core and the token-shard reader only)")
            elif _in(mod, [TRAINER]):
                if not _in(t, [*TRAINER_MAY_IMPORT, EVALUATION]):
                    bad.append(f"{mod} -> {t} (the trainer uses the core and the token-shard reader only)")
            elif _in(t, [EVALUATION]):
                if not _in(mod, TOP):
                    bad.append(f"{mod} -> {t} (only the CLI and the trainer use evaluation)")
            elif _in(t, [TRAINER]):
                if not (_in(mod, TOP) or (_in(mod, ["gristmill.pipeline"]) and _in(t, PIPELINE_MAY_IMPORT_OF_TRAINER))):
                    bad.append(f"{mod} -> {t} (only the CLI uses the trainer; the pipeline starts it via its launcher)")
            elif _layer(t) > _layer(mod):
                bad.append(f"{mod} (layer {_layer(mod)}) -> {t} (layer {_layer(t)})")
    return bad


def test_imports_run_down_the_layers():
    bad = violations(_graph())
    assert not bad, "imports against the layering:\n  " + "\n  ".join(bad)


def test_the_checker_catches_each_kind_of_violation():
    fake = {
        "gristmill.filters.x": {"gristmill.pipeline.planning.planner", "gristmill.core.step"},
        "gristmill.core.y": {"gristmill.text.words"},
        "gristmill.trainer.z": {"gristmill.filters.langid", "gristmill.tokenize.reader"},
        "gristmill.pipeline.w": {"gristmill.trainer.train", "gristmill.trainer.launch"},
        "gristmill.evaluation.v": {"gristmill.pipeline.runner", "gristmill.trainer.model"},
        "gristmill.trainer.u": {"gristmill.evaluation.tasks", "gristmill.pipeline.runner"},
        "gristmill.filters.t": {"gristmill.evaluation.tasks"},
        "gristmill.ablation.s": {"gristmill.evaluation.compare", "gristmill.trainer.launch", "gristmill.cli"},
    }
    assert violations(fake) == [
        "gristmill.filters.x (layer 2) -> gristmill.pipeline.planning.planner (layer 3)",
        "gristmill.core.y (layer 0) -> gristmill.text.words (layer 1)",
        "gristmill.trainer.z -> gristmill.filters.langid (the trainer uses the core and the token-shard reader only)",
        "gristmill.pipeline.w -> gristmill.trainer.train (only the CLI uses the trainer; the pipeline starts it via "
        "its launcher)",
        "gristmill.evaluation.v -> gristmill.pipeline.runner (evaluation uses the core and the token-shard reader"
        " only)",
        "gristmill.evaluation.v -> gristmill.trainer.model (evaluation uses the core and the token-shard reader only)",
        "gristmill.trainer.u -> gristmill.pipeline.runner (the trainer uses the core and the token-shard reader only)",
        "gristmill.filters.t -> gristmill.evaluation.tasks (only the CLI and the trainer use evaluation)",
    ]


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for t in sorted(graph.get(node, ())):
            if t not in graph:
                continue
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t) :] + [t]))
            elif t not in state:
                visit(t, stack + [t])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # a package's __init__ re-exporting its submodules is not a cycle of design
    cycles = [c for c in cycles if not all(p.startswith(c.split(" -> ")[0]) for p in c.split(" -> "))]
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_no_cycles_between_packages():
    """The layering holds between packages too (gristmill.config, gristmill.pipeline, ...): no
    package imports one that imports it back, through any of their modules."""

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges: dict[str, set[str]] = {}
    for mod, targets in _graph().items():
        for t in targets:
            a, b = package(mod), package(t)
            if a != b and b != "gristmill":
                edges.setdefault(a, set()).add(b)
    both = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if a < b and a in edges.get(b, ()))
    assert not both, "packages that import each other: " + ", ".join(both)
