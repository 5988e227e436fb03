"""Reading raw rows from one corpus source: JSONL (plain, .gz, .zst), JSON arrays, Parquet, HF.

Paths are local or `s3://` (through the project's storage layer, so the same
endpoint settings apply); a directory means every JSONL/JSON or Parquet file
in it, in name order. A configured path that does not exist is `SourceNotFound`,
raised by `resolve` before any row is read.

No row and no damaged file stops the run. JSONL is read as bytes, one line at a
time and never more than `max_row_bytes` of it in memory; a UTF-8 byte-order
mark and CRLF line ends are accepted; each line is decoded and parsed on its own,
and a line that fails is a `RawRow` with a reason code, its line number and the
byte offset of its first byte (in the decompressed stream for .gz/.zst). A file
that cannot be read to its end (truncated or corrupt compression, a damaged
Parquet footer, an I/O error) yields the rows before the damage and then one
file-level record saying how far the reader got; the next file follows.
Transient storage errors are not data errors: they stop the run (`PipelineError`)
so that a rerun reads the file whole rather than a dataset silently missing it.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.corpus.config import CorpusSourceConfig

log = logging.getLogger(__name__)

JSON_ARRAY_SUFFIXES = (".json", ".json.gz", ".json.zst")  # a JSON array, or JSONL
JSONL_SUFFIXES = (".jsonl", ".jsonl.zst", ".jsonl.gz", *JSON_ARRAY_SUFFIXES)
PARQUET_SUFFIXES = (".parquet",)
_SUFFIXES = {"jsonl": JSONL_SUFFIXES, "parquet": PARQUET_SUFFIXES}
_BOM = b"\xef\xbb\xbf"
_PARQUET_BATCH_BYTES = 64 << 20  # decoded bytes per Parquet batch, so big rows come few at a time


class SourceNotFound(FileNotFoundError):
    """A configured corpus path that does not exist or holds no readable files."""


@dataclass(frozen=True)
class RawRow:
    location: str  # "path:line" (JSONL) or "path#row" (Parquet, HF, JSON arrays)
    row: dict[str, Any] | None  # None when the row (or the file) could not be read
    reason: str | None = None  # the error code when `row` is None
    detail: str | None = None
    byte_offset: int | None = None  # first byte of the line (JSONL)
    size: int | None = None  # bytes of the raw line, when the reader measured it


@dataclass(frozen=True)
class ResolvedSource:
    """A source with its format and files settled: reading it lists nothing again."""

    config: CorpusSourceConfig
    name: str
    format: str  # jsonl | parquet | hf
    storage: Any = None  # pipeline.storage.Storage of the files' folder (not for hf)
    keys: tuple[str, ...] = ()


def source_name(source: CorpusSourceConfig) -> str:
    return source.name or source.path.rstrip("/").rsplit("/", 1)[-1]


def _is_hf_dir(path: Path) -> bool:
    return (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists()


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def detect_format(source: CorpusSourceConfig) -> str:
    """The configured format, or one inferred from the path (or the files under it)."""
    if source.format != "auto":
        return source.format
    path = source.path.rstrip("/")
    if path.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if path.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if _is_local(path):
        local = Path(path.removeprefix("file://"))
        if not local.exists():
            if path.count("/") == 1 and not path.startswith((".", "/")):
                return "hf"  # looks like a hub name: org/dataset
            raise SourceNotFound(f"{path}: no such file or directory")
        if local.is_dir() and _is_hf_dir(local):
            return "hf"
        if local.is_file():
            raise ValueError(f"{path}: cannot tell the format from the name; set `format`")
    from pipeline.storage import open_storage

    names = [o.key for o in open_storage(path, endpoint_url=source.endpoint_url).list("")]
    if any(n.endswith(PARQUET_SUFFIXES) for n in names):
        return "parquet"
    if any(n.endswith(JSONL_SUFFIXES) for n in names):
        return "jsonl"
    raise SourceNotFound(f"{path}: no .jsonl, .json or .parquet files found (or set `format`)")


def resolve(source: CorpusSourceConfig) -> ResolvedSource:
    """Settle the format and list the files; `SourceNotFound` if there is nothing to read."""
    from pipeline.storage import open_storage

    fmt = detect_format(source)
    name = source_name(source)
    if fmt == "hf":
        return ResolvedSource(source, name, fmt)
    path = source.path.rstrip("/")
    suffixes = _SUFFIXES[fmt]
    parent, _, leaf = path.rpartition("/")
    if _is_local(path):
        local = Path(path.removeprefix("file://"))
        if local.is_file():
            return ResolvedSource(source, name, fmt, open_storage(local.parent), (local.name,))
        if not local.is_dir():
            raise SourceNotFound(f"{path}: no such file or directory")
    elif path.endswith(suffixes) or source.format != "auto":
        storage = open_storage(parent, endpoint_url=source.endpoint_url)
        if storage.exists(leaf):
            return ResolvedSource(source, name, fmt, storage, (leaf,))
        if path.endswith(suffixes):
            raise SourceNotFound(f"{path}: no such object")
    storage = open_storage(path, endpoint_url=source.endpoint_url)
    listed = [o.key for o in storage.list("")]
    keys = tuple(sorted(k for k in listed if k.endswith(suffixes)))
    if not keys:
        raise SourceNotFound(f"{path}: no {'/'.join(suffixes)} files found")
    other = [k for k in listed if k.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES) and k not in keys]
    if other:
        log.warning(
            "corpus source %s is read as %s; %d other file(s) ignored, e.g. %s",
            path,
            fmt,
            len(other),
            other[0],
        )
    return ResolvedSource(source, name, fmt, storage, keys)


# --------------------------------------------------------------------------- file guard


@dataclass
class _Progress:
    """How far the reader of one file got, for the record of a file it cannot finish."""

    rows: int = 0  # lines (JSONL) or rows (Parquet) read
    offset: int = 0  # bytes read (decompressed, for .gz/.zst)


def _failure_reason(err: BaseException) -> str:
    if isinstance(err, EOFError):
        return "truncated_file"
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return "unreadable_file"
    return "corrupt_file"


def _guarded(
    where: str, rows: Iterator[RawRow], progress: _Progress, unit: str
) -> Iterator[RawRow]:
    """The rows of one file; an exception while reading it becomes one file-level record."""
    from pipeline.errors import PipelineError
    from pipeline.storage import is_transient

    try:
        yield from rows
    except Exception as err:
        if is_transient(err):
            raise PipelineError(
                f"corpus file {where}: transient storage error after {unit} {progress.rows} "
                f"({type(err).__name__}: {err}); rerun to read it whole"
            ) from err
        reason = _failure_reason(err)
        location = f"{where}:{progress.rows + 1}" if unit == "line" else f"{where}#{progress.rows}"
        log.debug("corpus file %s failed", where, exc_info=True)
        yield RawRow(
            location,
            None,
            reason,
            f"{reason.replace('_', ' ')} after {unit} {progress.rows} "
            f"(byte offset {progress.offset}): {type(err).__name__}: {err}",
            byte_offset=progress.offset,
        )


# --------------------------------------------------------------------------- JSONL


class _ZstdReader(io.RawIOBase):
    """zstd frames one after another; input that ends inside a frame raises EOFError.

    zstandard's `stream_reader` returns what it has and stops silently when a file
    is cut short, so a truncated .zst would read as a shorter, valid corpus.
    """

    def __init__(self, raw) -> None:
        import zstandard

        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = self._dctx.decompressobj()
        self._in_frame = False
        self._out = bytearray()
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._out and not self._eof:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                self._eof = True
                if self._in_frame:
                    raise EOFError("zstd stream ended inside a frame (truncated file)")
                break
            while chunk:
                self._out += self._frame.decompress(chunk)
                self._in_frame = True
                if self._frame.eof:  # next frame, if the rest of the chunk holds one
                    chunk = self._frame.unused_data
                    self._frame = self._dctx.decompressobj()
                    self._in_frame = False
                else:
                    chunk = b""
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        del self._out[:n]
        return n


def _decompressed(raw, key: str):
    """A binary stream with `readline(limit)` over the file's (decompressed) bytes."""
    if key.endswith(".zst"):
        return io.BufferedReader(_ZstdReader(raw), buffer_size=1 << 20)
    if key.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw, 1 << 20)


def _parse_line(body: bytes, column0: int) -> tuple[dict | None, str | None, str | None]:
    """(row, reason, detail) of one line's bytes (no line end, no BOM)."""
    nul = body.find(b"\x00")
    if nul >= 0:
        return (
            None,
            "nul_byte",
            f"NUL byte at column {nul + column0} (a zero-filled or binary line)",
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        return (
            None,
            "invalid_utf8",
            (
                f"byte 0x{body[err.start]:02x} at column {err.start + column0} is not UTF-8 ({err.reason})"
            ),
        )
    try:
        row = json.loads(text)
    except RecursionError:
        return None, "too_deeply_nested", "JSON nested deeper than the parser allows"
    except ValueError as err:  # JSONDecodeError, or an integer literal too long to convert
        return None, "invalid_json", f"invalid JSON: {err}"
    if not isinstance(row, dict):
        return None, "not_an_object", f"a JSON {type(row).__name__}, not an object"
    return row, None, None


def _json_array(where: str, data: bytes) -> Iterator[RawRow]:
    """A whole-file JSON array (Alpaca style): one row per element, located `path#index`."""
    try:
        rows = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        yield RawRow(
            f"{where}:1", None, "invalid_utf8", f"byte offset {err.start} is not UTF-8", err.start
        )
        return
    except RecursionError:
        yield RawRow(
            f"{where}:1", None, "too_deeply_nested", "the JSON array is nested too deeply", 0
        )
        return
    except ValueError as err:
        yield RawRow(f"{where}:1", None, "invalid_json", f"the JSON array does not parse: {err}", 0)
        return
    for index, row in enumerate(rows):
        if isinstance(row, dict):
            yield RawRow(f"{where}#{index}", row)
        else:
            yield RawRow(
                f"{where}#{index}",
                None,
                "not_an_object",
                f"a JSON {type(row).__name__}, not an object",
            )


def _jsonl_file(storage, key: str, max_row_bytes: int, progress: _Progress) -> Iterator[RawRow]:
    where = storage.url(key)
    limit = max_row_bytes + 2  # room for the CRLF of a line that is exactly at the limit
    num_rows = 0
    with storage.open_read(key) as raw:
        stream = _decompressed(raw, key)
        while True:
            start = progress.offset
            line = stream.readline(limit)
            if not line:
                break
            progress.rows += 1
            progress.offset += len(line)
            location = f"{where}:{progress.rows}"
            complete = line.endswith(b"\n")
            if not complete and len(line) == limit:  # over the limit: skip to the line end
                while line and not line.endswith(b"\n"):
                    line = stream.readline(1 << 20)
                    progress.offset += len(line)
                size = progress.offset - start
                yield RawRow(
                    location, None, "row_too_large",
                    f"the line is {size} bytes, over max_row_bytes {max_row_bytes}", start, size,
                )  # fmt: skip
                num_rows += 1
                continue
            body = line[:-1] if complete else line
            if body.endswith(b"\r"):
                body = body[:-1]
            column0 = 0
            if body.startswith(_BOM):  # the file's start, or a file concatenated onto another
                body, column0 = body[3:], 3
            if (
                progress.rows == 1
                and body.startswith((b"\xff\xfe", b"\xfe\xff"))
                and b"\x00" in body
            ):
                yield RawRow(
                    f"{where}:1", None, "unsupported_encoding",
                    "the file is UTF-16 (byte-order mark 0xff 0xfe / 0xfe 0xff); convert it to UTF-8", 0,
                )  # fmt: skip
                return
            if not body.strip():
                continue
            if (
                num_rows == 0
                and key.endswith(JSON_ARRAY_SUFFIXES)
                and body.lstrip().startswith(b"[")
            ):
                yield from _json_array(where, body + b"\n" + stream.read())
                return
            num_rows += 1
            if len(body) > max_row_bytes:
                yield RawRow(
                    location, None, "row_too_large",
                    f"the line is {len(body)} bytes, over max_row_bytes {max_row_bytes}", start, len(body),
                )  # fmt: skip
                continue
            row, reason, detail = _parse_line(body, column0)
            if reason == "invalid_json" and not complete:
                detail += " (the last line has no line end: is the file cut short?)"
            yield RawRow(location, row, reason, detail, start, len(body))
    if num_rows == 0:
        yield RawRow(f"{where}:1", None, "empty_file", "the file holds no rows", 0)


# --------------------------------------------------------------------------- Parquet, HF


def _parquet_file(storage, key: str, progress: _Progress) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    where = storage.url(key)
    with storage.open_read(key) as raw:
        parquet = pq.ParquetFile(raw)
        meta = parquet.metadata
        decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        per_row = decoded // max(meta.num_rows, 1)
        batch_size = max(1, min(1024, _PARQUET_BATCH_BYTES // max(per_row, 1)))
        for batch in parquet.iter_batches(batch_size=batch_size):
            for row in batch.to_pylist():
                yield RawRow(f"{where}#{progress.rows}", row)
                progress.rows += 1
    if progress.rows == 0:
        yield RawRow(f"{where}#0", None, "empty_file", "the file holds no rows")


def _read_hf(source: CorpusSourceConfig) -> Iterator[RawRow]:
    import datasets

    local = Path(source.path)
    if _is_local(source.path) and local.is_dir() and _is_hf_dir(local):
        loaded = datasets.load_from_disk(str(local))
        if isinstance(loaded, datasets.DatasetDict):
            if source.split not in loaded:
                raise ValueError(
                    f"corpus source {source.path}: no split {source.split!r} (has {list(loaded)})"
                )
            loaded = loaded[source.split]
    else:
        # A hub name on a cluster (or a local script/data directory).
        loaded = datasets.load_dataset(source.path, source.name, split=source.split)
    where = f"{source.path}[{source.split}]"
    progress = _Progress()

    def rows() -> Iterator[RawRow]:
        for row in loaded:
            yield RawRow(f"{where}#{progress.rows}", dict(row))
            progress.rows += 1

    yield from _guarded(where, rows(), progress, "row")


def _read_files(resolved: ResolvedSource, max_row_bytes: int) -> Iterator[RawRow]:
    for key in resolved.keys:
        progress = _Progress()
        where = resolved.storage.url(key)
        if resolved.format == "jsonl":
            yield from _guarded(
                where, _jsonl_file(resolved.storage, key, max_row_bytes, progress), progress, "line"
            )
        else:
            yield from _guarded(
                where, _parquet_file(resolved.storage, key, progress), progress, "row"
            )


def read_rows(
    source: CorpusSourceConfig | ResolvedSource, *, max_row_bytes: int = 16 << 20
) -> Iterator[RawRow]:
    """Every raw row of the source, in a deterministic order (error records included)."""
    resolved = source if isinstance(source, ResolvedSource) else resolve(source)
    rows = (
        _read_hf(resolved.config)
        if resolved.format == "hf"
        else _read_files(resolved, max_row_bytes)
    )
    limit = resolved.config.max_rows
    for count, raw in enumerate(rows):
        if limit is not None and count >= limit:
            return
        yield raw
