"""A resumed run reads the version its checkpoints were trained on; checkpoints are
written crash-safe; `latest` is checked; tombstoned rows are never trained on."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from train_configs import toy_train_config as _config

from pipeline.drafts.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from pipeline.storage import UnsafePath
from pipeline.table.dataset import Dataset
from pipeline.table.gc import gc_dataset
from pipeline.table.pins import pinned_versions
from pipeline.train.data import TrainingData
from pipeline.train.trainer import train


@pytest.fixture
def own_shards(toy_shards, tmp_path):
    """A private copy of the toy shards (this test publishes versions on it)."""
    uri = tmp_path / "ds"
    shutil.copytree(toy_shards, uri)
    return uri


def _tombstone_half_a_shard(uri) -> set[str]:
    ds = Dataset.open(uri)
    entry = ds.manifest().shards[0]
    ids = [row.sample_id for row in ds.sample_index(entry).rows][::2]
    ds.commit([], drop={entry.path: ids})
    return set(ids)


def test_a_resumed_run_reads_its_version_after_a_new_one_is_published(own_shards, tmp_path):
    whole = train(_config(own_shards, tmp_path / "whole"), export=False)
    train(_config(own_shards, tmp_path / "cut"), stop_after=4, export=False)
    recorded = load_checkpoint(tmp_path / "cut").train_config["data"]
    assert recorded["version"] == 1  # the checkpoint says which version it was trained on
    dropped = _tombstone_half_a_shard(own_shards)  # version 2: another epoch order
    assert Dataset.open(own_shards).latest_version() == 2
    resumed = train(_config(own_shards, tmp_path / "cut"), export=False)
    want = [(m["step"], m["loss"], m["samples"]) for m in whole.metrics]
    got = [(m["step"], m["loss"], m["samples"]) for m in resumed.metrics]
    assert [s for s, *_ in got] == list(range(1, 9))
    for (ws, wl, wn), (gs, gl, gn) in zip(want, got, strict=True):
        assert ws == gs and wn == gn and gl == pytest.approx(wl, rel=1e-6, abs=1e-7)
    assert load_checkpoint(tmp_path / "cut").train_config["data"]["version"] == 1
    # Asking a resume for another version is refused, naming the fix.
    with pytest.raises(ValueError, match="version 1, but the config reads .* version 2"):
        train(_config(own_shards, tmp_path / "cut", data={"version": 2}), export=False)
    # A new run reads version 2 and never the rows it tombstones.
    data = TrainingData(_config(own_shards, tmp_path / "new").data)
    ids = {r.sample_id for r in data.train_rows + data.heldout_rows}
    assert data.manifest.version == 2 and ids and not ids & dropped
    assert len(ids) == data.manifest.num_rows


def test_a_run_pins_its_version_against_gc_until_it_is_finished(own_shards, tmp_path):
    ds = Dataset.open(own_shards)
    train(_config(own_shards, tmp_path / "cut"), stop_after=4, export=False)
    pins = pinned_versions(ds)
    assert list(pins.values()) == [1], pins  # one pin, named for the run, on version 1
    (name,) = pins
    gone = ds.manifest().shards[0]
    ds.commit([], remove=[gone.path])  # a refresh replaces a shard: version 2
    report = gc_dataset(
        str(own_shards), keep_versions=1, delete=True, min_age_s=0, unsafe_min_age=True
    )
    assert 1 in report.retained and f"version 1 (pinned by {name})" in report.to_text()
    assert ds.storage.exists(gone.path)
    resumed = train(_config(own_shards, tmp_path / "cut"), export=False)  # reads version 1
    assert [m["step"] for m in resumed.metrics] == list(range(1, 9))
    assert pinned_versions(ds) == {}  # finished: released
    report = gc_dataset(
        str(own_shards), keep_versions=1, delete=True, min_age_s=0, unsafe_min_age=True
    )
    assert report.pins == () and name not in report.to_text()


FIXTURE_SPEC = Path(__file__).resolve().parents[1] / "fixtures/drafts_v0/dflash/checkpoints"


def _save(out_dir, step, config="target: t\n"):
    spec = (FIXTURE_SPEC / "step-00000002" / "spec.json").read_text()
    return save_checkpoint(out_dir, step, {"model": {}, "step": step}, spec, config)


@pytest.mark.parametrize("name", ["../../elsewhere", "/tmp/elsewhere", "a/b", ".."])
def test_a_latest_pointer_that_leaves_checkpoints_is_refused(tmp_path, name):
    _save(tmp_path, 1)
    (tmp_path / "checkpoints" / "latest").write_text(name + "\n")
    with pytest.raises(UnsafePath):
        latest_checkpoint(tmp_path)


def test_a_crash_while_saving_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    import torch

    first = _save(tmp_path, 1)
    (first.parent / "step-00000002").mkdir()  # a complete-looking dir `latest` never named

    def dies(obj, fh):
        fh.write(b"half a state")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(OSError, match="No space left"):
        _save(tmp_path, 2)
    assert latest_checkpoint(tmp_path) == first
    assert torch.load(first / "state.pt", weights_only=True)["step"] == 1
    monkeypatch.undo()
    second = _save(tmp_path, 2, config=yaml.safe_dump({"target": "u"}))
    assert latest_checkpoint(tmp_path) == second and load_checkpoint(tmp_path).target == "u"
    assert sorted(p.name for p in second.parent.iterdir()) == [
        "latest",
        "step-00000001",
        "step-00000002",
    ]
