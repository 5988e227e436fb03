"""The error of a dataset's files (a shard, its sample index, a control object)."""

from __future__ import annotations


class DatasetError(ValueError):
    """A dataset, version or manifest is missing or invalid; the message names it."""
