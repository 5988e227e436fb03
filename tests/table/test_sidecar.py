"""Sidecars are control files a commit trusts: each is checked against the sha256 its root names."""

from __future__ import annotations

import json

import pytest
from shards.helpers import write_unit

from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.inspection import verify_dataset


def test_a_sidecar_edited_into_valid_json_is_refused_before_a_commit_trusts_it(root):
    ds = Dataset.open(root)
    first, _ = write_unit(ds, "unit-a", 4)
    entry = ds.commit([first]).shard(first.path)
    body = json.loads(ds.storage.read_bytes(entry.sidecar))
    body["rows"] = []  # still a valid sidecar: its four members "gone"
    ds.storage.delete(entry.sidecar)
    ds.storage.put_if_absent(entry.sidecar, json.dumps(body).encode())
    again, _ = write_unit(ds, "unit-a", 4)  # the same sample ids, in a new file
    fresh = Dataset.open(root)  # no cached index
    with pytest.raises(DatasetError, match=f"{entry.sidecar}.*sha256"):
        fresh.commit([again])
    assert fresh.latest_version() == 1  # nothing published: no sample listed twice
    report = verify_dataset(root)
    assert not report.ok and "sha256" in report.to_text()
