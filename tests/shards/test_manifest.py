"""Commit protocol on local disk and S3: versions, create-only manifests, `_latest` CAS."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest

import schemas
from pipeline.shards.manifest import (
    LATEST_KEY,
    CommitConflict,
    Dataset,
    DatasetError,
    ImmutableShardError,
    manifest_key,
)

from .helpers import provenance, write_unit


def test_commits_make_versions_and_move_latest(root):
    ds = Dataset.open(root)
    assert ds.latest_version() is None
    a, _ = write_unit(ds, "unit-a", 3)
    m1 = ds.commit([a])
    assert (m1.version, m1.parent_version) == (1, None)
    b, _ = write_unit(ds, "unit-b", 2)
    m2 = ds.commit([b])
    assert (m2.version, m2.parent_version) == (2, 1)
    assert ds.latest_version() == 2
    assert json.loads(ds.storage.read_bytes(LATEST_KEY)) == {"version": 2}
    assert [s.path for s in m2.shards] == ["shards/unit-a.parquet", "shards/unit-b.parquet"]
    assert m2.num_rows == 5 and m2.num_bytes == a.bytes + b.bytes
    assert ds.manifest(1).num_rows == 3  # old versions stay readable
    assert ds.versions() == [1, 2]
    assert ds.committed_units() == {"unit-a", "unit-b"}


def test_manifest_matches_its_json_schema(root):
    ds = Dataset.open(root)
    info, _ = write_unit(ds, "unit-a", 2)
    ds.commit([info])
    body = json.loads(ds.storage.read_bytes(manifest_key(1)))
    schema = json.loads(schemas.MANIFEST_SCHEMA_PATH.read_text())
    jsonschema.validate(body, schema)
    body["shards"][0]["sha256"] = "not-a-hash"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, schema)


def test_racing_committers_exactly_one_wins(root):
    ds = Dataset.open(root)
    base, _ = write_unit(ds, "unit-base", 1)
    ds.commit([base])
    infos = [write_unit(ds, f"unit-{i}", 1)[0] for i in range(4)]
    barrier = threading.Barrier(len(infos))
    results: dict[int, object] = {}

    def commit(i: int) -> None:
        mine = Dataset.open(root)  # own client, as separate workers would have
        barrier.wait()
        try:
            results[i] = mine.commit([infos[i]], parent_version=1)
        except CommitConflict as err:
            results[i] = err

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(infos))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in results.items() if not isinstance(r, Exception)]
    losers = [r for r in results.values() if isinstance(r, CommitConflict)]
    assert len(winners) == 1 and len(losers) == 3
    assert all("version 2 was committed by another writer" in str(e) for e in losers)
    v2 = ds.manifest(2)
    assert {s.unit_id for s in v2.shards} == {"unit-base", f"unit-{winners[0]}"}
    assert ds.latest_version() == 2


def test_pointer_lagging_behind_a_committed_manifest_is_repaired(root):
    ds = Dataset.open(root)
    ds.commit([write_unit(ds, "unit-a", 1)[0]])
    ds.commit([write_unit(ds, "unit-b", 1)[0]])
    # A committer that died after publishing v2 but before moving the pointer:
    tagged = ds.storage.read_tagged(LATEST_KEY)
    ds.storage.put_if_match(LATEST_KEY, b'{"version": 1}', tagged[1])
    assert ds.latest_version() == 2  # readers probe past the stale pointer
    m3 = ds.commit([write_unit(ds, "unit-c", 1)[0]])
    assert m3.version == 3 and m3.parent_version == 2
    assert json.loads(ds.storage.read_bytes(LATEST_KEY)) == {"version": 3}


def test_committed_shard_cannot_change(root):
    ds = Dataset.open(root)
    ds.commit([write_unit(ds, "unit-a", 2)[0]])
    same, _ = write_unit(ds, "unit-a", 2)  # deterministic retry: identical bytes
    assert ds.commit([same]).num_rows == 2  # idempotent: still one copy
    changed, _ = write_unit(ds, "unit-a", 3)
    with pytest.raises(ImmutableShardError, match="unit-a.parquet.*immutable"):
        ds.commit([changed])


def test_commit_checks_the_files_exist_as_written(root):
    ds = Dataset.open(root)
    info, _ = write_unit(ds, "unit-a", 2)
    ds.storage.delete(info.path)
    with pytest.raises(DatasetError, match="unit-a.parquet: file not found"):
        ds.commit([info])
    other, _ = write_unit(ds, "unit-a", 1)  # same unit rewritten by a zombie worker
    with pytest.raises(DatasetError, match="bytes on storage"):
        ds.commit([info])
    assert ds.commit([other]).num_rows == 1


def test_remove_shards_and_provenance_mix(root):
    ds = Dataset.open(root)
    a, _ = write_unit(ds, "unit-a", 1)
    b, _ = write_unit(ds, "unit-b", 1)
    ds.commit([a, b])
    m2 = ds.commit([], remove=["shards/unit-a.parquet"])
    assert [s.unit_id for s in m2.shards] == ["unit-b"]
    with pytest.raises(DatasetError, match="does not name it"):
        ds.commit([], remove=["shards/nope.parquet"])
    with ds.writer("unit-c", provenance(aux_layer_ids=(1, 2))) as w:
        pass
    with pytest.raises(DatasetError, match="different target, tokenizer or layer set"):
        ds.commit([w.info])


def test_empty_dataset_errors_are_clear(tmp_path):
    ds = Dataset.open(tmp_path / "nothing")
    with pytest.raises(DatasetError, match="no committed version"):
        ds.manifest()
    with pytest.raises(DatasetError, match="version 4 does not exist"):
        ds.manifest(4)
    with pytest.raises(ValueError, match="needs `provenance`"):
        ds.commit([])
