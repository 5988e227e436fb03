"""Reading raw rows from one corpus source: JSONL/JSON files, Parquet, or an HF dataset.

Paths are local or `s3://` (through the project's storage layer, so the same
endpoint settings apply), or `package:<module>/<file>`, a data file shipped
inside an installed Python package (a prompt set from the package registry);
a directory means every JSONL/JSON or Parquet file in it, in name order. A configured path that does not exist is `SourceNotFound`,
raised by `resolve` before any row is read.

No row and no damaged file stops the run. JSONL lines are decoded and parsed
one by one (jsonl.py): a line that fails is a `RawRow` with a reason code, its
line number and the byte offset of its first byte. A file that cannot be read
to its end (truncated or corrupt compression, a damaged Parquet footer, an I/O
error) yields the rows before the damage and then one file-level record saying
how far the reader got; the next file follows. Transient storage errors are not
data errors: they stop the run (`PipelineError`), so that a rerun reads the file
whole rather than a dataset silently missing it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.corpus.config import CorpusSourceConfig
from pipeline.corpus.jsonl import JSONL_SUFFIXES, read_json_object_file, read_jsonl_file
from pipeline.corpus.records import RawRow, ReadProgress

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet",)
_SUFFIXES = {"jsonl": JSONL_SUFFIXES, "json_object": JSONL_SUFFIXES, "parquet": PARQUET_SUFFIXES}
_PARQUET_BATCH_BYTES = 64 << 20  # decoded bytes per Parquet batch, so big rows come few at a time


class SourceNotFound(FileNotFoundError):
    """A configured corpus path that does not exist or holds no readable files."""


@dataclass(frozen=True)
class ResolvedSource:
    """A source with its format and files settled: reading it lists nothing again."""

    config: CorpusSourceConfig
    name: str
    format: str  # jsonl | json_object | parquet | hf
    storage: Any = None  # pipeline.storage.Storage of the files' folder (not for hf)
    keys: tuple[str, ...] = ()


def in_package(source: CorpusSourceConfig) -> CorpusSourceConfig:
    """A `package:<module>/<file>` path as the installed file's local path (others as given)."""
    if not source.path.startswith("package:"):
        return source
    module, _, rel = source.path.removeprefix("package:").partition("/")
    from importlib.util import find_spec

    # Located, never imported: a data package's own imports (and their dependencies,
    # which a data-only install leaves out) play no part in reading its files.
    spec = find_spec(module) if module.isidentifier() else None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    if not roots:
        raise SourceNotFound(f"{source.path}: package {module!r} is not installed")
    return source.model_copy(
        update={"path": str(Path(roots[0]) / rel), "name": source_name(source)}
    )


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

    source = in_package(source)
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


def _failure_reason(err: BaseException) -> str:
    if isinstance(err, EOFError):
        return "truncated_file"
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return "unreadable_file"
    return "corrupt_file"


def _guarded(
    where: str, rows: Iterator[RawRow], progress: ReadProgress, unit: str
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


# --------------------------------------------------------------------------- Parquet, HF


def _parquet_file(storage, key: str, progress: ReadProgress) -> Iterator[RawRow]:
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
    progress = ReadProgress()

    def rows() -> Iterator[RawRow]:
        for row in loaded:
            yield RawRow(f"{where}#{progress.rows}", dict(row))
            progress.rows += 1

    yield from _guarded(where, rows(), progress, "row")


def _read_files(resolved: ResolvedSource, max_row_bytes: int) -> Iterator[RawRow]:
    for key in resolved.keys:
        progress = ReadProgress()
        where = resolved.storage.url(key)
        if resolved.format == "jsonl":
            yield from _guarded(
                where,
                read_jsonl_file(resolved.storage, key, max_row_bytes, progress),
                progress,
                "line",
            )
        elif resolved.format == "json_object":
            yield from _guarded(
                where, read_json_object_file(resolved.storage, key, progress), progress, "row"
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
