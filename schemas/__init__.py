"""Versioned schemas of the project's data: one module per sample-schema version.

`SCHEMAS` maps every version a reader accepts to its module; `LATEST` is what
writers produce. JSON Schemas beside this file: `manifest.schema.json` (a
version's root, format 2; format 1 is no longer read), `segment.schema.json`
and `sidecar.schema.json`.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from schemas import v1

LATEST: int = v1.VERSION
SCHEMAS: dict[int, ModuleType] = {v1.VERSION: v1}
MANIFEST_SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")  # format-2 roots
SEGMENT_SCHEMA_PATH = Path(__file__).with_name("segment.schema.json")
SIDECAR_SCHEMA_PATH = Path(__file__).with_name("sidecar.schema.json")


def schema_module(version: int) -> ModuleType:
    """The module of a sample-schema version; ValueError names the versions known."""
    try:
        return SCHEMAS[version]
    except KeyError:
        raise ValueError(
            f"unknown sample schema version {version!r}; this code reads versions "
            f"{sorted(SCHEMAS)} (data written by newer code needs a newer dspark-targets)"
        ) from None
