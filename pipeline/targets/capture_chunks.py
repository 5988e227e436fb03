"""One engine step's captured rows (`CaptureChunk`) and the spool file that carries them.

Spool format (one file per engine step, written atomically: temp + rename):
a safetensors file with tensors `rows` (num_rows, num_aux, H) in the model
dtype, or `planes` (num_aux, num_rows, H: the same rows stream-major, as the
capture worker writes them straight from the model's per-layer tensors), and
`spans` (int64, (2, num_requests): each request's start and length), and
string metadata `format`, `step`, `keys` (the requests' keys joined by
newlines): rows `offset .. offset+length` are positions `start ..`
of request `key`, offsets accumulate in list order. The writer frames the
file itself (one vectored write of header and tensors, no serialised copy),
and files are recycled: the reader renames a file it has read to a free slot
(`.free-<writer>-<step mod SPOOL_SLOTS>`) that the writer takes again
SPOOL_SLOTS steps later, so a step overwrites pages tmpfs already holds
instead of allocating new ones (the engine writes a file every step, on the
model worker's critical path: bench/RESULTS.md has the figures).
No pickle: a spool file is data and never executes code when read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SPOOL_FORMAT = "dspark-capture-chunk/3"
SPOOL_SUFFIX = ".safetensors"
SPOOL_SLOTS = 16  # free files kept per writer for reuse
SPOOL_RECYCLE_BYTES = 16 << 20  # larger files (long prefills) are removed, not kept
_SPOOL_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
_SPOOL_TORCH_DTYPES = {v: k for k, v in _SPOOL_DTYPES.items()}


@dataclass
class CaptureChunk:
    """Rows written by one engine step for every capturing request in it.

    `rows[offset_i : offset_i + lengths[i]]` are positions `starts[i] ...` of
    request `keys[i]` (offsets accumulate in list order).
    """

    step: int
    keys: list[str]
    starts: list[int]
    lengths: list[int]
    rows: torch.Tensor  # (num_rows, num_aux, H), CPU, model dtype


def write_spool(directory: str, writer_id: str, chunk: CaptureChunk) -> None:
    """One safetensors file per step; readers never see a partial file (temp + rename)."""
    rows = chunk.rows.contiguous()
    index = (chunk.step, chunk.keys, chunk.starts, chunk.lengths)
    _write_file(directory, writer_id, index, "rows", list(rows.shape), rows.dtype, [rows])


def write_spool_planes(
    directory: str,
    writer_id: str,
    step: int,
    keys: list[str],
    starts: list[int],
    lengths: list[int],
    planes: list[torch.Tensor],
) -> None:
    """`write_spool` for rows given as one (num_rows, H) tensor per stream: the file holds
    them stream-major (`planes`, (num_aux, num_rows, H)), written straight from the
    engine's tensors, so the model worker copies nothing before the write; the reader
    sees the same (num_rows, num_aux, H) rows (a transposed view)."""
    planes = [p.contiguous() for p in planes]
    shape = [len(planes), *planes[0].shape]
    index = (step, keys, starts, lengths)
    _write_file(directory, writer_id, index, "planes", shape, planes[0].dtype, planes)


def _write_file(
    directory: str,
    writer_id: str,
    index: tuple[int, list[str], list[int], list[int]],
    name: str,
    shape: list[int],
    dtype: torch.dtype,
    tensors: list[torch.Tensor],
) -> None:
    import numpy as np
    import torch

    step, keys, starts, lengths = index  # the step, and each request's key and span
    file_name = f"{step:012d}-{writer_id}{SPOOL_SUFFIX}"
    tmp = os.path.join(directory, f".{file_name}.tmp")
    code = _SPOOL_DTYPES.get(str(dtype).removeprefix("torch."))
    if code is None:
        raise ValueError(f"spool rows must be one of {sorted(_SPOOL_DTYPES)}, got {dtype}")
    spans = np.array([starts, lengths], dtype=np.int64).reshape(2, -1)
    data = [t.view(torch.uint8).numpy().reshape(-1) for t in tensors]
    nbytes = sum(d.size for d in data)
    header = {
        "__metadata__": {
            "format": SPOOL_FORMAT,
            "step": str(step),
            "keys": "\n".join(keys),
        },
        name: {"dtype": code, "shape": shape, "data_offsets": [0, nbytes]},
        "spans": {
            "dtype": "I64",
            "shape": list(spans.shape),
            "data_offsets": [nbytes, nbytes + spans.nbytes],
        },
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors aligns the data to 8 bytes
    parts = [len(head).to_bytes(8, "little"), head, *data, spans.reshape(-1).view(np.uint8)]
    size = sum(len(p) for p in parts)
    try:  # a free file of this writer: its pages are already there
        os.rename(os.path.join(directory, _free_name(writer_id, step)), tmp)
        fd = os.open(tmp, os.O_WRONLY)
    except FileNotFoundError:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if hasattr(os, "pwritev"):
            written = os.pwritev(fd, parts, 0)
        else:  # e.g. macOS before 11: one joined write
            written = os.pwrite(fd, b"".join(parts), 0)
        if written != size:
            raise OSError(f"spool file {tmp}: wrote {written} of {size} bytes")
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(directory, file_name))


def _free_name(writer_id: str, step: int) -> str:
    return f".free-{writer_id}-{step % SPOOL_SLOTS}"


def read_spool(directory: str) -> list[CaptureChunk]:
    """Every complete chunk file in `directory`, recycled (or removed) once read."""
    chunks = []
    for name in sorted(os.listdir(directory)):
        if name.startswith(".") or not name.endswith(SPOOL_SUFFIX):
            continue
        path = os.path.join(directory, name)
        chunk, size = _read_chunk(path)
        writer_id = name[: -len(SPOOL_SUFFIX)].partition("-")[2]
        if size <= SPOOL_RECYCLE_BYTES and writer_id:
            os.replace(path, os.path.join(directory, _free_name(writer_id, chunk.step)))
        else:
            os.remove(path)
        chunks.append(chunk)
    return chunks


def _read_chunk(path: str) -> tuple[CaptureChunk, int]:
    """One spool file (safetensors, as `write_spool` frames it) and its size in bytes."""
    import numpy as np
    import torch

    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data = bytearray(size)  # writable: the final norm is applied to the rows in place
        if fh.readinto(data) != size:
            raise ValueError(f"{path}: short read")
    try:
        head_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + head_len])
        meta = header.get("__metadata__") or {}
    except (ValueError, AttributeError) as err:
        raise ValueError(f"{path}: not a capture chunk ({err})") from None
    if meta.get("format") != SPOOL_FORMAT:
        raise ValueError(f"{path}: not a capture chunk (format {meta.get('format')!r})")
    base = 8 + head_len
    try:
        name = "planes" if "planes" in header else "rows"
        rows_at, spans_at = header[name], header["spans"]
        dtype = getattr(torch, _SPOOL_TORCH_DTYPES[rows_at["dtype"]])
    except KeyError as err:
        raise ValueError(f"{path}: capture chunk without {err} in its header") from None
    begin, end = rows_at["data_offsets"]
    rows = torch.frombuffer(
        data, dtype=dtype, offset=base + begin, count=(end - begin) // dtype.itemsize
    )
    rows = rows.view(rows_at["shape"])
    if name == "planes":  # stream-major on disk: the same rows, as a view
        rows = rows.transpose(0, 1)
    begin, end = spans_at["data_offsets"]
    spans = np.frombuffer(data, dtype=np.int64, offset=base + begin, count=(end - begin) // 8)
    starts, lengths = spans.reshape(spans_at["shape"]).tolist()
    keys = meta["keys"].split("\n") if starts else []
    if len(keys) != len(starts) or sum(lengths) != rows.shape[0]:
        raise ValueError(
            f"{path}: {len(keys)} keys and {len(starts)} spans (summing to {sum(lengths)} rows) "
            f"do not describe its {rows.shape[0]} rows"
        )
    return CaptureChunk(int(meta["step"]), keys, starts, lengths, rows), size
