"""Reading a shard file's rows back: what the writer wrote, tensor for tensor; damage is an error."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from pipeline.shards.errors import DatasetError
from pipeline.shards.reader import decode_rows, read_row_group
from pipeline.shards.writer import ShardWriter
from pipeline.storage import LocalStorage

from .helpers import provenance, sample


def _write(tmp_path, num_samples: int, **kwargs):
    storage = LocalStorage(tmp_path)
    samples = [sample(i, "unit-r") for i in range(num_samples)]
    with ShardWriter(storage, "unit-r", provenance(), **kwargs) as writer:
        for s in samples:
            writer.write(s)
    return tmp_path / writer.key, samples


def test_rows_decode_to_the_samples_written(tmp_path):
    path, samples = _write(tmp_path, 5, row_group_bytes=1)  # a row group per row
    pf = pq.ParquetFile(path, page_checksum_verification=True)
    assert pf.num_row_groups == 5
    got = [
        s for g in range(pf.num_row_groups) for s in decode_rows(read_row_group(pf, g, "f"), "f")
    ]
    assert [s.sample_id for s in got] == [s.sample_id for s in samples]
    for want, have in zip(samples, got, strict=True):
        assert torch.equal(have.input_ids, torch.tensor(want.input_ids, dtype=torch.int64))
        assert torch.equal(have.loss_mask, torch.tensor(want.loss_mask, dtype=torch.bool))
        assert torch.equal(have.hidden_states, want.hidden_states)
        assert torch.equal(have.last_hidden_state, want.last_hidden_state)
        assert (have.domain, have.finish_reason) == (want.domain, want.finish_reason)


def test_a_row_group_reads_only_the_columns_asked_for(tmp_path):
    path, _ = _write(tmp_path, 3)
    table = read_row_group(pq.ParquetFile(path), 0, "f", ["sample_id", "domain"])
    assert table.column_names == ["sample_id", "domain"]


def test_a_tensor_without_a_row_per_token_is_refused_naming_the_sample(tmp_path):
    path, _ = _write(tmp_path, 2)
    table = pq.ParquetFile(path).read()
    short = table.set_column(
        table.schema.get_field_index("input_ids"),
        "input_ids",
        table.column("input_ids").combine_chunks().slice(0, 1).take([0, 0]),
    )
    with pytest.raises(DatasetError, match="shard.parquet, sample 'unit-r-00001': hidden_states"):
        list(decode_rows(short, "shard.parquet"))


def test_a_flipped_byte_in_a_page_is_an_error_naming_the_row_group(tmp_path):
    path, _ = _write(tmp_path, 2, row_group_bytes=1)
    pf = pq.ParquetFile(path)
    column = pf.metadata.row_group(1).column(pf.schema_arrow.get_field_index("hidden_states"))
    data = bytearray(path.read_bytes())
    data[column.data_page_offset + column.total_compressed_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    damaged = pq.ParquetFile(path, page_checksum_verification=True)
    with pytest.raises(DatasetError, match="f, row group 1: unreadable .* damaged"):
        read_row_group(damaged, 1, "f")
