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
5. Sidecars, then one level-0 segment, then any merges (segments.py), then
   the root, create-only: the commit point. `fence()` runs just before it.

Bytes and reads per commit depend on what the commit changes, not on the
dataset size (bench/commit.py measures it), except once: the first commit on
top of a format-1 version writes one segment listing the old shards.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pipeline.shards.checks import (
    check_against_parent,
    check_no_repeats,
    check_written,
    index_of,
    lineage_of,
    mismatch,
    range_index,
)
from pipeline.shards.schema import Provenance
from pipeline.shards.segments import TOP_LEVEL, Drop, Segment, merge, run_to_merge
from pipeline.shards.sidecar import (
    SampleIndex,
    key_hex,
    sidecar_key,
)
from pipeline.shards.versions import (
    HISTORY_LENGTH,
    CommitConflict,
    DatasetError,
    ImmutableShardError,
    Manifest,
    SegmentRef,
    ShardEntry,
    Totals,
)
from pipeline.storage import AlreadyExists

if TYPE_CHECKING:
    from pipeline.shards.versions import DatasetLike
    from pipeline.shards.writer import ShardInfo

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def commit(
    ds: DatasetLike,
    shards: list[ShardInfo],
    *,
    drop: dict[str, set[str]],
    remove: list[str],
    parent_version: int | None,
    provenance: Provenance | None,
    new_lineage: bool,
    num_buckets: int | None,
    fence: Callable[[], None] | None,
    complete: bool,
    session: str | None,
) -> Manifest:
    from pipeline.shards.card import write_card
    from pipeline.shards.versions import manifest_key

    parent = ds.manifest(parent_version) if parent_version is not None else None
    prov = provenance or (
        shards[-1].provenance if shards else parent.provenance if parent else None
    )
    if prov is None:
        raise ValueError("commit of an empty first version needs `provenance`")
    version = (parent_version or 0) + 1
    carry = parent is not None and not new_lineage
    lineage = lineage_of(ds, parent if carry else None, prov, version, num_buckets)
    base: Mapping[str, ShardEntry] = parent.entries if carry else {}  # never modified

    # -- new shards: provenance, files, members
    indexes: dict[str, SampleIndex] = {}
    infos: dict[str, ShardInfo] = {}
    for info in shards:
        if info.provenance.lineage_key() != lineage.key:
            raise mismatch(ds, lineage, parent, prov, info.provenance, f"shard {info.path}")
        old = base.get(info.path)
        if old is not None:
            if old.sha256 != info.sha256:
                raise ImmutableShardError(
                    f"{ds.shard_url(info.path)} is committed in version {parent_version} with "
                    f"sha256 {old.sha256[:12]}..., this commit names {info.sha256[:12]}...: "
                    "committed data files are immutable"
                )
            continue  # committed already (a retried commit): nothing to add
        if info.path in indexes:
            continue  # the same shard twice in one call
        check_written(ds, info)
        indexes[info.path], infos[info.path] = index_of(ds, info), info
    check_no_repeats(indexes)

    # -- drops and removals of parent shards
    drop_rows: dict[str, tuple[set[str], int]] = {}
    removed: set[str] = set()
    for path in remove:
        if path not in base:
            raise DatasetError(f"cannot remove {path!r}: version {parent_version} does not name it")
        removed.add(path)
    for path, ids in drop.items():
        if not ids:
            continue
        entry = base.get(path)
        if entry is None or path in removed:
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
            removed.add(path)  # every member gone: the whole shard goes
            continue
        rows = sum(1 for r in index.rows if r.sample_id in ids)
        drop_rows[path] = (ids, rows)

    parent_ranges = range_index(parent) if carry else None
    check_against_parent(ds, base, parent_ranges, indexes, removed, drop)

    # -- totals, entries, sidecars
    totals = _totals(ds, parent if carry else None, base)
    counts = _Counts.of(totals)
    for path, index in indexes.items():
        counts.add_rows(index.rows, +1)
        counts.bytes += infos[path].bytes
        counts.shards += 1
        counts.stored_rows += len(index.rows)
    for path, (ids, _) in drop_rows.items():
        counts.add_rows([r for r in ds.sample_index(base[path]).rows if r.sample_id in ids], -1)
    for path in removed:
        entry = base[path]
        dropped = set(entry.dropped)
        live_rows = [r for r in ds.sample_index(entry).rows if r.sample_id not in dropped]
        counts.add_rows(live_rows, -1)
        counts.bytes -= entry.bytes
        counts.shards -= 1
        counts.stored_rows -= entry.rows

    new_entries = []
    for path, index in indexes.items():
        info = infos[path]
        key_range = index.key_range()
        entry = ShardEntry(
            path=path,
            unit_id=info.unit_id,
            rows=info.rows,
            tokens=info.tokens,
            bytes=info.bytes,
            sha256=info.sha256,
            codec=info.codec,
            schema_version=info.schema_version,
            identity=info.provenance.identity_key(),
            sidecar=sidecar_key(path),
            key_lo=key_hex(key_range[0]) if key_range else None,
            key_hi=key_hex(key_range[1]) if key_range else None,
            version=version,
        )
        new_entries.append(entry)
        _put_sidecar(ds, entry.sidecar, index)
        ds.cache_index(index)

    entries = dict(base)
    for entry in new_entries:
        entries[entry.path] = entry
    for path, (ids, rows) in drop_rows.items():
        entries[path] = entries[path].with_drops(ids, rows)
    for path in removed:
        del entries[path]

    # -- segments
    refs = _base_refs(ds, parent, carry, base)
    delta = Segment(
        first_version=version,
        last_version=version,
        level=0,
        shards=tuple(sorted(new_entries, key=lambda e: e.path)),
        drops=tuple(
            Drop(p, tuple(sorted(ids)), rows) for p, (ids, rows) in sorted(drop_rows.items())
        ),
        removed=tuple(sorted(removed)),
    )
    delta_key = None
    if delta.shards or delta.drops or delta.removed:
        delta_key, ref = _put_segment(ds, delta)
        refs.append(ref)
        while (start := run_to_merge(refs)) is not None:
            merged = merge([ds.segment(r) for r in refs[start:]])
            refs[start:] = [_put_segment(ds, merged)[1]]

    # -- the root: the commit point
    created = _now()
    summary = {
        "version": version,
        "created_at": created,
        "shards": counts.shards,
        "rows": counts.rows,
        "tokens": counts.tokens,
        "added_shards": len(new_entries),
        "dropped_samples": sum(len(ids) for ids, _ in drop_rows.values()),
        "removed_shards": len(removed),
    }
    history = (tuple(parent.history) if carry else ())[-(HISTORY_LENGTH - 1) :] + (summary,)
    last_complete = version if complete else (parent.last_complete_version if carry else None)
    schema_version = max(
        [e.schema_version for e in new_entries]
        + [parent.schema_version if carry else 1]
        + [e.schema_version for e in base.values() if not carry]
    )
    manifest = Manifest(
        version=version,
        parent_version=parent_version,
        created_at=created,
        provenance=prov,
        entries=entries,
        schema_version=schema_version,
        lineage=lineage,
        totals=counts.totals(),
        segments=tuple(refs),
        commit={
            "delta": delta_key,
            "added_shards": summary["added_shards"],
            "dropped_samples": summary["dropped_samples"],
            "removed_shards": summary["removed_shards"],
            "new_lineage": lineage.first_version == version,
            "complete": complete,
            "session": session,
        },
        history=history,
        last_complete_version=last_complete,
    )
    if fence is not None:
        fence()
    try:
        ds.storage.put_if_absent(manifest_key(version), manifest.root_json())
    except AlreadyExists:
        raise CommitConflict(
            f"{ds.uri}: version {version} was committed by another writer while this "
            f"commit was based on version {parent_version}; this commit published nothing "
            "(re-read the latest version and commit again)"
        ) from None
    if parent_ranges is not None:
        manifest.__dict__["_range_index"] = parent_ranges.with_changes(new_entries, removed)
    ds.remember(manifest)
    log.info(
        "committed version=%d shards=%d rows=%d tokens=%d new_shards=%d dropped=%d uri=%s",
        version,
        len(entries),
        counts.rows,
        counts.tokens,
        len(new_entries),
        summary["dropped_samples"],
        ds.uri,
    )
    ds.advance_latest(version)
    try:
        write_card(ds, manifest)
    except Exception as err:  # the card is documentation; the version is committed
        log.warning("could not write the dataset card: %s", err)
    return manifest


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
    if parent.totals is not None:
        return parent.totals
    # A format-1 parent has no per-domain totals: count them once, from its shards.
    counts = _Counts(Totals())
    for path, index in ds.sample_indexes(base.values()).items():
        counts.add_rows(index.rows, +1)
        counts.bytes += base[path].bytes
        counts.shards += 1
        counts.stored_rows += base[path].rows
    return counts.totals()


def _base_refs(
    ds: DatasetLike, parent: Manifest | None, carry: bool, base: Mapping[str, ShardEntry]
) -> list[SegmentRef]:
    if not carry or parent is None:
        return []
    if parent.manifest_version >= 2:
        return list(parent.segments)
    if not base:
        return []
    # Format-1 parent: its shards become one top-level segment (once).
    seg = Segment(1, parent.version, TOP_LEVEL, tuple(base[p] for p in sorted(base)))
    return [_put_segment(ds, seg)[1]]


def _put_segment(ds: DatasetLike, seg: Segment) -> tuple[str, SegmentRef]:
    key, data, ref = seg.encoded()
    try:
        ds.storage.put_if_absent(key, data)
    except AlreadyExists:
        pass  # the key is the content hash: an equal segment is there already
    ds.cache_segment(key, seg)
    return key, ref


def _put_sidecar(ds: DatasetLike, key: str, index: SampleIndex) -> None:
    data = index.to_json().encode()
    try:
        ds.storage.put_if_absent(key, data)
    except AlreadyExists:
        if ds.storage.read_bytes(key) != data:
            raise DatasetError(
                f"{ds.storage.url(key)} exists with other contents than {index.shard}'s index"
            ) from None
