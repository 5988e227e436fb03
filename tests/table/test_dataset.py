"""Commit protocol on local disk and S3: versions, sample-level exactly-once, lineages, segments,
sidecars checked before a commit trusts them."""

from __future__ import annotations

import dataclasses
import json
import threading

import jsonschema
import pytest
from shards.helpers import provenance, sample, write_unit

import schemas
from pipeline.storage import AlreadyExists
from pipeline.table import segments
from pipeline.table.dataset import Dataset
from pipeline.table.errors import (
    CommitConflict,
    DatasetError,
    DuplicateSampleError,
    LineageMismatch,
)
from pipeline.table.inspection import verify_dataset
from pipeline.table.layout import LATEST_KEY, manifest_key
from pipeline.table.reader import ShardReader


def test_commits_make_versions_and_move_latest(root):
    ds = Dataset.open(root)
    assert ds.latest_version() is None
    a, _ = write_unit(ds, "unit-a", 3)
    m1 = ds.commit([a])
    assert (m1.version, m1.parent_version) == (1, None)
    assert m1.lineage.first_version == 1 and m1.lineage.key == a.provenance.lineage_key()
    b, _ = write_unit(ds, "unit-b", 2)
    m2 = ds.commit([b])
    assert (m2.version, m2.parent_version) == (2, 1) and m2.lineage == m1.lineage
    assert ds.latest_version() == 2
    assert json.loads(ds.storage.read_bytes(LATEST_KEY))["version"] == 2
    assert [s.path for s in m2.shards] == sorted([a.path, b.path])
    assert a.path.startswith("shards/unit-a.") and a.path.endswith(".parquet")
    assert m2.num_rows == 5 and m2.num_bytes == a.bytes + b.bytes
    assert m2.totals.by_domain == {"math": 2, "code": 2, "chat": 1}
    fresh = Dataset.open(root)  # another process: resolves the version from its segments
    assert fresh.manifest(2).shards == m2.shards and fresh.manifest(1).num_rows == 3
    assert ds.versions() == [1, 2]
    assert ds.committed_units() == {"unit-a", "unit-b"}


def test_root_segments_and_sidecars_match_their_json_schemas(root):
    ds = Dataset.open(root)
    a, _ = write_unit(ds, "unit-a", 2)
    ds.commit([a])
    b, _ = write_unit(ds, "unit-b", 2)
    ds.commit([b], drop={a.path: ["unit-a-00001"]})
    body = json.loads(ds.storage.read_bytes(manifest_key(2)))
    jsonschema.validate(body, json.loads(schemas.MANIFEST_SCHEMA_PATH.read_text()))
    for ref in body["segments"]:
        jsonschema.validate(
            json.loads(ds.storage.read_bytes(ref["key"])),
            json.loads(schemas.SEGMENT_SCHEMA_PATH.read_text()),
        )
    entry = ds.manifest(2).shard(a.path)
    jsonschema.validate(
        json.loads(ds.storage.read_bytes(entry.sidecar)),
        json.loads(schemas.SIDECAR_SCHEMA_PATH.read_text()),
    )
    body["segments"][0]["sha256"] = "not-a-hash"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, json.loads(schemas.MANIFEST_SCHEMA_PATH.read_text()))


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
    v2 = Dataset.open(root).manifest(2)
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
    assert json.loads(ds.storage.read_bytes(LATEST_KEY))["version"] == 3


def test_a_zombie_write_of_a_committed_shard_changes_no_committed_byte(root):
    """Same name, same size, other bytes, after the commit: refused; bytes and verify intact."""
    ds = Dataset.open(root)
    info, written = write_unit(ds, "unit-a", 3)
    ds.commit([info])
    committed = ds.storage.read_bytes(info.path)
    zombie = ds.writer("unit-a", provenance(), attempt=info.path.split(".")[-2])
    assert zombie.key == info.path
    other = [sample(i, "unit-a") for i in range(3)]
    other[0] = sample(0, "unit-a", num_tokens=len(written[0].input_ids) + 1)
    with pytest.raises(AlreadyExists, match="never written twice"):
        with zombie:
            for s in other:
                zombie.write(s)
    # The bare storage write a zombie would make: same name, same size, other bytes.
    with pytest.raises(AlreadyExists):
        with ds.storage.open_create(info.path) as fh:
            fh.write(bytes(b ^ 0xFF for b in committed))
    assert ds.storage.read_bytes(info.path) == committed
    assert verify_dataset(root).ok
    # A second attempt at the unit (a retried task) is another file; publishing it
    # too would list its samples twice, which the commit refuses.
    again, _ = write_unit(ds, "unit-a", 3)
    assert again.path != info.path
    with pytest.raises(DuplicateSampleError, match="already holds in the parent version"):
        ds.commit([again])
    with pytest.raises(DuplicateSampleError, match="in two shards of this commit"):
        Dataset.open(root).commit([again, write_unit(ds, "unit-a", 3)[0]], parent_version=None)
    assert ds.commit([info]).num_rows == 3  # re-committing the committed file: no change


def test_commit_checks_the_files_exist_as_written(root):
    ds = Dataset.open(root)
    info, _ = write_unit(ds, "unit-a", 2)
    ds.storage.delete(info.path)
    with pytest.raises(DatasetError, match="unit-a.*parquet: file not found"):
        ds.commit([info])
    other, _ = write_unit(ds, "unit-a", 1)
    assert ds.commit([other]).num_rows == 1


def test_a_shard_without_its_writers_member_report_is_refused(root):
    """A commit learns a shard's members from its writer, never by opening the file."""
    ds = Dataset.open(root)
    info, _ = write_unit(ds, "unit-a", 2)
    with pytest.raises(DatasetError, match="unit-a.*parquet: the writer reported 0 samples for 2"):
        ds.commit([dataclasses.replace(info, samples=())])
    assert ds.latest_version() is None
    assert ds.commit([info]).num_rows == 2


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


def test_drops_replace_and_remove_rows_without_rewriting_files(root):
    ds = Dataset.open(root)
    a, sa = write_unit(ds, "unit-a", 4)
    ds.commit([a])
    # A changed sample: its new row comes in a new shard, the old row is dropped.
    with ds.writer("unit-a-v2", provenance()) as w:
        w.write(sa[1])
    m2 = ds.commit([w.info], drop={a.path: [sa[1].sample_id, sa[3].sample_id]})
    assert m2.dropped(a.path) == {sa[1].sample_id, sa[3].sample_id}
    assert m2.num_rows == 3 and m2.totals.rows == 3 and m2.totals.stored_rows == 5
    assert sorted(s.sample_id for s in ShardReader(root)) == sorted(
        [sa[0].sample_id, sa[1].sample_id, sa[2].sample_id]
    )
    assert len(list(ShardReader(root, version=1))) == 4  # the old version is unchanged
    with pytest.raises(DatasetError, match="not live members"):
        ds.commit([], drop={a.path: [sa[3].sample_id]})
    with pytest.raises(DatasetError, match="does not name it"):
        ds.commit([], remove=["shards/nope.parquet"])
    m3 = ds.commit([], drop={a.path: [sa[0].sample_id, sa[2].sample_id]})  # all that is left
    assert a.path not in m3.entries and m3.num_rows == 1  # dropping every row removes the shard
    m4 = ds.commit([], remove=[w.info.path])
    assert m4.shards == () and m4.totals.rows == 0


def test_a_commit_with_other_provenance_names_what_differs(root):
    ds = Dataset.open(root)
    ds.commit([write_unit(ds, "unit-a", 1)[0]])
    for change, field in (
        ({"aux_layer_ids": (1, 2)}, "aux_layer_ids"),
        ({"codec": "fp8"}, "codec"),
        (
            {"generation": {"temperature": 0.7, "max_new_tokens": 64, "seed": 0}},
            "generation.temperature",
        ),
        ({"target_revision": "sha256:ffff"}, "target_revision"),
    ):
        with ds.writer("unit-c", provenance(**change)) as w:
            pass
        with pytest.raises(LineageMismatch, match=rf"{field}: .*refresh"):
            ds.commit([w.info])
    # A new lineage carries nothing over.
    with ds.writer("unit-c", provenance(codec="fp8")) as w:
        pass
    m = ds.commit([w.info], new_lineage=True)
    assert m.lineage.first_version == 2 and [s.unit_id for s in m.shards] == ["unit-c"]


def test_segments_stay_few_and_resolve_to_the_same_version(tmp_path, monkeypatch):
    monkeypatch.setattr(segments, "FANOUT", 3)
    ds = Dataset.open(tmp_path / "ds")
    infos = []
    for i in range(30):
        info, _ = write_unit(ds, f"u{i:03d}", 1)
        infos.append(info)
        drop = {infos[i - 5].path: [f"u{i - 5:03d}-00000"]} if i % 7 == 6 else None
        m = ds.commit([info], drop=drop)
        assert len(m.segments) <= 2 * 3  # (FANOUT - 1) x levels
    fresh = Dataset.open(tmp_path / "ds").manifest()
    assert fresh.shards == m.shards and fresh.totals == m.totals
    assert {e.path for e in fresh.shards} == {
        i.path for n, i in enumerate(infos) if not (n + 5) % 7 == 6 or n + 5 >= 30
    }


def test_empty_dataset_errors_are_clear(tmp_path):
    ds = Dataset.open(tmp_path / "nothing")
    with pytest.raises(DatasetError, match="no committed version"):
        ds.manifest()
    with pytest.raises(DatasetError, match="version 4 does not exist"):
        ds.manifest(4)
    with pytest.raises(ValueError, match="needs `provenance`"):
        ds.commit([])
