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
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value)
    return parse_model(model, data, str(path))


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
