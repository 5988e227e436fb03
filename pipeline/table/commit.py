"""One commit: sample-level checks, sidecars, a delta segment, merges, the root put.

`commit()` is `Dataset.commit`'s body (layout.py has the protocol). In order:

1. **Lineage**: the parent's lineage continues unless `new_lineage`; every new
   shard's provenance (target, revision, template, layers, codec, generation)
   must have the lineage's key, else `LineageMismatch` names the fields.
2. **Files**: each new shard exists with the size its writer recorded (the
   name was written create-only, so those are the bytes the writer hashed).
3. **Exactly once, per sample**: the new shards' members (what their writers
   reported; a shard with rows and no report is refused) must not repeat one another, nor any live
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

`commit()` runs these as the named steps of one `_Commit`; the commit point and
what follows it (5's root put, 6 and 7) are publish.py's. Bytes and reads per
commit depend on what the commit changes, not on the dataset size
(bench/commit.py).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.shards.schema import Provenance
from pipeline.shards.sidecar import SampleIndex, sidecar_key
from pipeline.table.checks import (
    check_against_parent,
    check_no_repeats,
    check_written,
    index_of,
    lineage_of,
    mismatch,
)
from pipeline.table.errors import DatasetError, ImmutableShardError
from pipeline.table.layout import HISTORY_LENGTH
from pipeline.table.manifest import Manifest, SegmentRef, ShardEntry
from pipeline.table.publish import after_publish, now, publish_root, put_once
from pipeline.table.ranges import key_hex
from pipeline.table.segments import Drop, Segment, merge, run_to_merge
from pipeline.table.totals import Counts, parent_totals

if TYPE_CHECKING:
    from pipeline.shards.writer import ShardInfo
    from pipeline.table.manifest import DatasetLike

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitRequest:
    """What `Dataset.commit` was asked to publish.

    `drop` maps a live shard's path to sample ids tombstoned in it (the rows
    stay in the file and readers skip them). `parent_version` defaults to the
    newest version; pass an int (or None for "the dataset must be empty") to
    commit on top of a version you planned against. `new_lineage` starts a
    new lineage (nothing of the parent is carried); `num_buckets` fixes a
    new lineage's bucket space. `fence` is called just before the commit
    point and raises if this committer may no longer publish (a lost lease);
    `fencing` marks the empty version a writer publishes after a takeover.

    A commit that changes nothing (its shards are all in the parent: a retry of
    one that landed) returns the parent and publishes nothing.

    Raises CommitConflict if the parent's successor was published meanwhile (or
    is a fencing version, or one gc retired: numbers are never reused);
    StaleCommit (publish.py) if a new shard was written longer ago than the
    commit bound (retention.py), or the root landed that late and a file was gone;
    DuplicateSampleError if the version would list a sample id twice;
    LineageMismatch if a shard's provenance differs from the lineage's;
    ImmutableShardError if a path in the parent would change; DatasetError
    if a shard file is missing or its size differs from what the writer wrote.
    """

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
    publish_root(c, manifest)
    after_publish(c, manifest)
    return manifest


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
            self.indexes[info.path], self.infos[info.path] = index_of(info), info
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
            if put_once(self.ds, key, data, what=f"{index.shard}'s index"):
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
        counts = Counts(parent_totals(ds, parent if carry else None, self.base))
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

        version, created = self.version, now()
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

    # ------------------------------------------------------------------ writes

    def put_segment(self, seg: Segment) -> tuple[str, SegmentRef]:
        key, data, ref = seg.encoded()
        self.written.append(key)
        if put_once(self.ds, key, data, what=key):
            self.reused[key] = data
        self.ds.cache_segment(key, seg)
        return key, ref


# --------------------------------------------------------------------------- totals and writes


def _base_refs(
    c: _Commit, parent: Manifest | None, carry: bool, base: Mapping[str, ShardEntry]
) -> list[SegmentRef]:
    if not carry or parent is None:
        return []
    return list(parent.segments)
