"""Stream committed samples as torch tensors, in manifest order, with prefetch.

The reader resolves one dataset version through its manifest and opens exactly
the files it names (never a glob). Per shard it first reads the small columns
(ids, domains) to pick the rows it needs, then reads and decodes only the row
groups holding them. A background thread reads and decodes ahead into a
bounded queue, so storage latency and zstd decoding overlap with training.
Shards are split across `rank`/`world_size` for data-parallel training.

The files are plain Parquet: `parquet_files()` lists them for HF datasets, pyarrow
or DuckDB (skip the rows a version tombstoned: `ShardEntry.dropped`). Options:

* `version=N` pins a version: its files never change (written create-only),
  so the reader sees the same bytes after N+1 is published; `pin="name"`
  also records a pin so `gc` keeps N's files.
* `verify=True` re-hashes every shard against the manifest's sha256 before
  reading it (one more sequential read of the file).
* `follow=True` starts on the given (default: the newest) version, waiting
  for the first one if none is committed yet, and when it has read those
  shards picks up the shards of every newer version of the lineage as they
  land, until no writer holds the dataset's lease (the regeneration ended) or
  `follow_timeout_s` passes without a new version. So training can start
  while regeneration still runs. Shards go to ranks by a hash of their path.
  A follower never takes back a row it has yielded: rows a later version
  tombstones (a refresh's changed samples) may appear in both forms.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.prefetch import prefetched
from pipeline.shards.reader import TrainingSample, damaged, decode_rows, read_row_group
from pipeline.shards.schema import ShardMeta, read_shard_meta
from pipeline.storage import check_key, is_transient
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.manifest import Manifest, ShardEntry

_KEY_COLUMNS = ["sample_id", "domain"]
_HASH_CHUNK = 8 << 20

log = logging.getLogger(__name__)


def open_shard(dataset: Dataset, entry: ShardEntry) -> tuple[pq.ParquetFile, ShardMeta]:
    """Open a committed shard and validate its size, schema and metadata against the manifest."""
    url = dataset.shard_url(entry)
    try:
        size = dataset.storage.info(entry.path).size
    except FileNotFoundError:
        raise DatasetError(f"{url}: named by the manifest but missing") from None
    if size != entry.bytes:
        raise DatasetError(
            f"{url}: {size} bytes, the manifest says {entry.bytes} (truncated or replaced)"
        )
    try:
        # Page CRCs (written by ShardWriter) are checked on every read: a flipped bit in
        # a page is an error here, never a silently different tensor.
        pf = pq.ParquetFile(dataset.storage.open_read(entry.path), page_checksum_verification=True)
        meta = read_shard_meta(pf.schema_arrow, url)
    except DatasetError:
        raise
    except (OSError, pa.ArrowException, ValueError) as err:
        if is_transient(err):
            raise
        raise DatasetError(damaged(url, err)) from None
    if meta.provenance.identity_key() != entry.identity:
        raise DatasetError(f"{url}: provenance differs from what the manifest recorded")
    if pf.metadata.num_rows != entry.rows:
        raise DatasetError(f"{url}: {pf.metadata.num_rows} rows, the manifest says {entry.rows}")
    return pf, meta


class ShardReader:
    """Iterate one version of a dataset (or follow its new versions); see the module docstring.

    `domains` keeps only rows of those domains; `rank`/`world_size` keep every
    world_size-th shard starting at rank; `prefetch` is how many decoded
    samples the background thread may hold ahead (0: read in the caller's thread).
    """

    def __init__(
        self,
        dataset: Dataset | str | Path,
        *,
        version: int | None = None,
        domains: Iterable[str] | None = None,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 4,
        endpoint_url: str | None = None,
        verify: bool = False,
        follow: bool = False,
        poll_s: float = 5.0,
        follow_timeout_s: float | None = None,
        pin: str | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be positive, got {poll_s}")
        if not isinstance(dataset, Dataset):
            dataset = Dataset.open(dataset, endpoint_url=endpoint_url)
        self.dataset = dataset
        self.verify = verify
        self.follow = follow
        self.poll_s = poll_s
        self.follow_timeout_s = follow_timeout_s
        self.rank, self.world_size = rank, world_size
        if follow and version is None:
            version = self._wait_for_first_version()
        self.manifest: Manifest = dataset.manifest(version)
        if pin is not None:
            dataset.pin(self.manifest.version, pin)
        self.domains = frozenset(domains) if domains is not None else None
        if follow:
            self.shards = tuple(e for e in self.manifest.shards if self._mine(e))
        else:
            self.shards = self.manifest.shards[rank::world_size]
        self.prefetch = prefetch
        self._index: dict[str, tuple[ShardEntry, int]] | None = None

    def _mine(self, entry: ShardEntry) -> bool:
        """Follow mode: a stable rank for every shard, old or new (a hash of its path)."""
        digest = hashlib.sha256(entry.path.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.world_size == self.rank

    def _wait_for_first_version(self) -> int:
        return wait_for_first_version(self.dataset, self.poll_s, self.follow_timeout_s)

    @property
    def version(self) -> int:
        return self.manifest.version

    def parquet_files(self) -> list[str]:
        """URLs of this version's shards (all ranks), for datasets/pyarrow/DuckDB."""
        return [self.dataset.shard_url(e) for e in self.manifest.shards]

    def dropped_ids(self) -> frozenset[str]:
        """Sample ids this version tombstones that are still rows of its files: what a
        reader of `parquet_files()` (datasets, pyarrow, DuckDB) must filter out."""
        return frozenset(sid for e in self.manifest.shards for sid in e.dropped)

    def arrow_files(self) -> tuple[Any, list[str]]:
        """(pyarrow filesystem, paths) of this version's shards, for `pq.ParquetDataset`.

        Each path is checked to stay under the dataset root (manifest paths are data)."""
        filesystem, base = self.dataset.storage.arrow_filesystem()
        return filesystem, [f"{base}/{check_key(e.path)}" for e in self.manifest.shards]

    def __len__(self) -> int:
        """Live rows in this rank's shards (before the domain filter)."""
        return sum(e.live_rows for e in self.shards)

    def __iter__(self) -> Iterator[TrainingSample]:
        if self.prefetch == 0:
            yield from self._produce()
            return
        yield from prefetched(self._produce(), self.prefetch, name="shard-prefetch")

    def _produce(self) -> Iterator[TrainingSample]:
        if not self.follow:
            for entry in self.shards:
                yield from self._read_shard(entry)
            return
        seen: set[str] = set()
        manifest = self.manifest
        while True:
            for entry in manifest.shards:
                if entry.path not in seen and self._mine(entry):
                    seen.add(entry.path)
                    yield from self._read_shard(entry)
            nxt = self._next_version(manifest)
            if nxt is None:
                return
            manifest = self.manifest = nxt

    def _next_version(self, current: Manifest) -> Manifest | None:
        return next_version(self.dataset, current, self.poll_s, self.follow_timeout_s)

    def _verify_bytes(self, entry: ShardEntry) -> None:
        digest, size = hashlib.sha256(), 0
        with self.dataset.storage.open_read(entry.path) as fh:
            while chunk := fh.read(_HASH_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        if digest.hexdigest() != entry.sha256 or size != entry.bytes:
            raise DatasetError(
                f"{self.dataset.shard_url(entry)}: sha256 {digest.hexdigest()[:16]}... "
                f"({size} bytes) does not match the manifest's {entry.sha256[:16]}... "
                f"({entry.bytes} bytes): the file is corrupt"
            )

    def _read_shard(
        self, entry: ShardEntry, sample_id: str | None = None
    ) -> Iterator[TrainingSample]:
        if self.verify:
            self._verify_bytes(entry)
        pf, _ = open_shard(self.dataset, entry)
        url = self.dataset.shard_url(entry)
        dropped = frozenset(entry.dropped)
        with pf:
            for group in range(pf.metadata.num_row_groups):
                keys = read_row_group(pf, group, url, _KEY_COLUMNS)
                keep = [
                    i
                    for i, (sid, dom) in enumerate(
                        zip(
                            keys.column("sample_id").to_pylist(),
                            keys.column("domain").to_pylist(),
                            strict=True,
                        )
                    )
                    if (self.domains is None or dom in self.domains)
                    and (sample_id is None or sid == sample_id)
                    and sid not in dropped
                ]
                if not keep:
                    continue
                table = read_row_group(pf, group, url)
                if len(keep) < table.num_rows:
                    table = table.take(keep)
                yield from decode_rows(table, url)

    def get(self, sample_id: str) -> TrainingSample:
        """The sample with this id (any rank's shard); KeyError if the version lacks it."""
        if self._index is None:
            index: dict[str, tuple[ShardEntry, int]] = {}
            for entry in self.manifest.shards:
                pf, _ = open_shard(self.dataset, entry)
                with pf:
                    ids = pf.read(columns=["sample_id"]).column("sample_id").to_pylist()
                dropped = frozenset(entry.dropped)
                for row, sid in enumerate(ids):
                    if sid not in dropped:
                        index[sid] = (entry, row)
            self._index = index
        try:
            entry, _ = self._index[sample_id]
        except KeyError:
            raise KeyError(
                f"{self.dataset.uri} version {self.version} has no sample {sample_id!r}"
            ) from None
        domains, self.domains = self.domains, None
        try:
            return next(self._read_shard(entry, sample_id=sample_id))
        finally:
            self.domains = domains


def _writer_running(dataset: Dataset) -> bool:
    from pipeline.table.lease import lease_holder

    return lease_holder(dataset) is not None


def wait_for_first_version(dataset: Dataset, poll_s: float, timeout_s: float | None) -> int:
    """The newest committed version, waiting while a writer holds the lease and none is."""
    started = time.monotonic()
    while True:
        latest = dataset.latest_version()
        if latest is not None:
            return latest
        timed_out = timeout_s is not None and time.monotonic() - started > timeout_s
        if timed_out or not _writer_running(dataset):
            raise DatasetError(f"{dataset.uri}: no committed version, and no writer is running")
        time.sleep(poll_s)


def _next_kept(dataset: Dataset, after: int, latest: int) -> Manifest:
    """The first version after `after` that still stands: not retired by gc, and not
    replaced by a copy of its parent (a commit that landed late without its files)."""
    for v in range(after + 1, latest):
        if _replaced(dataset, v):
            log.warning("a follower skips version %d: version %d replaces it", v, v + 1)
            continue
        try:
            return dataset.manifest(v)
        except DatasetError as err:
            log.warning("a follower skips version %d: %s", v, err)
    return dataset.manifest(latest)


def _replaced(dataset: Dataset, version: int) -> bool:
    try:
        return dataset.manifest(version + 1).commit.get("reverts") == version
    except DatasetError:
        return False


def next_version(
    dataset: Dataset, current: Manifest, poll_s: float, timeout_s: float | None
) -> Manifest | None:
    """The version after `current` in its lineage, waiting while a writer holds the lease;
    None when no more will come (no writer, `timeout_s` idle, or a new lineage).

    Every version in turn, never a jump to the newest: a follower's order is then
    a function of the commit history alone, the same live and on a replay."""
    idle = time.monotonic()
    while True:
        latest = dataset.latest_version()
        if latest is not None and latest > current.version:
            nxt = _next_kept(dataset, current.version, latest)
            if nxt.lineage is not None and current.lineage is not None:
                if nxt.lineage.id != current.lineage.id:
                    log.warning(
                        "version %d starts a new lineage (%s): a follower of lineage %s stops",
                        nxt.version,
                        nxt.lineage.id,
                        current.lineage.id,
                    )
                    return None
            return nxt
        if not _writer_running(dataset):
            return None  # nobody is writing: nothing more will come
        if timeout_s is not None and time.monotonic() - idle > timeout_s:
            return None
        time.sleep(poll_s)
