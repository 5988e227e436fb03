"""The versioned table's errors; each message names the dataset, version or file."""

from __future__ import annotations

from pipeline.errors import PipelineError
from pipeline.shards.errors import DatasetError

__all__ = [
    "CommitConflict",
    "DatasetError",
    "DuplicateSampleError",
    "ImmutableShardError",
    "LeaseHeld",
    "LeaseLost",
    "LineageMismatch",
]


class CommitConflict(RuntimeError):
    """Another committer published the version this commit was going to publish."""


class ImmutableShardError(ValueError):
    """A commit tried to change a shard that an earlier version already names."""


class DuplicateSampleError(DatasetError):
    """A commit would list a sample id twice in one version."""


class LineageMismatch(DatasetError):
    """A commit's provenance differs from the lineage of the version it builds on."""


class LeaseHeld(PipelineError):
    """Another driver holds the dataset's writer lease."""


class LeaseLost(PipelineError):
    """This driver's lease expired or was taken over: it must not publish."""
