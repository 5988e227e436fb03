"""Encoded rows of an unfinished unit, kept on local disk instead of in memory.

A unit's shard is written in sample-id order when its last sample lands, so
its encoded rows wait until then. For a large target one unit's rows are
gigabytes: past a threshold the write-back appends them to the unit's spill
file (local disk, never a pickle: a small JSON header per row, then its
arrays and frames as raw bytes) and reads them back, in order, to write the
shard. The file is removed with the unit.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import threading
from typing import Any

import numpy as np

from pipeline.shards.writer import EncodedRow

_LEN = struct.Struct("<I")
_SCALARS = (
    "sample_id",
    "source",
    "domain",
    "finish_reason",
    "num_prompt_tokens",
    "num_generated_tokens",
)
_ARRAYS = {"input_ids": np.int32, "loss_mask": np.uint8}
_FRAMES = ("hidden_states", "last_hidden_state")


class SpillFile:
    """Append-only file of encoded rows with an in-memory index by sample id."""

    def __init__(self, directory: str | None, unit_id: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix=f"dspark-spill-{unit_id}-", dir=directory)
        self._fh = os.fdopen(fd, "w+b")
        self._index: dict[str, tuple[int, int]] = {}  # sample id -> (offset, length)
        self._lock = threading.Lock()
        self.nbytes = 0

    def append(self, row: EncodedRow) -> None:
        cols = row.columns
        blobs = [
            np.ascontiguousarray(cols[name], dtype=dt).tobytes() for name, dt in _ARRAYS.items()
        ]
        blobs += [bytes(cols[name]) for name in _FRAMES]
        header = {
            "scalars": {name: cols[name] for name in _SCALARS},
            "num_tokens": row.num_tokens,
            "nbytes": row.nbytes,
            "lengths": [len(b) for b in blobs],
        }
        head = json.dumps(header).encode()
        record = _LEN.pack(len(head)) + head + b"".join(blobs)
        with self._lock:
            offset = self._fh.seek(0, os.SEEK_END)
            self._fh.write(record)
            self._index[row.sample_id] = (offset, len(record))
            self.nbytes += len(record)

    def __contains__(self, sample_id: str) -> bool:
        return sample_id in self._index

    def read(self, sample_id: str) -> EncodedRow:
        offset, length = self._index[sample_id]
        with self._lock:
            self._fh.seek(offset)
            record = self._fh.read(length)
        (head_len,) = _LEN.unpack_from(record)
        header = json.loads(record[_LEN.size : _LEN.size + head_len])
        cols: dict[str, Any] = dict(header["scalars"])
        pos = _LEN.size + head_len
        names = [*_ARRAYS, *_FRAMES]
        for name, size in zip(names, header["lengths"], strict=True):
            blob = record[pos : pos + size]
            pos += size
            cols[name] = np.frombuffer(blob, dtype=_ARRAYS[name]) if name in _ARRAYS else blob
        return EncodedRow(cols["sample_id"], header["num_tokens"], header["nbytes"], cols)

    def close(self) -> None:
        self._fh.close()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
