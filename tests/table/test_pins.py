"""Reader pins: create-only, idempotent, expiring, unique per run; a malformed one holds all."""

from __future__ import annotations

import pytest
from shards.helpers import assert_exactly_once, write_unit

from pipeline.table import pins
from pipeline.table.dataset import Dataset
from pipeline.table.gc import gc_dataset
from pipeline.table.pins import pin_version, pinned_versions, unpin_version


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


def test_two_hosts_writing_to_one_output_never_share_a_pin(root, tmp_path, monkeypatch):
    """Host A's run ends and releases its pins; host B, same output path, still reads its
    version through gc --keep-versions 1."""
    ds = Dataset.open(root)
    info, committed = write_unit(ds, "unit-a", 3)
    ds.commit([info])
    out = tmp_path / "runs" / "draft"  # the same path on both hosts (each its own disk)
    prefixes = {}
    for host in ("host-a", "host-b"):
        monkeypatch.setattr(pins.socket, "gethostname", lambda host=host: host)
        (out / pins.RUN_ID_FILE).unlink(missing_ok=True)  # each host's disk has its own id
        prefixes[host] = pins.run_pin_prefix(out)
        assert pins.run_pin_prefix(out) == prefixes[host]  # a resume finds the same name
        ds.pin(1, pins.version_pin(prefixes[host], 1), owner=f"train on {host}")
    assert prefixes["host-a"] != prefixes["host-b"]
    assert pins.release_pins(ds, prefixes["host-a"]) == [pins.version_pin(prefixes["host-a"], 1)]
    ds.commit([], remove=[info.path])  # a refresh replaces the shard: version 2
    report = gc_dataset(root, keep_versions=1, min_age_s=0, unsafe_min_age=True, delete=True)
    assert 1 in report.retained
    assert_exactly_once(root, committed, version=1)


MALFORMED = {
    "cut in half": b'{"version": 1, "owner": "tra',
    "not an object": b"[1, 2]",
    "no version": b'{"owner": "trainer", "expires_at": null}',
    "version a string": b'{"version": "one", "expires_at": null}',
    "expiry a string": b'{"version": 1, "expires_at": "tomorrow"}',
}


@pytest.mark.parametrize("shape", MALFORMED, ids=list(MALFORMED))
def test_a_malformed_pin_is_one_line_and_holds_every_version(root, shape):
    ds = Dataset.open(root)
    info, committed = write_unit(ds, "unit-a", 3)
    ds.commit([info])
    ds.storage.put_if_absent("_pins/hand-made.json", MALFORMED[shape])
    ds.commit([], remove=[info.path])  # version 2 holds nothing of version 1's
    report = gc_dataset(root, keep_versions=1, min_age_s=0, unsafe_min_age=True, delete=True)
    assert report.expired == () and report.garbage == ()
    (line,) = [ln for ln in report.to_text().splitlines() if "hand-made" in ln]
    assert "unreadable pin" in line and "held as pinning every version" in line
    assert ds.storage.exists("_pins/hand-made.json")  # never deleted by gc
    assert_exactly_once(root, committed, version=1)
    assert pins.release_pins(ds, "hand-made") == ["hand-made"]
