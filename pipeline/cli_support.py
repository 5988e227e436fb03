"""Shared plumbing for the thin entrypoints (`jobs/*.py`, `cli.py`): overrides and exit codes."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import yaml

from pipeline.config import ConfigError
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)


def parse_overrides(items: list[str]) -> dict[str, object]:
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


def run_and_report(job: Callable[[], list[str]], *, verbose: bool) -> int:
    """Run `job`, print the lines it returns; one-line errors and exit 1 on known failures."""
    try:
        lines = job()
    except (ConfigError, FileNotFoundError, ValueError, PipelineError) as err:
        if verbose:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0
