"""One commit: sample-level checks, sidecars, a delta segment, merges, the root put.

`commit()` is `Dataset.commit`'s body (manifest.py has the protocol). In order:

1. **Lineage**: the parent's lineage continues unless `new_lineage`; every new
   shard's provenance (target, revision, template, layers, codec, generation)
   must have the lineage's key, else `LineageMismatch` names the fields.
2. **Files**: each new shard exists with the size its writer recorded (the
   name was written create-only, so those are the bytes the writer hashed).
3. **Exactly once, per sample**: the new shards' members (from what the writer
   reported, or their id columns) must not repeat one another, nor any live
   member of the parent, unless this commit drops that member from the shard
   that holds it. Only parent shards whose partition-key range overlaps a new
   shard's are consulted, through their sidecars (cached).
4. **Drops and removals** are checked against the parent; a shard whose every
   member is dropped is removed instead.
5. Sidecars (their sha256 goes into the entries), then one level-0 segment,
   then any merges (segments.py), then the root, create-only: the commit
   point. `fence()` runs just before it, and the age check: a new shard
   written more than `retention.MAX_COMMIT_AGE_S` ago (store clock) is
   refused, nothing published (gc may be deleting it).
6. After the commit point: the root's own timestamp is checked against the
   same bound; a commit that landed later than that (a pause after its
   checks) waits until any gc that could have missed its root has re-read
   the versions, then checks its files; if one is gone it publishes a copy
   of its parent over itself and raises, so the newest version is readable
   and nothing reports success for samples it lost. A segment or sidecar
   this commit found already written (a retry) is put back if it is gone.
7. `_latest` moves forward; a failure there is logged, never raised: the
   version stands and readers probe past the pointer.

A commit that would change nothing (a retry of a commit that landed: its
shards are all in the parent) returns the parent and publishes nothing.

`commit()` runs these as the named steps of one `_Commit`. Bytes and reads per
commit depend on what the commit changes, not on the dataset size
(bench/commit.py).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pipeline.shards.schema import Provenance
from pipeline.shards.sidecar import SampleIndex, key_hex, sidecar_key
from pipeline.storage import AlreadyExists
from pipeline.table import retention
from pipeline.table.checks import (
    check_against_parent,
    check_no_repeats,
    check_written,
    index_of,
    lineage_of,
    mismatch,
)
from pipeline.table.errors import CommitConflict, DatasetError, ImmutableShardError
from pipeline.table.layout import HISTORY_LENGTH, manifest_key
from pipeline.table.manifest import Manifest, SegmentRef, ShardEntry, Totals
from pipeline.table.segments import Drop, Segment, merge, run_to_merge

if TYPE_CHECKING:
    from pipeline.shards.writer import ShardInfo
    from pipeline.table.manifest import DatasetLike

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitRequest:
    """What `Dataset.commit` was asked to publish (its docstring says what each field means)."""

    shards: tuple[ShardInfo, ...]
    parent_version: int | None
    drop: Mapping[str, frozenset[str]] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    provenance: Provenance | None = None
    new_lineage: bool = False
    num_buckets: int | None = None
    fence: Callable[[], None] | None = None
    complete: bool = False
    session: str | None = None
    fencing: bool = False  # an empty version that fences off an old lease holder (lease.py)


class StaleCommit(DatasetError):
    """A commit names files older than the longest commit gc allows for (retention.py)."""


def commit(ds: DatasetLike, request: CommitRequest) -> Manifest:
    """Publish the next version (the module docstring lists the steps)."""
    c = _Commit(ds, request)
    c.resolve_parent()
    c.check_new_shards()
    c.check_drops_and_removals()
    if c.changes_nothing():
        return c.parent  # type: ignore[return-value]
    c.write_sidecars()
    c.write_segments()
    manifest = c.build_manifest()
    c.publish(manifest)
    c.after_publish(manifest)
    return manifest


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class _Commit:
    """The working state of one commit, step by step; nothing here outlives it."""

    def __init__(self, ds: DatasetLike, request: CommitRequest) -> None:
        self.ds, self.req = ds, request
        self.indexes: dict[str, SampleIndex] = {}  # new shards' members
        self.infos: dict[str, ShardInfo] = {}
        self.drop_rows: dict[str, tuple[set[str], int]] = {}  # path -> (ids, rows of the file)
        self.removed: set[str] = set()
        self.new_entries: list[ShardEntry] = []
        self.refs: list[SegmentRef] = []
        self.delta_key: str | None = None
        self.reused: dict[str, bytes] = {}  # files found already written: key -> their bytes
        self.written: list[str] = []  # every sidecar and segment key this commit names anew
        self.oldest: float | None = None  # store time of the oldest new shard's write

    # ------------------------------------------------------------------ steps

    def resolve_parent(self) -> None:
        """The parent version, the provenance, the lineage and the entries carried over."""
        ds, req = self.ds, self.req
        self.parent = ds.manifest(req.parent_version) if req.parent_version is not None else None
        parent = self.parent
        prov = req.provenance or (
            req.shards[-1].provenance if req.shards else parent.provenance if parent else None
        )
        if prov is None:
            raise ValueError("commit of an empty first version needs `provenance`")
        self.provenance = prov
        self.version = (req.parent_version or 0) + 1
        self.carry = parent is not None and not req.new_lineage
        carried = parent if self.carry else None
        self.lineage = lineage_of(ds, carried, prov, self.version, req.num_buckets)
        self.base: Mapping[str, ShardEntry] = carried.entries if carried else {}  # never modified
        self.parent_ranges = ds.key_ranges(carried) if carried else None

    def check_new_shards(self) -> None:
        """Each new shard: the lineage's provenance, its file as written, its members once."""
        ds = self.ds
        for info in self.req.shards:
            if info.provenance.lineage_key() != self.lineage.key:
                raise mismatch(
                    ds,
                    self.lineage,
                    self.parent,
                    self.provenance,
                    info.provenance,
                    f"shard {info.path}",
                )
            old = self.base.get(info.path)
            if old is not None:
                if old.sha256 != info.sha256:
                    raise ImmutableShardError(
                        f"{ds.shard_url(info.path)} is committed in version "
                        f"{self.req.parent_version} with sha256 {old.sha256[:12]}..., this "
                        f"commit names {info.sha256[:12]}...: committed data files are immutable"
                    )
                continue  # committed already (a retried commit): nothing to add
            if info.path in self.indexes:
                continue  # the same shard twice in one call
            written_at = check_written(ds, info)
            self.oldest = written_at if self.oldest is None else min(self.oldest, written_at)
            self.indexes[info.path], self.infos[info.path] = index_of(ds, info), info
        check_no_repeats(self.indexes)

    def check_drops_and_removals(self) -> None:
        """Drops and removals name live members and shards of the parent; no new member is
        live in the parent unless this commit drops it there."""
        ds, base, parent_version = self.ds, self.base, self.req.parent_version
        for path in self.req.remove:
            if path not in base:
                raise DatasetError(
                    f"cannot remove {path!r}: version {parent_version} does not name it"
                )
            self.removed.add(path)
        for path, ids in self.req.drop.items():
            if not ids:
                continue
            entry = base.get(path)
            if entry is None or path in self.removed:
                raise DatasetError(
                    f"cannot drop rows of {path!r}: version {parent_version} does not name it"
                )
            index = ds.sample_index(entry)
            live = index.member_ids() - set(entry.dropped)
            unknown = sorted(ids - live)
            if unknown:
                raise DatasetError(
                    f"cannot drop {unknown[:3]} from {path}: not live members of it in version "
                    f"{parent_version}"
                )
            if ids == live:
                self.removed.add(path)  # every member gone: the whole shard goes
                continue
            rows = sum(1 for r in index.rows if r.sample_id in ids)
            self.drop_rows[path] = (set(ids), rows)
        check_against_parent(
            ds,
            base,
            self.parent_ranges,
            self.indexes,
            self.removed,
            {p: set(ids) for p, ids in self.req.drop.items()},
        )

    def changes_nothing(self) -> bool:
        """Whether this commit would publish an empty version over its parent (a retry of a
        commit that landed); fencing versions and new lineages are changes."""
        req, parent = self.req, self.parent
        return (
            parent is not None
            and not (self.indexes or self.drop_rows or self.removed)
            and not (req.fencing or req.new_lineage)
            and (parent.complete or not req.complete)
        )

    def write_sidecars(self) -> None:
        """One sidecar per new shard; its sha256 goes into the shard's entry."""
        for path, index in self.indexes.items():
            info = self.infos[path]
            key, data = sidecar_key(path), index.to_json().encode()
            self.written.append(key)
            if _put_once(self.ds, key, data, what=f"{index.shard}'s index"):
                self.reused[key] = data
            key_range = index.key_range()
            self.new_entries.append(
                ShardEntry(
                    path=path,
                    unit_id=info.unit_id,
                    rows=info.rows,
                    tokens=info.tokens,
                    bytes=info.bytes,
                    sha256=info.sha256,
                    codec=info.codec,
                    schema_version=info.schema_version,
                    identity=info.provenance.identity_key(),
                    sidecar=key,
                    sidecar_sha256=hashlib.sha256(data).hexdigest(),
                    key_lo=key_hex(key_range[0]) if key_range else None,
                    key_hi=key_hex(key_range[1]) if key_range else None,
                    version=self.version,
                )
            )
            self.ds.cache_index(index)

    def write_segments(self) -> None:
        """The level-0 segment of what changed, then any merges it completes."""
        self.refs = _base_refs(self, self.parent, self.carry, self.base)
        delta = Segment(
            first_version=self.version,
            last_version=self.version,
            level=0,
            shards=tuple(sorted(self.new_entries, key=lambda e: e.path)),
            drops=tuple(
                Drop(p, tuple(sorted(ids)), rows)
                for p, (ids, rows) in sorted(self.drop_rows.items())
            ),
            removed=tuple(sorted(self.removed)),
        )
        if not (delta.shards or delta.drops or delta.removed):
            return
        self.delta_key, ref = self.put_segment(delta)
        self.refs.append(ref)
        while (start := run_to_merge(self.refs)) is not None:
            merged = merge([self.ds.segment(r) for r in self.refs[start:]])
            self.refs[start:] = [self.put_segment(merged)[1]]

    def build_manifest(self) -> Manifest:
        """The new version: entries, totals, history, as the root will say."""
        ds, parent, carry = self.ds, self.parent, self.carry
        counts = _Counts(_totals(ds, parent if carry else None, self.base))
        for path, index in self.indexes.items():
            counts.add_rows(index.rows, +1)
            counts.bytes += self.infos[path].bytes
            counts.shards += 1
            counts.stored_rows += len(index.rows)
        for path, (ids, _) in self.drop_rows.items():
            rows = ds.sample_index(self.base[path]).rows
            counts.add_rows([r for r in rows if r.sample_id in ids], -1)
        for path in self.removed:
            entry = self.base[path]
            dropped = set(entry.dropped)
            live_rows = [r for r in ds.sample_index(entry).rows if r.sample_id not in dropped]
            counts.add_rows(live_rows, -1)
            counts.bytes -= entry.bytes
            counts.shards -= 1
            counts.stored_rows -= entry.rows
        entries = dict(self.base)
        for entry in self.new_entries:
            entries[entry.path] = entry
        for path, (ids, rows) in self.drop_rows.items():
            entries[path] = entries[path].with_drops(ids, rows)
        for path in self.removed:
            del entries[path]

        version, created = self.version, _now()
        summary = {
            "version": version,
            "created_at": created,
            "shards": counts.shards,
            "rows": counts.rows,
            "tokens": counts.tokens,
            "added_shards": len(self.new_entries),
            "dropped_samples": sum(len(ids) for ids, _ in self.drop_rows.values()),
            "removed_shards": len(self.removed),
        }
        history = (tuple(parent.history) if carry else ())[-(HISTORY_LENGTH - 1) :] + (summary,)
        last_complete = (
            version if self.req.complete else (parent.last_complete_version if carry else None)
        )
        schema_version = max(
            [e.schema_version for e in self.new_entries]
            + [parent.schema_version if carry else 1]
            + [e.schema_version for e in self.base.values() if not carry]
        )
        record = {
            "delta": self.delta_key,
            "added_shards": summary["added_shards"],
            "dropped_samples": summary["dropped_samples"],
            "removed_shards": summary["removed_shards"],
            "new_lineage": self.lineage.first_version == version,
            "complete": self.req.complete,
            "session": self.req.session,
        }
        if self.req.fencing:
            record["fencing"] = True
        return Manifest(
            version=version,
            parent_version=self.req.parent_version,
            created_at=created,
            provenance=self.provenance,
            entries=entries,
            schema_version=schema_version,
            lineage=self.lineage,
            totals=counts.totals(),
            segments=tuple(self.refs),
            commit=record,
            history=history,
            last_complete_version=last_complete,
        )

    def publish(self, manifest: Manifest) -> None:
        """The fence and the age check, then the commit point: the root, create-only."""
        if self.req.fence is not None:
            self.req.fence()
        age = self._age(self.ds.storage.clock) if self.oldest is not None else 0.0
        if age > retention.MAX_COMMIT_AGE_S:
            raise StaleCommit(
                f"{self.ds.uri}: a shard of this commit was written {age / 3600:.1f} h ago, "
                f"past the longest commit gc allows for ({retention.MAX_COMMIT_AGE_S / 3600:g} "
                "h): it may be deleted meanwhile; this commit published nothing (redo the unit)"
            )
        try:
            self.ds.storage.put_if_absent(manifest_key(manifest.version), manifest.root_json())
        except AlreadyExists:
            raise CommitConflict(
                f"{self.ds.uri}: version {manifest.version} was committed by another writer "
                f"(or is a fencing version, or one gc retired) while this commit was based on "
                f"version {self.req.parent_version}; this commit published nothing (re-read the "
                "latest version and commit again)"
            ) from None

    def _age(self, clock: Callable[[], float]) -> float:
        assert self.oldest is not None
        return clock() - self.oldest

    def check_landed_in_time(self, manifest: Manifest) -> None:
        """The root's own timestamp against the bound; a late root's files are checked after
        any gc that missed it has re-read the versions (module docstring, step 6)."""
        if self.oldest is None:
            return
        key = manifest_key(manifest.version)
        age = self._age(lambda: self.ds.storage.info(key).mtime)
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
        named = [*self.infos, *self.written]
        gone = [k for k in named if not _present(self.ds, k)]
        if not gone:
            return
        copy = publish_copy(
            self.ds,
            self.parent,
            manifest.version + 1,
            {"reverts": manifest.version, "reason": f"files deleted before it landed: {gone[:3]}"},
        )
        raise StaleCommit(
            f"{self.ds.uri}: version {manifest.version} landed {age / 3600:.1f} h after its "
            f"shards were written and gc deleted {len(gone)} of its files meanwhile (e.g. "
            f"{gone[0]}); version {copy.version} restores version {self.req.parent_version}: "
            "this commit's samples are not committed (redo the units)"
        )

    def after_publish(self, manifest: Manifest) -> None:
        """Reused files checked once more, caches, `_latest`, the dataset card."""
        from pipeline.table.card import write_card

        ds = self.ds
        self.check_landed_in_time(manifest)
        for key, data in self.reused.items():
            try:
                ds.storage.info(key)  # not exists(): it may answer from a listing cache
            except FileNotFoundError:  # a gc deleted it after reading the versions
                log.warning("put back %s, deleted while this commit reused it", key)
                _put_once(ds, key, data, what=key)
        if self.parent_ranges is not None:
            ranges = self.parent_ranges.with_changes(self.new_entries, self.removed)
            ds.remember_key_ranges(manifest.version, ranges)
        ds.remember(manifest)
        log.info(
            "committed version=%d shards=%d rows=%d tokens=%d new_shards=%d dropped=%d uri=%s",
            manifest.version,
            len(manifest.entries),
            manifest.totals.rows,
            manifest.totals.tokens,
            len(self.new_entries),
            manifest.commit["dropped_samples"],
            ds.uri,
        )
        ds.advance_latest(manifest.version)
        try:
            write_card(ds, manifest)
        except Exception as err:  # the card is documentation; the version is committed
            log.warning("could not write the dataset card: %s", err)

    # ------------------------------------------------------------------ writes

    def put_segment(self, seg: Segment) -> tuple[str, SegmentRef]:
        key, data, ref = seg.encoded()
        self.written.append(key)
        if _put_once(self.ds, key, data, what=key):
            self.reused[key] = data
        self.ds.cache_segment(key, seg)
        return key, ref


# --------------------------------------------------------------------------- totals and writes


class _Counts:
    def __init__(self, t: Totals) -> None:
        self.shards, self.rows, self.tokens, self.bytes = t.shards, t.rows, t.tokens, t.bytes
        self.stored_rows = t.stored_rows
        self.by_domain, self.by_source = Counter(t.by_domain), Counter(t.by_source)

    @classmethod
    def of(cls, t: Totals) -> _Counts:
        return cls(t)

    def add_rows(self, rows, sign: int) -> None:
        for r in rows:
            self.rows += sign
            self.tokens += sign * r.tokens
            self.by_domain[r.domain] += sign
            self.by_source[r.source] += sign

    def totals(self) -> Totals:
        return Totals(
            shards=self.shards,
            rows=self.rows,
            tokens=self.tokens,
            bytes=self.bytes,
            stored_rows=self.stored_rows,
            by_domain={k: v for k, v in self.by_domain.items() if v},
            by_source={k: v for k, v in self.by_source.items() if v},
        )


def _totals(ds: DatasetLike, parent: Manifest | None, base: Mapping[str, ShardEntry]) -> Totals:
    if parent is None:
        return Totals()
    assert parent.totals is not None, "a committed version has its totals"
    return parent.totals


def _base_refs(
    c: _Commit, parent: Manifest | None, carry: bool, base: Mapping[str, ShardEntry]
) -> list[SegmentRef]:
    if not carry or parent is None:
        return []
    return list(parent.segments)


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
    created = _now()
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


def _put_once(ds: DatasetLike, key: str, data: bytes, *, what: str) -> bool:
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
