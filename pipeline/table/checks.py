"""The checks a commit makes before its commit point (commit.py runs them in order).

* `lineage_of`: the parent's lineage continues, and the commit's provenance
  has its key; else `LineageMismatch` naming every differing field.
* `check_written`: a new shard's file exists with the size its writer wrote
  (and when it was written, on the store's clock: retention.py).
* `index_of`: a new shard's members, from its writer's report (a shard with
  rows and no report is refused: its file is not opened for them).
* `check_no_repeats` / `check_against_parent`: no sample id twice in the
  version (see commit.py's docstring for which shards are consulted).
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pipeline.shards.schema import Provenance
from pipeline.shards.sidecar import SampleIndex, build_index
from pipeline.table.errors import DatasetError, DuplicateSampleError, LineageMismatch
from pipeline.table.manifest import Lineage, Manifest, ShardEntry
from pipeline.table.ranges import RangeIndex

if TYPE_CHECKING:
    from pipeline.shards.writer import ShardInfo
    from pipeline.table.manifest import DatasetLike


def new_lineage_id() -> str:
    return "l-" + secrets.token_hex(6)


def lineage_of(
    ds: DatasetLike,
    parent: Manifest | None,
    prov: Provenance,
    version: int,
    num_buckets: int | None,
) -> Lineage:
    if parent is None:
        return Lineage(new_lineage_id(), prov.lineage_key(), num_buckets or 1, version)
    lineage = parent.lineage
    assert lineage is not None, "a committed version has a lineage"
    if prov.lineage_key() != lineage.key:
        raise mismatch(ds, lineage, parent, prov, prov, "this commit")
    return lineage


def mismatch(
    ds: DatasetLike,
    lineage: Lineage,
    parent: Manifest | None,
    prov: Provenance,
    got: Provenance,
    what: str,
) -> LineageMismatch:
    reference = parent.provenance if parent is not None else prov
    diffs = reference.lineage_differences(got) or ["(lineage key differs)"]
    return LineageMismatch(
        f"{ds.uri}: {what} was made with other settings than lineage {lineage.id} "
        f"(versions {lineage.first_version}-{parent.version if parent else '?'}): "
        + "; ".join(diffs[:6])
        + ". A version holds one lineage: run `dspark-targets refresh` to start a new "
        "lineage (everything is regenerated), or write to another dataset"
    )


def check_written(ds: DatasetLike, info: ShardInfo) -> float:
    """The shard's write time on the store's clock, after checking its size."""
    try:
        found = ds.storage.info(info.path)
    except FileNotFoundError:
        raise DatasetError(f"cannot commit {ds.shard_url(info.path)}: file not found") from None
    if found.size != info.bytes:
        raise DatasetError(
            f"cannot commit {ds.shard_url(info.path)}: {found.size} bytes on storage, the "
            f"writer wrote {info.bytes}"
        )
    return found.mtime


def index_of(info: ShardInfo) -> SampleIndex:
    """The members of a new shard, from what its writer reported."""
    if len(info.samples) != info.rows:
        raise DatasetError(
            f"cannot commit {info.path}: the writer reported {len(info.samples)} samples "
            f"for {info.rows} rows"
        )
    return build_index(info.path, info.sha256, info.samples, info.attempted)


def check_no_repeats(indexes: dict[str, SampleIndex]) -> None:
    seen: dict[str, str] = {}
    for path, index in indexes.items():
        ids = [sid for sid, _ in index.members()]
        if len(ids) != len(set(ids)):
            twice = sorted(sid for sid, n in Counter(ids).items() if n > 1)
            raise DuplicateSampleError(f"{path} holds samples {twice[:3]} more than once")
        for sid in ids:
            if sid in seen:
                raise DuplicateSampleError(
                    f"sample {sid!r} is in two shards of this commit: {seen[sid]} and {path} "
                    "(two attempts of one unit? commit one of them)"
                )
            seen[sid] = path


def check_against_parent(
    ds: DatasetLike,
    base: Mapping[str, ShardEntry],
    ranges_of: RangeIndex | None,
    indexes: dict[str, SampleIndex],
    removed: set[str],
    drop: dict[str, set[str]],
) -> None:
    """No new member may already be live in the parent, unless this commit drops it there."""
    if ranges_of is None or not base:
        return
    gone = {p: set(ids) for p, ids in drop.items()}
    for new_path, new_index in indexes.items():
        rng = new_index.key_range()
        if rng is None:
            continue
        members = new_index.member_ids()
        for path in ranges_of.overlapping(*rng):
            if path in removed or path not in base:
                continue
            entry = base[path]
            live = ds.sample_index(entry).member_ids() - set(entry.dropped) - gone.get(path, set())
            twice = sorted(live & members)
            if twice:
                raise DuplicateSampleError(
                    f"{ds.uri}: {new_path} holds {len(twice)} sample(s) that {path} already "
                    f"holds in the parent version (e.g. {twice[:3]}); a version lists a sample "
                    "once: drop them from the old shard in the same commit, or leave them out"
                )
