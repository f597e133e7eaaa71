"""The config library shared by the run config (`gristmill.config`), every step's nested
`Config`, and the trainer's config (`gristmill.trainer.config`).

Errors name the key path the user wrote (`steps[2].langid.min_score: expected a number between
0 and 1, got 'high'`), so a typo in a 40-line config is found in one look. Strings may use
`${VAR}` / `${VAR:-default}`; `--set dotted.key=value` overrides are applied before validation.
"""

from __future__ import annotations

import os
import re
import typing
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, field_validator

__all__ = ["ConfigError", "Fraction", "Strict", "apply_override", "interpolate", "messages"]


class ConfigError(ValueError):
    """A configuration problem; the message names every offending key path."""


def _fraction(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"expected a number between 0 and 1, got {value!r}")
    return float(value)


Fraction = Annotated[float, BeforeValidator(_fraction)]


def _numeric_types(annotation: Any) -> set[type]:
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) is not Annotated:
        return set().union(*(_numeric_types(a) for a in args))
    base = args[0] if args else annotation
    return {base} & {int, float, bool}


class Strict(BaseModel):
    """A config section: unknown keys are errors, and `true` is no number."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info) -> Any:
        # pydantic turns `true` into 1 for an int field; `--set executor.tasks=true` is a mistake
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            kinds = _numeric_types(cls.model_fields[info.field_name].annotation)
            if kinds and bool not in kinds:
                raise ValueError(f"expected a number, got {str(value).lower()}")
        return value



_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(node: Any, path: str, errors: list[str]) -> Any:
    """`${VAR}` / `${VAR:-default}` in every string of `node`; unset variables append to `errors`."""
    if isinstance(node, dict):
        return {k: interpolate(v, f"{path}.{k}" if path else str(k), errors) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, f"{path}[{i}]", errors) for i, v in enumerate(node)]
    if isinstance(node, str):

        def sub(m: re.Match) -> str:
            value = os.environ.get(m.group(1))
            if value is None or (value == "" and m.group(2) is not None):
                if m.group(2) is None:
                    errors.append(f"{path}: environment variable {m.group(1)} is not set (use ${{{m.group(1)}:-default}})")
                    return m.group(0)
                return m.group(2)
            return value

        return _VAR.sub(sub, node)
    return node


_KEY = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def apply_override(data: dict, assignment: str) -> None:
    """Apply `a.b[0].c=value` (or `a.b.0.c=value`); the value is parsed as YAML."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected dotted.key=value")
    key, raw = assignment.split("=", 1)
    parts: list[str | int] = []
    for m in _KEY.finditer(key):
        token = m.group(1) if m.group(1) is not None else m.group(2)
        parts.append(int(token) if token.isdigit() else token)
    if not parts:
        raise ConfigError(f"--set {assignment!r}: empty key")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {key}: value is not valid YAML: {e}") from None
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        where = key if i == 0 else ".".join(map(str, parts[: i + 1]))
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise ConfigError(f"--set {key}: no list item [{part}] at {where}")
            node = node[part]
        else:
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {where} is not a mapping")
            # a step entry `- langid: {}` may hold None for its parameters
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ConfigError(f"--set {key}: no list item [{last}]")
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"--set {key}: parent is not a mapping")


def _loc(prefix: str, loc: tuple) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            continue  # pydantic's internal validator frames, not user keys
        else:
            out += f".{part}" if out else str(part)
    return out


def messages(err: ValidationError, prefix: str, model: type[BaseModel] | None = None) -> list[str]:
    """One line per pydantic error, each naming the key path the user wrote (under `prefix`)."""
    msgs = []
    for e in err.errors():
        where = _loc(prefix, e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = ""
            if model is not None and len(e["loc"]) == 1:
                allowed = f" (allowed: {', '.join(model.model_fields)})"
            msgs.append(f"{where}: unknown key{allowed}")
        elif e["type"] == "missing":
            msgs.append(f"{where}: required key is missing")
        elif e["type"] == "value_error":
            msgs.append(f"{where}: {str(e['ctx']['error'])}")
        else:
            msgs.append(f"{where}: {e['msg'].lower()}, got {e['input']!r}")
    return msgs
