"""ShardWriter: deterministic names, counts and hashes, row groups by bytes, validation."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pyarrow.parquet as pq
import pytest
import torch

from pipeline.shards.schema import KEY_PROVENANCE, KEY_SCHEMA_VERSION, KEY_UNIT_ID
from pipeline.shards.writer import ShardWriter, shard_key
from pipeline.storage import LocalStorage
from pipeline.table.dataset import Dataset

from .helpers import provenance, sample, write_unit


def test_shard_name_derives_from_the_unit_and_a_fresh_attempt(tmp_path):
    key = shard_key("corpus-a.unit-000017", "0123abcd")
    assert key == "shards/corpus-a.unit-000017.0123abcd.parquet"
    for bad in ["", "../x", "a/b", "-lead", "sp ace"]:
        with pytest.raises(ValueError, match="not a valid shard name"):
            shard_key(bad, "0123abcd")
    with pytest.raises(ValueError, match="8 lowercase hex"):
        shard_key("unit", "../x")
    storage = LocalStorage(tmp_path)
    names = {ShardWriter(storage, "unit-1", provenance()).key for _ in range(20)}
    assert len(names) == 20  # every writer, every retry: a name of its own


def test_info_matches_the_file(tmp_path):
    ds = Dataset.open(tmp_path)
    info, samples = write_unit(ds, "unit-1", 7)
    path = tmp_path / info.path
    data = path.read_bytes()
    assert info.path.startswith("shards/unit-1.") and info.path.endswith(".parquet")
    assert info.bytes == len(data)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert info.rows == 7
    assert info.tokens == sum(len(s.input_ids) for s in samples)
    assert info.codec == "bf16" and info.schema_version == 1
    # What the commit's sample index is built from: id, domain, source, tokens per row.
    assert info.samples == tuple(
        (s.sample_id, s.domain, s.source, len(s.input_ids)) for s in samples
    )
    # No temp files left beside it.
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_provenance_and_version_in_parquet_metadata(tmp_path):
    ds = Dataset.open(tmp_path)
    info, _ = write_unit(ds, "unit-1", 2)
    meta = pq.read_schema(tmp_path / info.path).metadata
    assert meta[KEY_SCHEMA_VERSION] == b"1"
    assert meta[KEY_UNIT_ID] == b"unit-1"
    prov = json.loads(meta[KEY_PROVENANCE])
    assert prov["target_revision"] == "sha256:0123abcd"
    assert prov["aux_layer_ids"] == [2, 5] and prov["hidden_size"] == 32
    assert prov["layer_convention"].startswith("vllm_aux")
    assert prov["generation"]["max_new_tokens"] == 64


def test_row_groups_are_cut_by_bytes(tmp_path):
    budget = 4000
    ds = Dataset.open(tmp_path)
    info, _ = write_unit(ds, "unit-1", 12, row_group_bytes=budget)
    pf = pq.ParquetFile(tmp_path / info.path)
    assert pf.metadata.num_row_groups > 2
    for g in range(pf.metadata.num_row_groups):
        t = pf.read_row_group(g)
        # Encoded bytes per row, as the writer counts them.
        sizes = [
            len(h) + len(lh) + 5 * len(ids)
            for h, lh, ids in zip(
                t.column("hidden_states").to_pylist(),
                t.column("last_hidden_state").to_pylist(),
                t.column("input_ids").to_pylist(),
                strict=True,
            )
        ]
        if g < pf.metadata.num_row_groups - 1:
            # Cut as soon as the budget is reached: full, but not one row more.
            assert sum(sizes) >= budget > sum(sizes) - sizes[-1]
        else:
            assert sum(sizes) - sizes[-1] < budget
    assert pf.metadata.num_rows == 12


def test_tensor_columns_are_stored_uncompressed_and_small_ones_with_zstd(tmp_path):
    ds = Dataset.open(tmp_path)
    info, _ = write_unit(ds, "unit-1", 3)
    group = pq.ParquetFile(tmp_path / info.path).metadata.row_group(0)
    compression = {
        group.column(i).path_in_schema: group.column(i).compression
        for i in range(group.num_columns)
    }
    assert compression["hidden_states"] == "UNCOMPRESSED"
    assert compression["last_hidden_state"] == "UNCOMPRESSED"
    assert compression["input_ids.list.element"] == "ZSTD"
    assert compression["sample_id"] == "ZSTD"


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: {"hidden_states": s.hidden_states[:, :10]}, "hidden_states has shape"),
        (lambda s: {"last_hidden_state": s.last_hidden_state[:-1]}, "last_hidden_state has shape"),
        (lambda s: {"loss_mask": list(s.loss_mask)[:-1]}, "loss_mask has"),
        (lambda s: {"loss_mask": [2] * len(s.input_ids)}, "only 0 and 1"),
        (lambda s: {"num_generated_tokens": s.num_generated_tokens + 1}, "num_prompt_tokens"),
        (lambda s: {"finish_reason": "tired"}, "finish_reason"),
        (lambda s: {"input_ids": []}, "empty"),
        (lambda s: {"hidden_states": s.hidden_states.float()}, "bfloat16"),
    ],
)
def test_bad_samples_are_refused_naming_sample_and_field(tmp_path, change, message):
    good = sample(0, "unit-1")
    bad = dataclasses.replace(good, **change(good))
    with ShardWriter(LocalStorage(tmp_path), "unit-1", provenance()) as writer:
        with pytest.raises((ValueError, TypeError), match=message) as err:
            writer.write(bad)
        assert "unit-1-00000" in str(err.value)
        writer.write(good)  # the writer stays usable after a refused sample
    assert writer.info.rows == 1


def test_duplicate_sample_id_in_a_unit_is_refused(tmp_path):
    with ShardWriter(LocalStorage(tmp_path), "unit-1", provenance()) as writer:
        writer.write(sample(0, "unit-1"))
        with pytest.raises(ValueError, match="duplicate sample_id"):
            writer.write(sample(0, "unit-1"))


def test_exception_discards_the_shard(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with ShardWriter(
            LocalStorage(tmp_path), "unit-1", provenance(), row_group_bytes=1000
        ) as writer:
            for i in range(5):
                writer.write(sample(i, "unit-1"))  # row groups already flushed to the temp file
            raise RuntimeError("boom")
    assert list((tmp_path / "shards").iterdir()) == []


def test_empty_unit_gets_an_empty_shard(tmp_path):
    with ShardWriter(LocalStorage(tmp_path), "unit-empty", provenance()) as writer:
        pass
    assert writer.info.rows == 0
    assert pq.read_table(tmp_path / writer.info.path).num_rows == 0


def test_fp8_shard_records_its_codec(tmp_path):
    ds = Dataset.open(tmp_path)
    info, samples = write_unit(ds, "unit-1", 3, codec="fp8")
    bf16_info, _ = write_unit(Dataset.open(tmp_path / "b"), "unit-1", 3)
    assert info.codec == "fp8"
    assert info.bytes < bf16_info.bytes
    assert samples[0].hidden_states.dtype == torch.bfloat16
