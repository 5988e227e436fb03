"""Read a shard file's rows back: one row group at a time, decoded into `TrainingSample`s.

The inverse of writer.py for one open Parquet file: `read_row_group` reads a
row group with its page checksums verified (ShardWriter writes them), so a
flipped bit is a `DatasetError` naming the file and group, never a silently
different tensor; `decode_rows` turns the rows into tensors through the codecs
and checks each tensor has a row per token. Which files make a dataset version,
and the checks of a file against its manifest entry, are the table's
(`pipeline/table/reader.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.shards import codecs
from pipeline.shards.errors import DatasetError
from pipeline.storage import is_transient


@dataclass(frozen=True)
class TrainingSample:
    """One decoded sample."""

    sample_id: str
    source: str
    domain: str
    input_ids: torch.Tensor  # (T,) int64
    loss_mask: torch.Tensor  # (T,) bool
    hidden_states: torch.Tensor  # (T, k*H) bfloat16
    last_hidden_state: torch.Tensor  # (T, H) bfloat16
    finish_reason: str
    num_prompt_tokens: int
    num_generated_tokens: int


def damaged(where: str, err: BaseException) -> str:
    return (
        f"{where}: unreadable ({type(err).__name__}: {err}); the file is damaged "
        "(`dspark-targets verify` checks every shard against its sha256)"
    )


def read_row_group(
    pf: pq.ParquetFile, group: int, where: str, columns: list[str] | None = None
) -> pa.Table:
    """One row group of an open shard, its page checksums verified; damage is a DatasetError."""
    try:
        return pf.read_row_group(group, columns=columns)
    except (OSError, pa.ArrowException, ValueError) as err:
        if is_transient(err):
            raise
        raise DatasetError(damaged(f"{where}, row group {group}", err)) from None


def decode_rows(table: pa.Table, where: str) -> Iterator[TrainingSample]:
    """Turn rows of a shard table into TrainingSamples, checking tensor shapes."""
    cols = {name: table.column(name) for name in table.column_names}
    for i in range(table.num_rows):
        ids = cols["input_ids"][i].values.to_numpy(zero_copy_only=False)
        mask = cols["loss_mask"][i].values.to_numpy(zero_copy_only=False)
        sample_id = cols["sample_id"][i].as_py()
        tensors = {}
        for name in ("hidden_states", "last_hidden_state"):
            frame = cols[name][i].as_buffer()
            try:
                tensors[name] = codecs.decode(memoryview(frame))
            except ValueError as err:
                raise DatasetError(f"{where}, sample {sample_id!r}, {name}: {err}") from None
            if tensors[name].shape[0] != len(ids):
                raise DatasetError(
                    f"{where}, sample {sample_id!r}: {name} has {tensors[name].shape[0]} rows "
                    f"for {len(ids)} tokens"
                )
        yield TrainingSample(
            sample_id=sample_id,
            source=cols["source"][i].as_py(),
            domain=cols["domain"][i].as_py(),
            input_ids=torch.from_numpy(ids.astype("int64")),
            loss_mask=torch.from_numpy(mask.astype(bool)),
            hidden_states=tensors["hidden_states"],
            last_hidden_state=tensors["last_hidden_state"],
            finish_reason=cols["finish_reason"][i].as_py(),
            num_prompt_tokens=cols["num_prompt_tokens"][i].as_py(),
            num_generated_tokens=cols["num_generated_tokens"][i].as_py(),
        )
