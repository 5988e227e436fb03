"""Config plumbing shared by every stage: one base model, the YAML loader, `--set` overrides.

Each stage's typed config sits beside the stage (`targets/config.py`,
`corpus/config.py`, `regenerate/config.py`, `train/config.py`,
`evaluate/config.py`); they all derive from `ConfigModel`, which forbids
unknown keys so a typo fails loudly instead of silently running with a
default. A validation failure raises `ConfigError`, whose message names the
file, the dotted key and what is wrong with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A config file is missing, unparsable or invalid; the message says where."""


class WrongConfigKind(ConfigError):
    """A config of another kind (a training config given where a regeneration one belongs)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # the kind that was wanted: "regeneration", "training", ...


# What each stage's top-level config is called in messages.
CONFIG_KINDS = {
    "PipelineConfig": "regeneration",
    "TrainConfig": "training",
    "EvalConfig": "evaluation",
}


class ConfigModel(BaseModel):
    """Base of every stage config: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


M = TypeVar("M", bound=BaseModel)


def _format_errors(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid config ({err.error_count()} problem(s))"]
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"]) or "<top level>"
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown key (typo? remove it or check the spelling)"
        elif item["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def parse_model(model: type[M], data: Any, source: str = "<dict>") -> M:
    """Validate a mapping as `model`; errors name `source`, the dotted key and the problem."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None


def load_model_yaml(model: type[M], path: str | Path, overrides: dict[str, Any] | None = None) -> M:
    """Read a YAML file as `model`; `overrides` are dotted keys (`replicas.num_replicas`)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    kind = CONFIG_KINDS.get(model.__name__, model.__name__)
    unknown = [k for k in data if k not in model.model_fields]
    if len(unknown) >= 2 and len(unknown) * 2 > len(data):
        raise WrongConfigKind(
            f"{path} is not {'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind} config (top-level keys {', '.join(map(str, unknown))} "
            "are not among its sections)",
            kind,
        )
    for dotted in overrides or {}:
        check_override_key(model, dotted, kind)
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value)
    return parse_model(model, data, str(path))


def check_override_key(model: type[BaseModel], dotted: str, kind: str = "") -> None:
    """Raise naming the `--set` override whose key the config does not have, with a suggestion.

    Keys below a mapping or list field (`corpus.sources.0.path`, a bundle's
    resources) are not checked here; validation names them.
    """
    import difflib

    node: type[BaseModel] | None = model
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if node is None:
            return
        fields = node.model_fields
        if part not in fields:
            close = difflib.get_close_matches(part, list(fields), n=1)
            where = ".".join(parts[:i]) if i else f"the {kind} config" if kind else "the config"
            hint = ""
            if close:
                hint = f"; did you mean {'.'.join([*parts[:i], close[0], *parts[i + 1 :]])}?"
            raise ConfigError(f"--set {dotted}: {where} has no key {part!r}{hint}")
        node = _model_of(fields[part].annotation)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The config model a field holds (through `X | None`), or None for anything else."""
    import types
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None  # a list, a mapping, a plain value
    models = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(models) == 1 and isinstance(models[0], type) and issubclass(models[0], BaseModel):
        return models[0]
    return None


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """`data["a"]["b"] = value` for `dotted == "a.b"`, creating mappings on the way."""
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a mapping")
    node[leaf] = value


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, object]:
    """`KEY=VALUE` pairs; values are parsed as YAML (`4`, `true`, `[1, 2]`, `s3://x`)."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"override {item!r}: expected KEY=VALUE, e.g. replicas.num_replicas=4"
            )
        out[key.strip()] = yaml.safe_load(value)
    return out


def dump_yaml(config: BaseModel) -> str:
    """YAML text of a config (defaults included), for provenance, checkpoints and `plan`."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
