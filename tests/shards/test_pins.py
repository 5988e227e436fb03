"""Reader pins: create-only, idempotent, expiring; a pin is written before its version is read."""

from __future__ import annotations

import pytest

from pipeline.shards.manifest import Dataset
from pipeline.shards.pins import pin_version, pinned_versions, unpin_version


def test_pins(root):
    ds = Dataset.open(root)
    pin_version(ds, 3, "train-run-7", owner="trainer")
    pin_version(ds, 3, "train-run-7")  # idempotent
    with pytest.raises(ValueError, match="pins version 3, not 4"):
        pin_version(ds, 4, "train-run-7")
    pin_version(ds, 1, "short", ttl_s=-1)  # already expired
    assert pinned_versions(ds) == {"train-run-7": 3}
    unpin_version(ds, "train-run-7")
    assert pinned_versions(ds) == {}
