"""Segments: the immutable lists of shard entries a format-2 root names (delta manifests).

Every commit writes one small level-0 segment with what it changed: the
shards it adds, the rows it tombstones in older shards (`drops`) and the
older shards it removes. A version's shards are its root's segments applied
oldest first. So that a root names few segments and a reader resolves a
version in a bounded number of reads, segments are merged the way an LSM
tree or Iceberg's manifest merging does it: when the newest `FANOUT`
segments share a level they are rewritten as one segment of the next level
(drops and removals that hit shards inside the merged run are folded into
those entries). A merged segment over `MAX_MERGED_SHARDS` entries goes to
the top level and is never merged again, so no commit rewrites more than
about that many entries.

Cost per commit, whatever the dataset size: one level-0 segment of the new
entries, a root of at most `(FANOUT - 1) x levels + top segments` references,
and, amortised, each entry rewritten once per level (3-4 levels). Segment keys
carry their content hash, so a segment is written once and shared by every
later version that still names it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.table.errors import DatasetError
from pipeline.table.manifest import SegmentRef, ShardEntry

SEGMENT_FORMAT = "dspark-targets.segment"
SEGMENT_PREFIX = "manifests/segments/"
FANOUT = 8
MAX_MERGED_SHARDS = 2048
TOP_LEVEL = 99


@dataclass(frozen=True)
class Drop:
    """Rows (and attempted samples) tombstoned in a shard of an older segment."""

    path: str
    sample_ids: tuple[str, ...]
    rows: int  # how many of them are rows of the file

    def to_dict(self) -> dict:
        return {"path": self.path, "sample_ids": list(self.sample_ids), "rows": self.rows}


@dataclass(frozen=True)
class Segment:
    first_version: int
    last_version: int
    level: int
    shards: tuple[ShardEntry, ...]
    drops: tuple[Drop, ...] = ()
    removed: tuple[str, ...] = ()

    def to_bytes(self) -> bytes:
        body = {
            "format": SEGMENT_FORMAT,
            "segment_version": 1,
            "first_version": self.first_version,
            "last_version": self.last_version,
            "level": self.level,
            "shards": [s.to_dict() for s in self.shards],
            "drops": [d.to_dict() for d in self.drops],
            "removed": list(self.removed),
        }
        return (json.dumps(body, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Segment:
        try:
            body = json.loads(data)
            if body.get("format") != SEGMENT_FORMAT or body.get("segment_version") != 1:
                raise ValueError(f"not a {SEGMENT_FORMAT} v1 file")
            return cls(
                first_version=int(body["first_version"]),
                last_version=int(body["last_version"]),
                level=int(body["level"]),
                shards=tuple(ShardEntry.from_dict(e) for e in body["shards"]),
                drops=tuple(
                    Drop(d["path"], tuple(d["sample_ids"]), int(d["rows"])) for d in body["drops"]
                ),
                removed=tuple(body["removed"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DatasetError(f"{where}: unreadable segment ({err})") from None

    def encoded(self) -> tuple[str, bytes, SegmentRef]:
        """(key, bytes, ref): the key holds the content hash, so equal segments share it."""
        data = self.to_bytes()
        sha = hashlib.sha256(data).hexdigest()
        key = f"{SEGMENT_PREFIX}{self.first_version:06d}-{self.last_version:06d}-{sha[:16]}.json"
        ref = SegmentRef(
            key=key,
            sha256=sha,
            level=self.level,
            first_version=self.first_version,
            last_version=self.last_version,
            num_shards=len(self.shards),
            num_drops=len(self.drops),
        )
        return key, data, ref


def apply(segments: Iterable[Segment]) -> dict[str, ShardEntry]:
    """The live shards after applying segments oldest first (each entry carries its drops)."""
    entries: dict[str, ShardEntry] = {}
    for seg in segments:
        for entry in seg.shards:
            entries[entry.path] = entry
        for drop in seg.drops:
            old = entries.get(drop.path)
            if old is None:
                raise DatasetError(
                    f"segment v{seg.first_version}-v{seg.last_version} drops rows of "
                    f"{drop.path}, which no earlier segment lists"
                )
            entries[drop.path] = old.with_drops(set(drop.sample_ids), drop.rows)
        for path in seg.removed:
            entries.pop(path, None)
    return entries


def merge(run: Sequence[Segment]) -> Segment:
    """One segment equivalent to `run` (consecutive, oldest first) applied on top of older ones."""
    entries: dict[str, ShardEntry] = {}
    drops: dict[str, tuple[set[str], int]] = {}
    removed: set[str] = set()
    for seg in run:
        for entry in seg.shards:
            entries[entry.path] = entry
        for drop in seg.drops:
            if drop.path in entries:
                entries[drop.path] = entries[drop.path].with_drops(set(drop.sample_ids), drop.rows)
            else:
                ids, rows = drops.get(drop.path, (set(), 0))
                drops[drop.path] = (ids | set(drop.sample_ids), rows + drop.rows)
        for path in seg.removed:
            if entries.pop(path, None) is None:
                removed.add(path)
                drops.pop(path, None)
    size = len(entries) + len(drops)
    level = TOP_LEVEL if size >= MAX_MERGED_SHARDS else run[-1].level + 1
    return Segment(
        first_version=run[0].first_version,
        last_version=run[-1].last_version,
        level=level,
        shards=tuple(entries[p] for p in sorted(entries)),
        drops=tuple(Drop(p, tuple(sorted(ids)), rows) for p, (ids, rows) in sorted(drops.items())),
        removed=tuple(sorted(removed)),
    )


def run_to_merge(refs: Sequence[SegmentRef]) -> int | None:
    """Index where the trailing run of FANOUT same-level segments starts, or None."""
    if len(refs) < FANOUT:
        return None
    level = refs[-1].level
    if level == TOP_LEVEL:
        return None
    start = len(refs)
    while start > 0 and refs[start - 1].level == level:
        start -= 1
    return len(refs) - FANOUT if len(refs) - start >= FANOUT else None
