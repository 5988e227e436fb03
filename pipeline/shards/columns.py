"""A row group's Arrow table built from its rows' buffers, without per-value conversion.

`pa.table(dict_of_lists)` converts every value through pyarrow's Python
converter, and its first call imports pandas (pyarrow checks each input for
a DataFrame): ~0.4 s of CPU in every process that writes shards, the
write-back's included, where it competes with the engine for the host core.
Here each column is laid out from its values' bytes (offsets + data,
`Array.from_buffers`), which needs neither. Types outside the shard schema's
(strings, binaries, lists of integers, integers) go through `pa.array`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa


def _offsets(lengths: list[int], dtype: type) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=dtype)
    np.cumsum(lengths, out=out[1:])
    return out


def _variable(values: list[Any], type_: pa.DataType, offset_dtype: type) -> pa.Array:
    """string/binary values (str or bytes) from one joined buffer and their offsets."""
    text = pa.types.is_string(type_) or pa.types.is_large_string(type_)
    if not all(isinstance(v, str if text else bytes) for v in values):
        return pa.array(values, type=type_)  # pyarrow converts or names what is wrong
    if text:
        values = [v.encode("utf-8") for v in values]
    lengths = [len(v) for v in values]
    offsets = _offsets(lengths, np.int64)
    if offsets[-1] > np.iinfo(offset_dtype).max:
        return pa.array(values, type=type_)  # past 32-bit offsets: let pyarrow refuse it
    data = b"".join(values)
    buffers = [None, pa.py_buffer(offsets.astype(offset_dtype, copy=False)), pa.py_buffer(data)]
    return pa.Array.from_buffers(type_, len(values), buffers)


def _fits(wide: np.ndarray, dtype: type) -> np.ndarray | None:
    """`wide` as `dtype` when it holds integers in its range (one check over the column)."""
    if wide.size == 0:
        return wide.astype(dtype)
    if not np.issubdtype(wide.dtype, np.integer):
        return None
    info = np.iinfo(dtype)
    if wide.min() < info.min or wide.max() > info.max:
        return None
    return wide.astype(dtype, copy=False)


def _integers(values: list[Any], type_: pa.DataType) -> pa.Array:
    dtype = type_.to_pandas_dtype()
    arr = _fits(np.asarray(values), dtype)
    if arr is None:
        return pa.array(values, type=type_)  # pyarrow names what is wrong
    return pa.Array.from_buffers(type_, len(arr), [None, pa.py_buffer(arr)])


def _integer_lists(values: list[Any], type_: pa.ListType) -> pa.Array:
    dtype = type_.value_type.to_pandas_dtype()
    parts = [np.asarray(v) for v in values]
    if any(p.ndim != 1 for p in parts):
        return pa.array(values, type=type_)
    offsets = _offsets([len(p) for p in parts], np.int64)
    flat = _fits(np.concatenate(parts) if parts else np.zeros(0, dtype=dtype), dtype)
    if flat is None or offsets[-1] > np.iinfo(np.int32).max:
        return pa.array(values, type=type_)
    child = pa.Array.from_buffers(type_.value_type, len(flat), [None, pa.py_buffer(flat)])
    offsets = pa.py_buffer(offsets.astype(np.int32))
    return pa.Array.from_buffers(type_, len(parts), [None, offsets], children=[child])


def column(values: list[Any], type_: pa.DataType) -> pa.Array:
    """One non-null column of `type_` from its Python/numpy values."""
    if any(v is None for v in values):
        return pa.array(values, type=type_)
    if pa.types.is_string(type_) or pa.types.is_binary(type_):
        return _variable(values, type_, np.int32)
    if pa.types.is_large_string(type_) or pa.types.is_large_binary(type_):
        return _variable(values, type_, np.int64)
    if pa.types.is_integer(type_):
        return _integers(values, type_)
    if pa.types.is_list(type_) and pa.types.is_integer(type_.value_type):
        return _integer_lists(values, type_)
    return pa.array(values, type=type_)


def rows_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """The table of `rows` (dicts by column name) under `schema`, validated."""
    arrays = [column([row[f.name] for row in rows], f.type) for f in schema]
    table = pa.Table.from_arrays(arrays, schema=schema)
    table.validate()
    return table
