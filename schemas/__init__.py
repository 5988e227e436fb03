"""Versioned schemas of the project's data: one module per sample-schema version.

`SCHEMAS` maps every version a reader accepts to its module; `LATEST` is what
writers produce. The manifest's JSON Schema is `manifest.schema.json` beside
this file.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from schemas import v1

LATEST: int = v1.VERSION
SCHEMAS: dict[int, ModuleType] = {v1.VERSION: v1}
MANIFEST_SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")


def schema_module(version: int) -> ModuleType:
    """The module of a sample-schema version; ValueError names the versions known."""
    try:
        return SCHEMAS[version]
    except KeyError:
        raise ValueError(
            f"unknown sample schema version {version!r}; this code reads versions "
            f"{sorted(SCHEMAS)} (data written by newer code needs a newer dspark-targets)"
        ) from None
