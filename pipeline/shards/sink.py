"""The write lifecycle of a dataset: every producer of shards commits through it.

Shaped like Ray Data's `Datasink` (on_write_start / write / on_write_complete /
on_write_failed), but committing through the dataset's manifest protocol
(manifest.py), which Ray Data's own Parquet sink lacks:

* `on_write_start()` reads the latest version and returns the units it holds
  (resume is a listing: the caller skips them);
* `writer(unit_id)` opens a `ShardWriter` for one unit (in this process; a
  remote worker opens its own with the same dataset URI and provenance);
* `on_unit_written(info)` queues a finished shard and publishes a version
  every `commit_every_units` shards or `commit_every_seconds`, retrying a
  version race on top of the new latest version;
* `on_write_complete()` publishes what is queued; `on_write_failed(error)`
  publishes the shards that did finish (they are complete and checked) and
  logs what failed, so a rerun redoes only the rest.
"""

from __future__ import annotations

import logging
import time

from pipeline.logs import kv
from pipeline.shards.manifest import CommitConflict, Dataset, Manifest
from pipeline.shards.schema import Provenance
from pipeline.shards.writer import ShardInfo, ShardWriter

log = logging.getLogger(__name__)


class DatasetSink:
    """Batched, exactly-once commits of finished shards into one dataset."""

    def __init__(
        self,
        dataset: Dataset,
        provenance: Provenance,
        *,
        commit_every_units: int = 16,
        commit_every_seconds: float = 300.0,
        max_commit_attempts: int = 5,
    ) -> None:
        if commit_every_units <= 0 or commit_every_seconds <= 0:
            raise ValueError("commit_every_units and commit_every_seconds must be positive")
        self.dataset = dataset
        self.provenance = provenance
        self.commit_every_units = commit_every_units
        self.commit_every_seconds = commit_every_seconds
        self.max_commit_attempts = max_commit_attempts
        self.pending: list[ShardInfo] = []
        self.version: int | None = None
        self.num_committed = 0  # shards published by this sink
        self._last_commit = time.monotonic()

    def on_write_start(self) -> set[str]:
        """Unit ids the latest version already holds (the caller skips them)."""
        self.version = self.dataset.latest_version()
        self._last_commit = time.monotonic()
        return self.dataset.committed_units() if self.version is not None else set()

    def writer(self, unit_id: str) -> ShardWriter:
        """A writer for one unit's shard, in this process."""
        return self.dataset.writer(unit_id, self.provenance)

    def on_unit_written(self, info: ShardInfo) -> None:
        """Queue a finished shard; publish when the batch is full or old enough."""
        self.pending.append(info)
        due = time.monotonic() - self._last_commit >= self.commit_every_seconds
        if len(self.pending) >= self.commit_every_units or due:
            self.flush()

    def flush(self) -> Manifest | None:
        """Publish the queued shards as the next version (None when nothing is queued)."""
        if not self.pending:
            return None
        for attempt in range(1, self.max_commit_attempts + 1):
            try:
                manifest = self.dataset.commit(self.pending, provenance=self.provenance)
                break
            except CommitConflict:
                if attempt == self.max_commit_attempts:
                    raise
                log.warning("commit raced another writer; retrying on the new latest version")
        self.version = manifest.version
        self.num_committed += len(self.pending)
        log.info("committed %s", kv(version=manifest.version, new_shards=len(self.pending)))
        self.pending, self._last_commit = [], time.monotonic()
        return manifest

    def on_write_complete(self) -> int | None:
        """Publish what is queued; the version the dataset is at."""
        self.flush()
        return self.version

    def on_write_failed(self, error: BaseException) -> int | None:
        """Keep what finished: publish the queued (complete, checked) shards, then report."""
        log.error("write failed %s", kv(error=type(error).__name__, queued=len(self.pending)))
        try:
            self.flush()
        except Exception as err:  # the original error is the one to raise
            log.error("could not commit the finished shards: %s", err)
        return self.version
