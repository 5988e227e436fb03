"""Paths built from data stay under their root: crafted manifests, segment lists, weight indexes.

Each crafted file names a real, readable shard outside the dataset (`../`) or
an absolute path, so without the check the read would succeed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace

import pytest
from shards.helpers import write_unit

from pipeline.storage import UnsafePath, check_key, path_under
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.layout import checksum, manifest_key
from pipeline.table.reader import ShardReader

BAD = ["../outside.parquet", "/etc/passwd", "shards/../../outside.parquet", "", "shards//a"]


@pytest.mark.parametrize("name", BAD)
def test_keys_and_names_from_data_may_not_leave_their_root(tmp_path, name):
    with pytest.raises(UnsafePath):
        check_key(name)
    with pytest.raises(UnsafePath, match="refusing to follow it"):
        path_under(tmp_path, name, "test pointer")
    assert path_under(tmp_path, "step-00000001", "test") == tmp_path / "step-00000001"


@pytest.fixture
def committed(tmp_path):
    ds = Dataset.open(tmp_path / "dataset")
    info, _ = write_unit(ds, "unit-a", 3)
    manifest = ds.commit([info])
    # A readable shard just outside the root: what a crafted path would reach.
    shutil.copy(ds.storage.url(info.path), tmp_path / "outside.parquet")
    return ds, manifest


def _publish_root(ds: Dataset, body: dict) -> None:
    """A crafted root with a matching checksum (a forger can compute one too)."""
    body = {**body, "checksum": checksum(body)}
    ds.storage.put_if_absent(manifest_key(body["version"]), json.dumps(body).encode())


@pytest.mark.parametrize("path", ["../outside.parquet", "/etc/passwd"])
def test_a_crafted_segment_entry_is_refused(committed, path):
    ds, manifest = committed
    root = json.loads(ds.storage.read_bytes(manifest_key(1)))
    (ref,) = root["segments"]
    segment = json.loads(ds.storage.read_bytes(ref["key"]))
    segment["shards"][0]["path"] = path
    data = json.dumps(segment).encode()
    key = "manifests/segments/crafted.json"
    ds.storage.put_if_absent(key, data)
    root.update(version=2, parent_version=1)
    root["segments"] = [{**ref, "key": key, "sha256": hashlib.sha256(data).hexdigest()}]
    _publish_root(ds, root)
    with pytest.raises(DatasetError, match="invalid storage key"):
        Dataset.open(ds.uri).manifest(2)
    with pytest.raises(DatasetError, match="invalid storage key"):
        ShardReader(ds.uri, prefetch=0)
    assert len(list(ShardReader(ds.uri, version=1, prefetch=0))) == 3  # v1 is untouched


@pytest.mark.parametrize("key", ["../segment.json", "/tmp/segment.json"])
def test_a_crafted_segment_key_is_refused(committed, key):
    ds, _ = committed
    root = json.loads(ds.storage.read_bytes(manifest_key(1)))
    root.update(version=2, parent_version=1)
    root["segments"][0]["key"] = key
    _publish_root(ds, root)
    with pytest.raises(DatasetError, match="malformed segment list"):
        Dataset.open(ds.uri).manifest(2)


def test_arrow_files_checks_each_path(committed):
    ds, manifest = committed
    reader = ShardReader(ds, prefetch=0)
    fs, paths = reader.arrow_files()
    assert paths == [f"{ds.storage.uri}/{manifest.shards[0].path}"]
    crafted = replace(manifest.shards[0], path="../outside.parquet")
    reader.manifest = replace(manifest, entries={crafted.path: crafted})
    with pytest.raises(UnsafePath):
        reader.arrow_files()


def test_a_weight_index_naming_a_file_outside_the_model_is_refused(tmp_path, random_target_dir):
    from pipeline.targets.capture import load_final_norm

    model = tmp_path / "model"
    shutil.copytree(random_target_dir, model)
    weights = next(model.glob("*.safetensors"))
    shutil.move(weights, tmp_path / "outside.safetensors")
    index = {"weight_map": {"model.norm.weight": "../outside.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UnsafePath, match="weight file"):
        load_final_norm(str(model))
