"""ShardReader: bit-exact tensors, filters, lookups, prefetch; and other readers of the files."""

from __future__ import annotations

import time

import duckdb
import pyarrow.parquet as pq
import pytest
import torch
from shards.helpers import write_unit

from pipeline.shards import codecs
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.reader import ShardReader


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.fixture
def two_units(root):
    ds = Dataset.open(root)
    a, sa = write_unit(ds, "unit-a", 5, row_group_bytes=3000)
    b, sb = write_unit(ds, "unit-b", 4)
    ds.commit([a, b])
    return root, sa + sb


def test_iterates_every_sample_bit_exact(two_units):
    root, written = two_units
    got = list(ShardReader(root))
    assert [s.sample_id for s in got] == [s.sample_id for s in written]
    for g, w in zip(got, written, strict=True):
        assert g.hidden_states.dtype == torch.bfloat16
        assert torch.equal(_bits(g.hidden_states), _bits(w.hidden_states))
        assert torch.equal(_bits(g.last_hidden_state), _bits(w.last_hidden_state))
        assert g.input_ids.tolist() == list(w.input_ids) and g.input_ids.dtype == torch.int64
        assert g.loss_mask.tolist() == [bool(m) for m in w.loss_mask]
        assert (g.domain, g.finish_reason) == (w.domain, w.finish_reason)
        assert g.num_prompt_tokens + g.num_generated_tokens == len(g.input_ids)


def test_domain_filter_and_lookup(two_units):
    root, written = two_units
    reader = ShardReader(root, domains=["code"])
    assert [s.sample_id for s in reader] == [s.sample_id for s in written if s.domain == "code"]
    target = written[6]
    found = reader.get(target.sample_id)  # lookup ignores the domain filter
    assert torch.equal(_bits(found.hidden_states), _bits(target.hidden_states))
    with pytest.raises(KeyError, match="no sample 'nope'"):
        reader.get("nope")


def test_ranks_partition_the_shards(two_units):
    root, written = two_units
    parts = [[s.sample_id for s in ShardReader(root, rank=r, world_size=2)] for r in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(s.sample_id for s in written)
    assert not set(parts[0]) & set(parts[1])
    with pytest.raises(ValueError, match="rank"):
        ShardReader(root, rank=2, world_size=2)


def test_prefetch_gives_the_same_stream_and_surfaces_errors(two_units):
    root, _ = two_units
    eager = [s.sample_id for s in ShardReader(root, prefetch=0)]
    assert [s.sample_id for s in ShardReader(root, prefetch=2)] == eager
    ds = Dataset.open(root)
    (path,) = [e.path for e in ds.manifest().shards if e.unit_id == "unit-b"]
    ds.storage.delete(path)
    it = iter(ShardReader(root, prefetch=2))
    with pytest.raises(
        DatasetError, match=r"unit-b\.\w+\.parquet: named by the manifest but missing"
    ):
        for _ in it:
            pass


def test_readers_use_the_manifest_not_the_directory(two_units):
    root, written = two_units
    ds = Dataset.open(root)
    write_unit(ds, "unit-uncommitted", 2)  # on storage, in no manifest
    assert len(list(ShardReader(root))) == len(written)


def test_older_version_stays_readable(two_units):
    root, written = two_units
    ds = Dataset.open(root)
    ds.commit([write_unit(ds, "unit-c", 2)[0]])
    assert len(list(ShardReader(root))) == len(written) + 2
    assert len(list(ShardReader(root, version=1))) == len(written)


def test_fp8_dataset_reads_within_bound(tmp_path):
    ds = Dataset.open(tmp_path)
    info, written = write_unit(ds, "unit-a", 3, codec="fp8")
    ds.commit([info])
    for g, w in zip(ShardReader(str(tmp_path)), written, strict=True):
        x = w.hidden_states
        frame = codecs.encode(x, "fp8")
        assert torch.equal(_bits(g.hidden_states), _bits(codecs.decode(frame)))
        assert bool(
            ((g.hidden_states.float() - x.float()).abs() <= codecs.fp8_error_bound(x, frame)).all()
        )


# ---------------------------------------------------------------- other readers (local files)


@pytest.fixture
def local_two_units(tmp_path):
    ds = Dataset.open(tmp_path)
    a, sa = write_unit(ds, "unit-a", 5)
    b, sb = write_unit(ds, "unit-b", 4)
    ds.commit([a, b])
    return ShardReader(str(tmp_path)).parquet_files(), sa + sb


def test_hf_datasets_loads_the_manifest_files(local_two_units, tmp_path):
    import datasets

    files, written = local_two_units
    dset = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf-cache")
    )
    assert dset.num_rows == len(written)
    assert dset["sample_id"] == [s.sample_id for s in written]
    row = dset.with_format("arrow")[3]
    frame = row.column("hidden_states")[0].as_py()
    assert torch.equal(_bits(codecs.decode(frame)), _bits(written[3].hidden_states))
    assert row.column("input_ids")[0].as_py() == list(written[3].input_ids)


def test_pyarrow_reads_the_manifest_files(local_two_units):
    files, written = local_two_units
    table = pq.ParquetDataset(files).read()
    assert table.num_rows == len(written)
    frame = table.column("last_hidden_state")[7].as_py()
    assert torch.equal(_bits(codecs.decode(frame)), _bits(written[7].last_hidden_state))


def test_duckdb_reads_the_manifest_files(local_two_units):
    files, written = local_two_units
    con = duckdb.connect()
    counts = dict(
        con.execute(
            "SELECT domain, count(*) FROM read_parquet(?) GROUP BY domain", [files]
        ).fetchall()
    )
    expected: dict[str, int] = {}
    for s in written:
        expected[s.domain] = expected.get(s.domain, 0) + 1
    assert counts == expected
    tokens = con.execute("SELECT sum(len(input_ids)) FROM read_parquet(?)", [files]).fetchone()[0]
    assert tokens == sum(len(s.input_ids) for s in written)
    (blob,) = con.execute(
        "SELECT hidden_states FROM read_parquet(?) WHERE sample_id = ?",
        [files, written[2].sample_id],
    ).fetchone()
    assert torch.equal(_bits(codecs.decode(bytes(blob))), _bits(written[2].hidden_states))


def test_hf_datasets_loads_the_files_from_s3(s3_uri, moto_endpoint, tmp_path):
    """Downstream repos: _latest -> manifest -> explicit file list, straight from S3."""
    import datasets

    ds = Dataset.open(s3_uri, endpoint_url=moto_endpoint)
    info, written = write_unit(ds, "unit-a", 3)
    ds.commit([info])
    files = ShardReader(ds).parquet_files()
    assert files == [f"{s3_uri}/{info.path}"]
    dset = datasets.load_dataset(
        "parquet",
        data_files=files,
        split="train",
        storage_options=ds.storage.storage_options(),
        cache_dir=str(tmp_path / "hf-cache"),
    )
    assert dset["sample_id"] == [s.sample_id for s in written]


def test_pyarrow_reads_the_manifest_files_on_either_storage(root):
    ds = Dataset.open(root)
    info, written = write_unit(ds, "unit-a", 3)
    ds.commit([info])
    filesystem, paths = ShardReader(root).arrow_files()
    table = pq.ParquetDataset(paths, filesystem=filesystem).read(
        columns=["sample_id", "hidden_states"]
    )
    assert table.column("sample_id").to_pylist() == [s.sample_id for s in written]
    frame = table.column("hidden_states")[1].as_py()
    assert torch.equal(_bits(codecs.decode(frame)), _bits(written[1].hidden_states))


def test_a_pinned_reader_keeps_its_bytes_and_a_follower_picks_up_new_versions(root):
    import threading

    from pipeline.table.lease import WriteSession

    ds = Dataset.open(root)
    session = WriteSession(ds, owner="regeneration").start()  # a regeneration is running
    got: list[str] = []

    def follow() -> None:  # started before anything is committed: waits for the first version
        follower = ShardReader(root, follow=True, poll_s=0.05, prefetch=2)
        got.extend(s.sample_id for s in follower)

    thread = threading.Thread(target=follow)
    thread.start()

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            time.sleep(0.05)

    a, sa = write_unit(ds, "unit-a", 3)
    ds.commit([a])
    pinned = {s.sample_id: _bits(s.hidden_states) for s in ShardReader(root, version=1)}
    wait_for(3)  # the follower has read version 1
    b, sb = write_unit(ds, "unit-b", 2)
    ds.commit([b], drop={a.path: [sa[0].sample_id]})  # version 2
    for s in ShardReader(root, version=1):  # the same bytes after version 2 landed
        assert torch.equal(_bits(s.hidden_states), pinned[s.sample_id])
    wait_for(5)
    assert sorted(got) == sorted(s.sample_id for s in sa + sb)  # v1's rows, then v2's new ones
    assert thread.is_alive()  # still following: the writer holds its lease
    session.close()
    thread.join(timeout=30)
    assert not thread.is_alive()  # the writer is gone: the follower ends
    assert sorted(s.sample_id for s in ShardReader(root)) == sorted(
        s.sample_id for s in sa[1:] + sb
    )


def test_verify_option_refuses_a_corrupt_shard(tmp_path):
    ds = Dataset.open(tmp_path)
    info, _ = write_unit(ds, "unit-a", 2)
    ds.commit([info])
    data = bytearray(ds.storage.read_bytes(info.path))
    data[200] ^= 0x01  # a flipped bit inside a tensor frame: Parquet itself may not notice
    (tmp_path / info.path).write_bytes(bytes(data))
    with pytest.raises(DatasetError, match="does not match the manifest's"):
        list(ShardReader(str(tmp_path), verify=True))


def test_hf_datasets_rows_filtered_by_dropped_ids_equal_the_readers(tmp_path):
    """What the README tells a downstream reader: load the files, filter the tombstones."""
    import datasets

    ds = Dataset.open(str(tmp_path / "ds"))
    a, sa = write_unit(ds, "unit-a", 5)
    ds.commit([a])
    b, sb = write_unit(ds, "unit-b", 3)
    ds.commit([b], drop={a.path: [sa[1].sample_id, sa[4].sample_id]})  # a refresh replaced two
    reader = ShardReader(str(tmp_path / "ds"))
    assert reader.dropped_ids() == {sa[1].sample_id, sa[4].sample_id}
    rows = datasets.load_dataset(
        "parquet", data_files=reader.parquet_files(), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert rows.num_rows == 8  # the files still hold the replaced rows
    dropped = reader.dropped_ids()
    rows = rows.filter(lambda r: r["sample_id"] not in dropped)
    assert sorted(rows["sample_id"]) == sorted(s.sample_id for s in reader)
