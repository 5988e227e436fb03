"""The `toy:NAME` model-reference scheme, installed through the
`dspark_targets.model_schemes` entry point (pyproject.toml; targets/schemes.py)."""

from __future__ import annotations

from pathlib import Path

from pipeline.targets.schemes import ModelScheme

PREFIX = "toy:"


def _check(model: str) -> None:
    from pipeline.toy.target import TOY_TARGETS

    if model.removeprefix(PREFIX) not in TOY_TARGETS:
        raise ValueError(
            f"unknown toy target {model!r}; choose one of "
            + ", ".join(f"{PREFIX}{n}" for n in sorted(TOY_TARGETS))
        )


def _build(model: str, cache_dir: Path | None) -> Path:
    from pipeline.toy.target import build_toy_target

    return build_toy_target(model.removeprefix(PREFIX), cache_dir)


TOY_SCHEME = ModelScheme(
    name="toy",
    claims=lambda model: model.startswith(PREFIX),
    check=_check,
    build=_build,
    prefix=PREFIX,
)
