"""A flipped bit in a committed shard is an error for every reader, never a changed tensor.

Shards carry Parquet page CRCs and readers verify them, so even a reader that does not
re-hash the file (`verify=False`, the trainer) refuses a damaged page, naming the shard.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from shards.helpers import write_unit

from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.reader import ShardReader


def test_shards_carry_page_crcs_and_a_flipped_bit_is_named(tmp_path):
    ds = Dataset.open(tmp_path / "dataset")
    info, samples = write_unit(ds, "unit-a", 6)
    ds.commit([info])
    path = Path(ds.shard_url(info.path))
    meta = pq.ParquetFile(path).metadata
    assert meta.num_rows == 6
    data = bytearray(path.read_bytes())
    flips = 0
    for offset in range(len(data) // 8, len(data) * 3 // 4, len(data) // 16):
        damaged = bytearray(data)
        damaged[offset] ^= 0x10
        path.write_bytes(bytes(damaged))
        try:
            got = list(ShardReader(ds.uri, prefetch=0))
        except DatasetError as err:
            assert info.path in str(err)
            flips += 1
            continue
        for want, have in zip(samples, got, strict=True):  # a byte no reader uses
            assert (want.hidden_states.view(-1) == have.hidden_states.view(-1)).all()
    path.write_bytes(bytes(data))
    assert flips >= 8
    with pytest.raises(DatasetError, match="the file is corrupt"):
        damaged = bytearray(data)
        damaged[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(damaged))
        list(ShardReader(ds.uri, verify=True, prefetch=0))
