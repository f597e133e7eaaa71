"""The config library shared by the run config (`gristmill.config`), every step's nested
`Config`, and the trainer's config (`gristmill.trainer.config`).

Errors name the key path the user wrote (`steps[2].langid.min_score: expected a number between
0 and 1, got 'high'`), so a typo in a 40-line config is found in one look. Strings may use
`${VAR}` / `${VAR:-default}`; `--set dotted.key=value` overrides are applied before validation.

Per-language parameters have one way: a filter's Config subclasses `FilterConfig`, which
carries `per_language` (and `language_fixed`, what it may not set) and validates it with the
filter's own Config; `language_configs` resolves it into one Config per language, which the
filter is handed with each document. Nothing rewrites a Config when its class is made.
"""

from __future__ import annotations

import copy
import os
import re
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

# ConfigError lives with the messages: the CLI reads it from there, without pydantic
from gristmill.core.messages import ConfigError, redact, url_userinfo, without_userinfo

__all__ = [
    "ConfigError",
    "FilterConfig",
    "Fraction",
    "LID176_LABELS",
    "OMIT_DEFAULT",
    "Strict",
    "apply_override",
    "interpolate",
    "key_path_error",
    "language_configs",
    "messages",
    "omitted_defaults",
    "validate_config",
]


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
    """A config section: unknown keys are errors, `true` is no number, and a float is finite.

    NaN compares false with everything, so a `.nan` threshold (a computed calibration file's
    likeliest fault) would switch its rule off without a word; `.inf` is no threshold either.
    Every float of every section, nested ones (`[[2, 0.2]]`) included, refuses both; a field
    for which infinity means something says so with `Field(..., allow_inf_nan=False)`.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info) -> Any:
        # pydantic turns `true` into 1 for an int field; `--set executor.tasks=true` is a mistake
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            kinds = _numeric_types(cls.model_fields[info.field_name].annotation)
            if kinds and bool not in kinds:
                raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


#: `Field(..., json_schema_extra=OMIT_DEFAULT)`: a parameter added after run directories were
#: made is left out of the run's config.yaml while it has its default, so that a run made
#: before it existed resumes (the run directory compares config.yaml key by key)
OMIT_DEFAULT = {"omit_default": True}


def omitted_defaults(params: BaseModel) -> list[str]:
    """The parameters of `params` marked OMIT_DEFAULT that have their default value."""
    return [
        name
        for name, f in type(params).model_fields.items()
        if (f.json_schema_extra or {}).get("omit_default") and getattr(params, name) == f.default
    ]


# --- per-language overrides -------------------------------------------------------------

#: the labels of fastText's lid.176 (what `langid` writes to `language`): the keys
#: `per_language` accepts, besides `default`. A typo ("cn", "chinese") would otherwise be a
#: setting that silently never applies.
LID176_LABELS = frozenset(
    """
af als am an ar arz as ast av az azb ba bar bcl be bg bh bn bo bpy br bs bxr ca cbk ce ceb ckb co
cs cv cy da de diq dsb dty dv el eml en eo es et eu fa fi fr frr fy ga gd gl gn gom gu gv he hi hif
hr hsb ht hu hy ia id ie ilo io is it ja jbo jv ka kk km kn ko krc ku kv kw ky la lb lez li lmo lo
lrc lt lv mai mg mhr min mk ml mn mr mrj ms mt mwl my myv mzn nah nap nds ne new nl nn no oc or os
pa pam pfl pl pms pnb ps pt qu rm ro ru rue sa sah sc scn sco sd sh si sk sl so sq sr su sv sw ta
te tg th tk tl tr tt tyv ug uk ur uz vec vep vi vls vo wa war wuu xal xmf yi yo yue zh
""".split()
)

#: the `per_language` key whose values apply to every language not listed
DEFAULT_LANGUAGE = "default"

PER_LANGUAGE_HELP = (
    "overrides of these parameters by the page's `language` (lid.176 label, or `default` for "
    "every other language): {zh: {param: value}}"
)


class FilterConfig(Strict):
    """The base of every filter's Config (a plugin's too): the filter's own parameters, plus an
    optional `per_language` mapping of partial configs.

    `per_language: {zh: {min_avg_word_length: 1}, default: {...}}`: each value holds some of
    the step's own parameters, validated by the step's own Config once merged (a bad key or
    value is an error naming the language and the key). `language_fixed` names the parameters
    that cannot differ by language (a model file, langid's keep-list). The filter never reads
    `per_language` itself: `language_configs` resolves it once, and the filter is handed the
    Config of each document's language (`core/filter.py`).
    """

    #: parameters that `per_language` may not set (a model file: one is loaded per step)
    language_fixed: typing.ClassVar[tuple[str, ...]] = ()

    per_language: dict[str, Any] | None = Field(None, description=PER_LANGUAGE_HELP, json_schema_extra=OMIT_DEFAULT)

    @model_validator(mode="after")
    def _check_per_language(self):
        if self.per_language:
            _resolve(self)  # raises with every problem listed
        return self

    @model_serializer(mode="wrap")
    def _per_language_last(self, handler):
        # a base's field comes first; in config.yaml the filter's own parameters lead, and
        # per_language (a calibration file's can be hundreds of lines) follows them
        data = handler(self)
        if isinstance(data, dict) and "per_language" in data:
            data["per_language"] = data.pop("per_language")
        return data


def _resolve(config: FilterConfig) -> dict[str, FilterConfig]:
    """{language: the complete Config of that language}, per key: the language's value, else
    `default`'s, else the top-level one. Every problem is collected into one error."""
    cls = type(config)
    names = [n for n in cls.model_fields if n != "per_language"]
    top = {n: getattr(config, n) for n in names}
    fixed = cls.language_fixed
    per = config.per_language or {}
    problems: list[str] = []
    partials: dict[str, dict] = {}
    for lang, partial in per.items():
        where = f"per_language.{lang}"
        if lang != DEFAULT_LANGUAGE and lang not in LID176_LABELS:
            problems.append(f"{where}: not a lid.176 language label (e.g. en, zh, fa) nor `{DEFAULT_LANGUAGE}`")
            continue
        if partial is None:
            partial = {}
        if not isinstance(partial, dict):
            problems.append(f"{where}: expected a mapping of parameters, got {partial!r}")
            continue
        for key in partial:
            if key == "per_language":
                problems.append(f"{where}.per_language: cannot be nested")
            elif key in fixed:
                problems.append(f"{where}.{key}: the same for every language in this step; set it at the top level")
        partials[lang] = partial
    out: dict[str, FilterConfig] = {}
    default = partials.get(DEFAULT_LANGUAGE, {})
    for lang, partial in partials.items():
        merged = {**top, **(default if lang != DEFAULT_LANGUAGE else {}), **partial}
        merged.pop("per_language", None)
        try:
            out[lang] = cls.model_validate(merged)
        except ValidationError as e:
            problems.extend(messages(e, f"per_language.{lang}", cls))
    if problems:
        raise key_path_error(problems)
    return out


def language_configs(config: BaseModel) -> tuple[dict[str, BaseModel], BaseModel]:
    """({language: its resolved Config}, the Config of every other language) of a step's
    config: built once when the step is, so a document costs one dict lookup."""
    if not getattr(config, "per_language", None):
        return {}, config
    resolved = _resolve(config)
    fallback = resolved.pop(DEFAULT_LANGUAGE, config)
    return resolved, fallback


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
                    errors.append(
                        f"{path}: environment variable {m.group(1)} is not set (use ${{{m.group(1)}:-default}})"
                    )
                    return m.group(0)
                return m.group(2)
            return value

        return _VAR.sub(sub, node)
    return node


def refuse_credentials(node: Any, path: str, errors: list[str]) -> Any:
    """A URL with `user:password@` anywhere in `node` appends an error naming its key (the URL
    shown redacted), and is replaced by the URL without it, so that no later message repeats the
    secret: the config is saved with the run, and credentials go elsewhere."""
    if isinstance(node, dict):
        return {k: refuse_credentials(v, f"{path}.{k}" if path else str(k), errors) for k, v in node.items()}
    if isinstance(node, list):
        return [refuse_credentials(v, f"{path}[{i}]", errors) for i, v in enumerate(node)]
    if isinstance(node, str) and url_userinfo(node):
        shown = redact(node)
        errors.append(
            f"{path}: {shown}: a URL with user:password@ (credentials are not read from the config, which is saved "
            "with the run; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile (storage.s3.profile) or an "
            "instance role)"
        )
        return without_userinfo(node)
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


#: the type of a `key_path_error`
KEY_PATHS = "key_paths"


def key_path_error(lines: list[str], *, of_parent: bool = False) -> PydanticCustomError:
    """One pydantic error holding several `key.path: message` lines, which `messages` reports one
    by one (each counts as one error) under the key path of the value that raised it: a model
    validator's lines are paths inside its model. `of_parent`: a field validator's lines are
    paths inside the model holding the field (they may name the field itself, or a sibling)."""
    return PydanticCustomError(
        KEY_PATHS, "{detail}", {"detail": "; ".join(lines), "lines": lines, "of_parent": of_parent}
    )


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


def _under(base: str, line: str) -> str:
    if not base:
        return line
    return base + line if line.startswith("[") else f"{base}.{line}"


def messages(err: ValidationError, prefix: str, model: type[BaseModel] | None = None) -> list[str]:
    """One line per pydantic error, each naming the key path the user wrote (under `prefix`)."""
    msgs = []
    for e in err.errors():
        where = _loc(prefix, e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = ""
            if model is not None and len(e["loc"]) == 1:
                # inside per_language, per_language itself is no allowed key; elsewhere it is named
                # last, after the parameters it overrides
                names = [n for n in model.model_fields if n != "per_language"]
                if "per_language" in model.model_fields and "per_language." not in where:
                    names.append("per_language")
                allowed = f" (allowed: {', '.join(names)})"
            msgs.append(f"{where}: unknown key{allowed}")
        elif e["type"] == "missing":
            msgs.append(f"{where}: required key is missing")
        elif e["type"] == KEY_PATHS:  # one line per problem, each under the key path that raised it
            loc = e["loc"][:-1] if e["ctx"]["of_parent"] else e["loc"]
            msgs.extend(_under(_loc(prefix, loc), line) for line in e["ctx"]["lines"])
        elif e["type"] == "value_error":
            msgs.append(f"{where}: {str(e['ctx']['error'])}")
        elif e["type"] == "finite_number":
            msgs.append(f"{where}: expected a finite number, got {e['input']!r}")
        else:
            msgs.append(f"{where}: {e['msg'].lower()}, got {e['input']!r}")
    return msgs


M = TypeVar("M", bound=BaseModel)


def validate_config(
    model: type[M],
    data: Any,
    *,
    source: str,
    overrides: Iterable[str] = (),
    prepare: Callable[[dict, list[str]], dict] | None = None,
    checks: Callable[[M], list[str]] | None = None,
) -> M:
    """A config file's mapping `data` (left unchanged) as a validated `model`: the `--set`
    overrides applied, `${VAR}` interpolated, `prepare(data, errors)` (the caller's own
    additions, e.g. merging a file the config names), the model's validation, then
    `checks(config)` (rules across sections). Every problem of the interpolation, `prepare`,
    the validation and the checks is collected into one `ConfigError("<source>: N error(s)")`
    naming each key path; a malformed override is raised at once."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    data = copy.deepcopy(data)
    for assignment in overrides:
        apply_override(data, assignment)
    errors: list[str] = []
    data = interpolate(data, "", errors)
    data = refuse_credentials(data, "", errors)
    if prepare is not None:
        data = prepare(data, errors)
    config = None
    try:
        config = model.model_validate(data)
    except ValidationError as e:
        errors.extend(messages(e, "", model))
    if config is not None and checks is not None:
        errors.extend(checks(config))
    if errors:
        raise ConfigError(f"{source}: {len(errors)} error(s)\n  " + "\n  ".join(errors))
    return config
