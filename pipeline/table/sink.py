"""The write lifecycle of a dataset: every producer of shards commits through it.

Shaped like Ray Data's `Datasink` (on_write_start / write / on_write_complete /
on_write_failed), but committing through the dataset's manifest protocol
(dataset.py), which Ray Data's own Parquet sink lacks:

* `on_write_start()` reads the latest version and returns the units it holds;
  the caller plans against the version's sample ids (regenerate/driver/partition.py);
* `writer(unit_id)` opens a `ShardWriter` for one unit (in this process; a
  remote worker opens its own with the same dataset URI and provenance);
* `on_unit_written(info, planned)` queues a finished shard and publishes a version
  every `commit_every_units` shards or `commit_every_seconds`, retrying a
  version race on top of the new latest version. With the unit, the samples
  it was asked for and did not produce are recorded as attempted, and the rows
  it replaces (`replaced`: changed samples of a refresh) are dropped in the
  same commit, so a sample id is never listed twice nor missing in between;
* `on_write_complete()` publishes what is queued (and the `tombstones`, if no
  commit carried them yet), marks the version complete when every expected
  unit landed, and ends the write session; `on_write_failed(error)` publishes
  the shards that did finish and logs what failed, so a rerun redoes only the rest.

With a `WriteSession` every commit is fenced by its lease (lease.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from pipeline.logs import kv
from pipeline.shards.schema import Provenance
from pipeline.shards.writer import ShardInfo, ShardWriter
from pipeline.table.dataset import Dataset
from pipeline.table.errors import CommitConflict
from pipeline.table.manifest import Manifest

if TYPE_CHECKING:
    from pipeline.table.lease import WriteSession

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
        session: WriteSession | None = None,
        replaced: Mapping[str, str] | None = None,
        tombstones: Mapping[str, Iterable[str]] | None = None,
        new_lineage: bool = False,
        num_buckets: int | None = None,
    ) -> None:
        if commit_every_units <= 0 or commit_every_seconds <= 0:
            raise ValueError("commit_every_units and commit_every_seconds must be positive")
        self.dataset = dataset
        self.provenance = provenance
        self.commit_every_units = commit_every_units
        self.commit_every_seconds = commit_every_seconds
        self.max_commit_attempts = max_commit_attempts
        self.session = session
        self.replaced = dict(replaced or {})
        self.tombstones = {p: set(ids) for p, ids in (tombstones or {}).items() if ids}
        self.new_lineage = new_lineage
        self.num_buckets = num_buckets
        self.expected: set[str] | None = None  # unit ids this run planned, if the caller says
        self.pending: list[ShardInfo] = []
        self._drops: dict[str, set[str]] = {}
        self.version: int | None = None
        self.num_committed = 0  # shards published by this sink
        self.num_commits = 0
        self._closed = False
        self._last_commit = time.monotonic()

    def on_write_start(self) -> set[str]:
        """Unit ids the latest version already holds (for tools; planning uses sample ids)."""
        self.version = self.dataset.latest_version()
        self._last_commit = time.monotonic()
        return self.dataset.committed_units() if self.version is not None else set()

    def writer(self, unit_id: str) -> ShardWriter:
        """A writer for one unit's shard, in this process."""
        return self.dataset.writer(unit_id, self.provenance)

    def on_unit_written(self, info: ShardInfo, planned: Mapping[str, str] | None = None) -> None:
        """Queue a finished shard; publish when the batch is full or old enough.

        `planned`: sample id -> input hash of every sample the shard's unit was
        planned to hold (the ones without a row are recorded as attempted).
        """
        if planned is not None:
            rows = {s[0] for s in info.samples}
            attempted = tuple(sorted((sid, h) for sid, h in planned.items() if sid not in rows))
            info = replace(info, attempted=attempted)
            for sid in planned:
                if sid in self.replaced:
                    self._drops.setdefault(self.replaced[sid], set()).add(sid)
            if self.expected is not None:
                self.expected.discard(info.unit_id)
        self.pending.append(info)
        due = time.monotonic() - self._last_commit >= self.commit_every_seconds
        if len(self.pending) >= self.commit_every_units or due:
            # The batch that brings the last planned unit marks the version complete.
            self.flush(complete=self.expected is not None and not self.expected)

    def flush(self, *, complete: bool = False) -> Manifest | None:
        """Publish the queued shards (and drops) as the next version; None if nothing to publish."""
        drops = {p: set(ids) for p, ids in self._drops.items()}
        for path, ids in self.tombstones.items():
            drops.setdefault(path, set()).update(ids)
        if not self.pending and not drops and not self.new_lineage:
            return None
        for attempt in range(1, self.max_commit_attempts + 1):
            try:
                manifest = self.dataset.commit(
                    self.pending,
                    drop=drops,
                    provenance=self.provenance,
                    new_lineage=self.new_lineage,
                    num_buckets=self.num_buckets,
                    fence=self.session.check if self.session is not None else None,
                    complete=complete,
                    session=self.session.id if self.session is not None else None,
                )
                break
            except CommitConflict:
                if attempt == self.max_commit_attempts:
                    raise
                log.warning("commit raced another writer; retrying on the new latest version")
        self.version = manifest.version
        self.num_committed += len(self.pending)
        self.num_commits += 1
        log.info("committed %s", kv(version=manifest.version, new_shards=len(self.pending)))
        self.pending, self._drops, self.tombstones = [], {}, {}
        self.new_lineage = False
        self._last_commit = time.monotonic()
        return manifest

    def on_write_complete(self) -> int | None:
        """Publish what is queued, mark the version complete if nothing planned is missing; close."""
        if self._closed:
            return self.version
        try:
            self.flush(complete=not self.expected)
        finally:
            self._close()
        return self.version

    def on_write_failed(self, error: BaseException) -> int | None:
        """Keep what finished: publish the queued (complete, checked) shards, then report."""
        log.error("write failed %s", kv(error=type(error).__name__, queued=len(self.pending)))
        try:
            self.flush()
        except Exception as err:  # the original error is the one to raise
            log.error("could not commit the finished shards: %s", err)
        finally:
            self._close()
        return self.version

    def _close(self) -> None:
        self._closed = True
        if self.session is not None:
            self.session.close()
