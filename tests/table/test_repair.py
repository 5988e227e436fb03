"""Checksummed control objects and `repair`: a damaged pointer or root is refused in one
line, and `repair --apply` rebuilds them from the versions present."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from shards.helpers import assert_exactly_once, write_unit

from pipeline.cli import cli
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.layout import LATEST_KEY, manifest_key
from pipeline.table.repair import repair_dataset


def _three_versions(ds):
    committed = []
    for unit, n in (("unit-a", 2), ("unit-b", 3), ("unit-c", 4)):
        info, samples = write_unit(ds, unit, n)
        ds.commit([info])
        committed += samples
    return committed


def _one_line_error(args) -> str:
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 1, out.output
    # (the loopback S3 server logs its requests in this process: not the command's output)
    lines = [ln for ln in out.output.strip().splitlines() if " werkzeug: " not in ln]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.output
    return lines[0]


def _replace(ds, key: str, data: bytes) -> None:
    """An operator's hand edit (or damage) of a control object in place."""
    ds.storage.put_if_match(key, data, ds.storage.read_tagged(key)[1])


def test_a_cut_pointer_is_refused_then_repaired(root):
    ds = Dataset.open(root)
    committed = _three_versions(ds)
    _replace(ds, LATEST_KEY, ds.storage.read_bytes(LATEST_KEY)[:9])
    for args in (["inspect", root], ["verify", root]):
        line = _one_line_error(args)
        assert "_latest: unreadable pointer" in line and "repair" in line
    with pytest.raises(DatasetError, match="unreadable pointer"):
        Dataset.open(root).commit([write_unit(ds, "unit-d", 1)[0]])
    dry = repair_dataset(root)
    assert not dry.applied and "point _latest at version 3" in dry.to_text()
    with pytest.raises(DatasetError):
        Dataset.open(root).latest_version()  # a dry run writes nothing
    out = CliRunner().invoke(cli, ["repair", root, "--apply"])
    assert out.exit_code == 0 and "did: point _latest at version 3" in out.output
    assert repair_dataset(root).ok
    assert_exactly_once(root, committed)


def test_an_edited_pointer_is_refused(root):
    ds = Dataset.open(root)
    _three_versions(ds)
    body = json.loads(ds.storage.read_bytes(LATEST_KEY))
    _replace(ds, LATEST_KEY, json.dumps({**body, "version": 1}).encode())
    with pytest.raises(DatasetError, match="does not match its checksum"):
        Dataset.open(root).latest_version()


@pytest.mark.parametrize("damage", ["edited", "cut"])
def test_a_damaged_newest_root_is_refused_then_rebuilt(root, damage):
    """A hand edit that drops a segment (and fixes the totals), or a root cut in half:
    refused in one line; repair publishes version 4 = version 2 + version 3's changes
    recovered from its own segment; every committed sample reads exactly once."""
    ds = Dataset.open(root)
    committed = _three_versions(ds)
    key = manifest_key(3)
    data = ds.storage.read_bytes(key)
    if damage == "edited":
        body = json.loads(data)
        body["segments"] = body["segments"][:-1]
        body["totals"].update(shards=2, rows=5, stored_rows=5)
        data = json.dumps(body, indent=1).encode()
    else:
        data = data[: len(data) // 2]
    _replace(ds, key, data)
    line = _one_line_error(["verify", root])
    assert key in line and ("checksum" in line or "not valid JSON" in line)
    report = repair_dataset(root, apply=True)
    assert report.damaged[0][0] == 3 and "changes recovered from" in report.to_text()
    fresh = Dataset.open(root)
    assert fresh.latest_version() == 4 and fresh.pointer_version() == 4
    assert fresh.manifest(4).commit["repairs"] == [3]
    with pytest.raises(DatasetError, match="retired"):
        fresh.manifest(3)
    assert_exactly_once(root, committed)
    info, samples = write_unit(fresh, "unit-d", 2)
    assert fresh.commit([info]).version == 5
    assert_exactly_once(root, committed + samples)


def test_a_root_without_created_at_is_one_line_naming_the_field(root):
    ds = Dataset.open(root)
    _three_versions(ds)
    body = json.loads(ds.storage.read_bytes(manifest_key(2)))
    del body["created_at"], body["checksum"]  # written as an older root would be
    _replace(ds, manifest_key(2), json.dumps(body).encode())
    line = _one_line_error(["inspect", root])
    assert manifest_key(2) in line and "field 'created_at' is missing" in line
