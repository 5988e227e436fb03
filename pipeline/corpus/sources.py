"""Reading raw rows from one corpus source: JSONL, Parquet or a Hugging Face dataset.

Paths are local or `s3://` (through the project's storage layer, so the same
endpoint settings apply); a directory means every `.jsonl`/`.json` or
`.parquet` file in it, in name order. A line that is not JSON becomes an error
record; the rest of the file is still read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.corpus.config import CorpusSourceConfig

JSONL_SUFFIXES = (".jsonl", ".json", ".jsonl.zst", ".jsonl.gz")
PARQUET_SUFFIXES = (".parquet",)


@dataclass(frozen=True)
class RawRow:
    location: str  # "path:line" or "path#row"
    row: dict[str, Any] | None  # None when the row could not be parsed
    error: str | None = None  # why it could not be parsed


def source_name(source: CorpusSourceConfig) -> str:
    return source.name or source.path.rstrip("/").rsplit("/", 1)[-1]


def _is_hf_dir(path: Path) -> bool:
    return (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists()


def detect_format(source: CorpusSourceConfig) -> str:
    """The configured format, or one inferred from the path (or the files under it)."""
    if source.format != "auto":
        return source.format
    path = source.path.rstrip("/")
    if path.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if path.endswith(JSONL_SUFFIXES):
        return "jsonl"
    local = Path(path)
    if "://" not in path and not local.exists():
        if path.count("/") == 1:
            return "hf"  # looks like a hub name: org/dataset
        raise FileNotFoundError(f"corpus source {path}: no such file or directory")
    if "://" not in path and _is_hf_dir(local):
        return "hf"
    from pipeline.storage import open_storage

    names = [o.key for o in open_storage(path, endpoint_url=source.endpoint_url).list("")]
    if any(n.endswith(PARQUET_SUFFIXES) for n in names):
        return "parquet"
    if any(n.endswith(JSONL_SUFFIXES) for n in names):
        return "jsonl"
    raise ValueError(f"corpus source {path}: no .jsonl or .parquet files found; set `format`")


def _files(source: CorpusSourceConfig, suffixes: tuple[str, ...]):
    """(storage, keys) for a file or every matching file of a directory."""
    from pipeline.storage import open_storage

    path = source.path.rstrip("/")
    if path.endswith(suffixes):
        root, _, name = path.rpartition("/")
        return open_storage(root or ".", endpoint_url=source.endpoint_url), [name]
    storage = open_storage(path, endpoint_url=source.endpoint_url)
    keys = sorted(o.key for o in storage.list("") if o.key.endswith(suffixes))
    if not keys:
        raise FileNotFoundError(f"corpus source {path}: no {'/'.join(suffixes)} files found")
    return storage, keys


def _read_jsonl(source: CorpusSourceConfig) -> Iterator[RawRow]:
    storage, keys = _files(source, JSONL_SUFFIXES)
    for key in keys:
        where = storage.url(key)
        with storage.open_read(key) as raw:
            stream = _decompressed(raw, key)
            for number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    yield RawRow(f"{where}:{number}", None, f"invalid JSON: {err}")
                    continue
                if not isinstance(row, dict):
                    yield RawRow(
                        f"{where}:{number}", None, f"a JSON {type(row).__name__}, not an object"
                    )
                    continue
                yield RawRow(f"{where}:{number}", row)


def _decompressed(raw, key: str):
    if key.endswith(".zst"):
        import io

        import zstandard

        return io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), encoding="utf-8")
    if key.endswith(".gz"):
        import gzip
        import io

        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8")
    return (
        line.decode("utf-8", errors="strict") if isinstance(line, bytes) else line for line in raw
    )


def _read_parquet(source: CorpusSourceConfig) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    storage, keys = _files(source, PARQUET_SUFFIXES)
    for key in keys:
        where = storage.url(key)
        with storage.open_read(key) as raw:
            parquet = pq.ParquetFile(raw)
            index = 0
            for batch in parquet.iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    yield RawRow(f"{where}#{index}", row)
                    index += 1


def _read_hf(source: CorpusSourceConfig) -> Iterator[RawRow]:
    import datasets

    local = Path(source.path)
    if "://" not in source.path and local.is_dir() and _is_hf_dir(local):
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
    for index, row in enumerate(loaded):
        yield RawRow(f"{source.path}[{source.split}]#{index}", dict(row))


_READERS = {"jsonl": _read_jsonl, "parquet": _read_parquet, "hf": _read_hf}


def read_rows(source: CorpusSourceConfig) -> Iterator[RawRow]:
    """Every raw row of the source, in a deterministic order."""
    reader = _READERS[detect_format(source)]
    for count, raw in enumerate(reader(source)):
        if source.max_rows is not None and count >= source.max_rows:
            return
        yield raw
