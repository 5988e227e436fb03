"""Write one shard: the samples of one deterministic work unit, as one Parquet file.

The shard's key is `shards/<unit_id>.<attempt>.parquet`: the unit part derives
from the unit's inputs, the attempt part is fresh for every writer. A name is
written once, create-only (`Storage.open_create`), so a retried unit (a Ray
task that may or may not have run), a second driver or a late zombie writer
can add a file but never change the bytes of one a manifest names: the
manifest names exactly the file whose hash the writer computed. Two attempts
of one unit cannot both be published either: the commit refuses a version
that would list a sample id twice (table/checks.py). The file appears under its
name only when `close()` succeeds; it becomes part of a dataset only when a
manifest names it.

The writer reports what it wrote: rows, tokens, bytes, sha256 and, per row,
the sample id, domain, source and token count (`ShardInfo.samples`), from
which the commit builds the shard's sample index (sidecar.py).

Parquet layout (measured, see codecs.py and bench/RESULTS.md): the two tensor
columns hold one codec frame per row and are stored uncompressed (the frames
are already zstd-compressed; compressing again costs time and gains nothing);
the small columns use zstd with dictionaries for the low-cardinality strings.
Row groups are cut by encoded bytes (default 64 MiB, at least one row), so a
reader holds a bounded amount of memory whatever the sequence lengths are.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow.parquet as pq

from pipeline.shards.columns import rows_table
from pipeline.shards.schema import Provenance, shard_arrow_schema
from pipeline.storage import Storage

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DEFAULT_ROW_GROUP_BYTES = 64 << 20
SHARD_PREFIX = "shards/"
_UNIT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,199}")
_ATTEMPT = re.compile(r"[0-9a-f]{8}")
_FINISH_REASONS = {"stop", "length", "abort"}

# Per-column settings are keyed by the Parquet leaf path (`col.list.element` for lists).
_ZSTD_COLUMNS = (
    "sample_id",
    "source",
    "domain",
    "input_ids.list.element",
    "loss_mask.list.element",
    "finish_reason",
    "num_prompt_tokens",
    "num_generated_tokens",
)
_PARQUET_OPTIONS: dict[str, Any] = dict(
    compression={
        **{name: "zstd" for name in _ZSTD_COLUMNS},
        "hidden_states": "none",
        "last_hidden_state": "none",
    },
    use_dictionary=["source", "domain", "finish_reason"],
    write_statistics=["sample_id", "source", "domain", "finish_reason"],
    write_page_index=False,
    write_page_checksum=True,
)


def new_attempt() -> str:
    """A fresh attempt token (8 hex digits): one per writer, so no name is written twice."""
    return secrets.token_hex(4)


def shard_key(unit_id: str, attempt: str) -> str:
    """The storage key of one attempt at a unit's shard."""
    if not _UNIT_ID.fullmatch(unit_id):
        raise ValueError(
            f"unit id {unit_id!r} is not a valid shard name: use 1-200 characters from "
            "[A-Za-z0-9._=-], starting with a letter or digit"
        )
    if not _ATTEMPT.fullmatch(attempt):
        raise ValueError(f"attempt {attempt!r} must be 8 lowercase hex digits")
    return f"{SHARD_PREFIX}{unit_id}.{attempt}.parquet"


@dataclass(frozen=True)
class Sample:
    """One regenerated assistant turn with its captured hidden states (schema v1)."""

    sample_id: str
    source: str
    domain: str
    input_ids: Sequence[int] | np.ndarray | torch.Tensor  # (T,)
    loss_mask: Sequence[int] | np.ndarray | torch.Tensor  # (T,) 0/1
    hidden_states: torch.Tensor  # (T, k*H), bfloat16 for codec bf16
    last_hidden_state: torch.Tensor  # (T, H), after the final norm
    finish_reason: str
    num_prompt_tokens: int
    num_generated_tokens: int


@dataclass(frozen=True)
class ShardInfo:
    """What the writer knows about a finished shard; the manifest entry is built from it."""

    path: str  # storage key, e.g. "shards/u-000001.3fa91c0e.parquet"
    unit_id: str
    rows: int
    tokens: int  # sum of T over rows
    bytes: int  # file size
    sha256: str  # of the whole file
    codec: str
    schema_version: int
    provenance: Provenance
    # (sample_id, domain, source, tokens) per row, in file order: the commit's sample index.
    samples: tuple[tuple[str, str, str, int], ...] = ()
    # (sample_id, input_hash) of samples the unit was asked for that gave no row;
    # set by the producer (the sink), not the writer.
    attempted: tuple[tuple[str, str], ...] = ()


class _HashingSink:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: bytes | memoryview) -> int:
        self.sha256.update(data)
        self.size += len(data)
        self._raw.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:  # the storage context closes the real file
        self.closed = True


def _as_int_array(values: Any, dtype: type, what: str) -> np.ndarray:
    if hasattr(values, "detach"):  # torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(
            f"{what} must be a 1-D integer sequence, got shape {arr.shape} dtype {arr.dtype}"
        )
    info = np.iinfo(dtype)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise ValueError(f"{what} has values outside {np.dtype(dtype).name}")
    return arr.astype(dtype, copy=False)


class ShardWriter:
    """Writes the samples of one work unit into `shards/<unit_id>.<attempt>.parquet`.

    Use as a context manager: leaving the block normally finishes the shard
    (`info` is then set), an exception discards it. Samples are validated
    against the provenance (hidden size, number of layers) as they arrive.
    """

    def __init__(
        self,
        storage: Storage,
        unit_id: str,
        provenance: Provenance,
        *,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        attempt: str | None = None,
    ) -> None:
        if row_group_bytes <= 0:
            raise ValueError(f"row_group_bytes must be positive, got {row_group_bytes}")
        self.storage = storage
        self.unit_id = unit_id
        self.attempt = attempt or new_attempt()
        self.key = shard_key(unit_id, self.attempt)
        self.provenance = provenance
        from pipeline.shards import codecs  # torch, only once something is written

        self.codec = codecs.get_codec(provenance.codec)
        self.row_group_bytes = row_group_bytes
        self.schema = shard_arrow_schema(provenance, unit_id)
        self.info: ShardInfo | None = None
        self._rows: list[dict[str, Any]] = []
        self._buffered = 0
        self._num_rows = 0
        self._num_tokens = 0
        self._ids: set[str] = set()
        self._samples: list[tuple[str, str, str, int]] = []
        self._ctx: Any = None
        self._sink: _HashingSink | None = None
        self._writer: pq.ParquetWriter | None = None
        self._done = False

    # -------------------------------------------------------------- lifecycle

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _open(self) -> None:
        self._ctx = self.storage.open_create(self.key)
        raw = self._ctx.__enter__()
        self._sink = _HashingSink(raw)
        self._writer = pq.ParquetWriter(self._sink, self.schema, **_PARQUET_OPTIONS)

    def write(self, sample: Sample) -> None:
        """Validate, encode and buffer one sample; flushes a row group when full."""
        self.write_encoded(encode_sample(sample, self.provenance, self.codec, shard=self.key))

    def write_encoded(self, row: EncodedRow) -> None:
        """Buffer one sample encoded by `encode_sample` (e.g. in a worker thread)."""
        if self._done:
            raise ValueError(f"shard {self.key} is already closed")
        if row.sample_id in self._ids:
            raise ValueError(
                f"shard {self.key}, sample {row.sample_id!r}: duplicate sample_id in this unit"
            )
        self._ids.add(row.sample_id)
        cols = row.columns
        self._samples.append((row.sample_id, cols["domain"], cols["source"], row.num_tokens))
        self._num_rows += 1
        self._num_tokens += row.num_tokens
        self._rows.append(row.columns)
        self._buffered += row.nbytes
        if self._buffered >= self.row_group_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        if self._writer is None:
            self._open()
        table = rows_table(self._rows, self.schema)
        self._writer.write_table(table, row_group_size=len(self._rows))
        self._rows, self._buffered = [], 0

    def close(self) -> ShardInfo:
        """Finish the file; returns its ShardInfo (also kept as `self.info`)."""
        if self.info is not None:
            return self.info
        if self._done:
            raise ValueError(f"shard {self.key} was aborted")
        try:
            self._flush()
            if self._writer is None:
                self._open()  # an empty unit still gets a (zero-row) shard
            self._writer.close()
        except BaseException:
            self.abort()
            raise
        # Publish under the final name, create-only. If this fails the storage
        # layer has already cleaned up (temp file removed / upload aborted); if
        # the name exists (AlreadyExists) its first bytes stay: no retry here.
        ctx, self._ctx, self._done = self._ctx, None, True
        ctx.__exit__(None, None, None)
        self.info = ShardInfo(
            path=self.key,
            unit_id=self.unit_id,
            rows=self._num_rows,
            tokens=self._num_tokens,
            bytes=self._sink.size,
            sha256=self._sink.sha256.hexdigest(),
            codec=self.codec.name,
            schema_version=int(self.schema.metadata[b"dspark.schema_version"]),
            provenance=self.provenance,
            samples=tuple(self._samples),
        )
        log.debug(  # one per unit: the commit and progress lines say it at INFO
            "shard written path=%s rows=%d tokens=%d bytes=%d codec=%s",
            self.storage.url(self.key),
            self.info.rows,
            self.info.tokens,
            self.info.bytes,
            self.info.codec,
        )
        return self.info

    def abort(self) -> None:
        """Discard the shard: nothing appears under its name."""
        if self._done:
            return
        self._done = True
        self._rows = []
        if self._ctx is not None:
            err = RuntimeError(f"shard {self.key} aborted")
            try:
                if self._writer is not None:
                    self._writer.close()
            except Exception:
                pass
            self._ctx.__exit__(RuntimeError, err, None)


@dataclass(frozen=True)
class EncodedRow:
    """One validated sample with its tensors already codec-encoded: a shard row."""

    sample_id: str
    num_tokens: int  # T
    nbytes: int  # bytes held in memory (frames + token columns)
    columns: dict[str, Any]  # the schema's columns


def encode_sample(
    s: Sample, provenance: Provenance, codec: Any, *, shard: str = "<unit>"
) -> EncodedRow:
    """Validate a sample against the provenance (T, layers, hidden size) and encode its tensors.

    Pure and thread-safe (the codecs release the GIL in zstd and numpy), so
    callers may encode in worker threads and hand rows to `write_encoded`.
    """
    from pipeline.shards import codecs

    if not isinstance(s.sample_id, str) or not s.sample_id:
        raise ValueError(f"shard {shard}: sample_id must be a non-empty string")
    where = f"shard {shard}, sample {s.sample_id!r}"
    ids = _as_int_array(s.input_ids, np.int32, f"{where}: input_ids")
    mask = _as_int_array(s.loss_mask, np.uint8, f"{where}: loss_mask")
    num_tokens = len(ids)
    if num_tokens == 0:
        raise ValueError(f"{where}: input_ids is empty")
    if len(mask) != num_tokens:
        raise ValueError(f"{where}: loss_mask has {len(mask)} entries, input_ids {num_tokens}")
    if mask.max() > 1:
        raise ValueError(f"{where}: loss_mask must hold only 0 and 1")
    if s.num_prompt_tokens < 0 or s.num_generated_tokens < 0:
        raise ValueError(f"{where}: token counts must be non-negative")
    if s.num_prompt_tokens + s.num_generated_tokens != num_tokens:
        raise ValueError(
            f"{where}: num_prompt_tokens ({s.num_prompt_tokens}) + num_generated_tokens "
            f"({s.num_generated_tokens}) != len(input_ids) ({num_tokens})"
        )
    if s.finish_reason not in _FINISH_REASONS:
        raise ValueError(
            f"{where}: finish_reason {s.finish_reason!r} is not one of {sorted(_FINISH_REASONS)}"
        )
    prov = provenance
    expect = {
        "hidden_states": (num_tokens, prov.hidden_states_width),
        "last_hidden_state": (num_tokens, prov.hidden_size),
    }
    frames = {}
    for name, shape in expect.items():
        tensor = getattr(s, name)
        if tuple(tensor.shape) != shape:
            raise ValueError(
                f"{where}: {name} has shape {tuple(tensor.shape)}, expected {shape} "
                f"(T={num_tokens}, {len(prov.aux_layer_ids)} layers x hidden_size {prov.hidden_size})"
            )
        try:
            frames[name] = codecs.encode(tensor, codec)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{where}: {name}: {err}") from None
    columns = {
        "sample_id": s.sample_id,
        "source": s.source,
        "domain": s.domain,
        "input_ids": ids,
        "loss_mask": mask,
        "hidden_states": frames["hidden_states"],
        "last_hidden_state": frames["last_hidden_state"],
        "finish_reason": s.finish_reason,
        "num_prompt_tokens": int(s.num_prompt_tokens),
        "num_generated_tokens": int(s.num_generated_tokens),
    }
    nbytes = len(frames["hidden_states"]) + len(frames["last_hidden_state"]) + 5 * num_tokens
    return EncodedRow(s.sample_id, num_tokens, nbytes, columns)
