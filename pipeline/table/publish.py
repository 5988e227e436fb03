"""Publishing a version: the commit point and what follows it.

`publish_root` runs the fence and the age bound, then puts the root
create-only (the commit point); `after_publish` checks a late root's files,
puts back reused files a gc deleted meanwhile, fills the caches, moves
`_latest` and rewrites the card. `publish_copy` publishes a version with an
earlier version's content (a commit that lost its files, and `repair`).
Each takes the working state of one commit (commit.py's `_Commit`) as `c`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pipeline.storage import AlreadyExists
from pipeline.table import retention
from pipeline.table.errors import CommitConflict, DatasetError
from pipeline.table.layout import HISTORY_LENGTH, manifest_key
from pipeline.table.manifest import Manifest, Totals

if TYPE_CHECKING:
    from pipeline.table.manifest import DatasetLike

log = logging.getLogger(__name__)


class StaleCommit(DatasetError):
    """A commit names files older than the longest commit gc allows for (retention.py)."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def publish_root(c: Any, manifest: Manifest) -> None:
    """The fence and the age check, then the commit point: the root, create-only."""
    if c.req.fence is not None:
        c.req.fence()
    age = _age(c, c.ds.storage.clock) if c.oldest is not None else 0.0
    if age > retention.MAX_COMMIT_AGE_S:
        raise StaleCommit(
            f"{c.ds.uri}: a shard of this commit was written {age / 3600:.1f} h ago, "
            f"past the longest commit gc allows for ({retention.MAX_COMMIT_AGE_S / 3600:g} "
            "h): it may be deleted meanwhile; this commit published nothing (redo the unit)"
        )
    try:
        c.ds.storage.put_if_absent(manifest_key(manifest.version), manifest.root_json())
    except AlreadyExists:
        raise CommitConflict(
            f"{c.ds.uri}: version {manifest.version} was committed by another writer "
            f"(or is a fencing version, or one gc retired) while this commit was based on "
            f"version {c.req.parent_version}; this commit published nothing (re-read the "
            "latest version and commit again)"
        ) from None


def _age(c: Any, clock: Callable[[], float]) -> float:
    assert c.oldest is not None
    return clock() - c.oldest


def check_landed_in_time(c: Any, manifest: Manifest) -> None:
    """The root's own timestamp against the bound; a late root's files are checked after
    any gc that missed it has re-read the versions (module docstring, step 6)."""
    if c.oldest is None:
        return
    key = manifest_key(manifest.version)
    age = _age(c, lambda: c.ds.storage.info(key).mtime)
    if age <= retention.MAX_COMMIT_AGE_S:
        return
    log.warning(
        "version %d landed %.0f s after its oldest shard was written (bound %.0f s): "
        "checking its files once gc cannot still hold an old view",
        manifest.version,
        age,
        retention.MAX_COMMIT_AGE_S,
    )
    time.sleep(2 * retention.GC_REREAD_S)
    named = [*c.infos, *c.written]
    gone = [k for k in named if not _present(c.ds, k)]
    if not gone:
        return
    copy = publish_copy(
        c.ds,
        c.parent,
        manifest.version + 1,
        {"reverts": manifest.version, "reason": f"files deleted before it landed: {gone[:3]}"},
    )
    raise StaleCommit(
        f"{c.ds.uri}: version {manifest.version} landed {age / 3600:.1f} h after its "
        f"shards were written and gc deleted {len(gone)} of its files meanwhile (e.g. "
        f"{gone[0]}); version {copy.version} restores version {c.req.parent_version}: "
        "this commit's samples are not committed (redo the units)"
    )


def after_publish(c: Any, manifest: Manifest) -> None:
    """Reused files checked once more, caches, `_latest`, the dataset card."""
    from pipeline.table.card import write_card

    ds = c.ds
    check_landed_in_time(c, manifest)
    for key, data in c.reused.items():
        try:
            ds.storage.info(key)  # not exists(): it may answer from a listing cache
        except FileNotFoundError:  # a gc deleted it after reading the versions
            log.warning("put back %s, deleted while this commit reused it", key)
            put_once(ds, key, data, what=key)
    if c.parent_ranges is not None:
        ranges = c.parent_ranges.with_changes(c.new_entries, c.removed)
        ds.remember_key_ranges(manifest.version, ranges)
    ds.remember(manifest)
    log.info(
        "committed version=%d shards=%d rows=%d tokens=%d new_shards=%d dropped=%d uri=%s",
        manifest.version,
        len(manifest.entries),
        manifest.totals.rows,
        manifest.totals.tokens,
        len(c.new_entries),
        manifest.commit["dropped_samples"],
        ds.uri,
    )
    ds.advance_latest(manifest.version)
    try:
        write_card(ds, manifest)
    except Exception as err:  # the card is documentation; the version is committed
        log.warning("could not write the dataset card: %s", err)


def publish_copy(
    ds: DatasetLike, source: Manifest | None, version: int, record: Mapping[str, object]
) -> Manifest:
    """Publish `version` with the content of `source` (same shards, segments, lineage):
    what a commit that lost its files, and `repair`, put over a version that cannot stand.

    Create-only like every root; `record` says why (it becomes the root's `commit`)."""
    if source is None or source.lineage is None:
        raise DatasetError(
            f"{ds.uri}: version {version - 1} cannot be replaced: no earlier version to copy"
        )
    created = now()
    totals = source.totals or Totals()
    summary = {
        "version": version,
        "created_at": created,
        "shards": totals.shards,
        "rows": totals.rows,
        "tokens": totals.tokens,
        "added_shards": 0,
        "dropped_samples": 0,
        "removed_shards": 0,
    }
    manifest = replace(
        source,
        version=version,
        parent_version=source.version,
        created_at=created,
        commit={"copy_of": source.version, **record},
        history=tuple(source.history)[-(HISTORY_LENGTH - 1) :] + (summary,),
    )
    try:
        ds.storage.put_if_absent(manifest_key(version), manifest.root_json())
    except AlreadyExists:
        raise CommitConflict(f"{ds.uri}: version {version} exists already") from None
    log.warning("published version %d as a copy of version %d: %s", version, source.version, record)
    ds.remember(manifest)
    ds.advance_latest(version)
    return manifest


def _present(ds: DatasetLike, key: str) -> bool:
    try:
        ds.storage.info(key)  # not exists(): it may answer from a listing cache
        return True
    except FileNotFoundError:
        return False


def put_once(ds: DatasetLike, key: str, data: bytes, *, what: str) -> bool:
    """Create `key` with `data`; True if it was there already with these bytes (reused).

    Segment keys carry their content hash and sidecar keys their shard's
    name, so an existing file with other bytes is damage, not a retry."""
    try:
        ds.storage.put_if_absent(key, data)
        return False
    except AlreadyExists:
        if ds.storage.read_bytes(key) != data:
            raise DatasetError(
                f"{ds.storage.url(key)} exists with other contents than {what}"
            ) from None
        return True
