"""Model-reference schemes: how a reference that is neither a hub name nor a directory
becomes a model directory `from_pretrained` loads.

A scheme claims references (`toy:NAME`, a `.gguf` file or a packaged GGUF's
short name), checks one (a one-line ValueError that says the fix), and
builds its directory once. The GGUF scheme is built in. Others plug in from
above through the `dspark_targets.model_schemes` entry point group
(pyproject.toml): each entry names a `ModelScheme` object, loaded the first
time a reference is looked up. So `resolve` knows no scheme by name, and the
toy wing registers `toy:` there and stays above every production package.

Why an entry point and not a registration when the toy wing is imported:
whatever resolves a reference must see the same schemes in every process.
A Ray actor unpickles its config and resolves the target in a fresh process
that never imported the demo or the CLI; installed metadata is the one thing
every process of the package reads without importing anything first. An
import-time registration would resolve `toy:` in the driver and then fail in
the actors of the same run; with the entry point, a checkout that was never
installed (no metadata) refuses `toy:` at once, in the driver's config check,
with a line that says so. `register` remains for a scheme a program (or a
test) adds to its own process.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

ENTRY_POINT_GROUP = "dspark_targets.model_schemes"
_PREFIXED = re.compile(r"[a-z][a-z0-9_-]*:(?!//)")  # `toy:tiny`, not `s3://` nor `C:\`


@dataclass(frozen=True)
class ModelScheme:
    """One kind of model reference: which it claims, how it checks and builds one."""

    name: str
    claims: Callable[[str], bool]
    check: Callable[[str], None]  # ValueError (one line) if the reference cannot resolve
    build: Callable[[str, Path | None], Path]  # (reference, cache dir) -> model directory
    prefix: str | None = None  # `toy:`; None for a scheme that claims by shape


def _gguf_scheme() -> ModelScheme:
    def claims(model: str) -> bool:
        from pipeline.targets.gguf import is_gguf_ref

        return is_gguf_ref(model)

    def check(model: str) -> None:
        from pipeline.targets.gguf import gguf_file

        gguf_file(model)

    def build(model: str, cache_dir: Path | None) -> Path:
        from pipeline.targets.gguf import build_gguf_target

        return build_gguf_target(model, cache_dir)

    return ModelScheme("gguf", claims, check, build)


_schemes: dict[str, ModelScheme] = {}
_installed: dict[str, ModelScheme] = {}  # the built-in one and the entry points', loaded once


def _load_installed() -> dict[str, ModelScheme]:
    if not _installed:
        found = {"gguf": _gguf_scheme()}
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            scheme = entry.load()
            if not isinstance(scheme, ModelScheme):
                raise TypeError(f"entry point {entry.value} is not a ModelScheme")
            found.setdefault(scheme.name, scheme)
        _installed.update(found)
    return _installed


def register(scheme: ModelScheme) -> None:
    """Add a scheme to this process (it replaces an installed one of the same name)."""
    _schemes[scheme.name] = scheme


def unregister(name: str) -> None:
    """Drop a scheme `register` added (an installed one stays)."""
    _schemes.pop(name, None)


def registered() -> list[ModelScheme]:
    """The built-in scheme, every installed one, then those this process registered (a
    registration before the first look-up hides none of the installed ones)."""
    merged = {**_load_installed(), **_schemes}
    return list(merged.values())


def scheme_of(model: str) -> ModelScheme | None:
    """The scheme that claims `model`; None for a hub name or a directory.

    ValueError (one line) for a `name:` prefix no scheme claims."""
    schemes = registered()
    for scheme in schemes:
        if scheme.claims(model):
            return scheme
    if _PREFIXED.match(model) and not Path(model).exists():
        known = ", ".join(s.prefix for s in schemes if s.prefix)
        raise ValueError(
            f"unknown model scheme in {model!r} "
            + (
                f"(prefixes: {known})"
                if known
                else f"(no prefix installed: install the package, whose {ENTRY_POINT_GROUP} "
                "entry points register them, e.g. `pip install -e .`)"
            )
        )
    return None
