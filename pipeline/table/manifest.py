"""What a dataset version holds: shard entries, lineages, totals, the manifest and its root.

A version's one JSON file, `manifests/v<N>.json` (its *root*), stays small: it
names the version's lineage, its totals and a short list of immutable
*segments* (segments.py) that together list the shards, the way an Iceberg
snapshot names manifest files (manifest format 2; the earlier format 1, which
listed every shard in the root, is refused in one line).

Everything here is plain data and JSON; the protocol lives in dataset.py and
commit.py, the object layout in layout.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Protocol

from pipeline.shards.schema import Provenance
from pipeline.storage import Storage, check_key
from pipeline.table.errors import DatasetError
from pipeline.table.layout import MANIFEST_FORMAT, MANIFEST_VERSION, check_checksum, checksum


@dataclass(frozen=True)
class ShardEntry:
    """One shard as a manifest lists it."""

    path: str  # key relative to the dataset root
    unit_id: str
    rows: int  # rows in the file (dropped ones included)
    tokens: int
    bytes: int
    sha256: str
    codec: str
    schema_version: int
    identity: str  # Provenance.identity_key() of the shard's data
    # Set by the commit (sidecar.py); None in an entry not yet committed:
    sidecar: str | None = None  # key of the shard's sample index (sidecar.py)
    sidecar_sha256: str | None = None  # of the sidecar's bytes; None: committed before hashing
    key_lo: str | None = None  # partition-key range of its members, 16 hex digits
    key_hi: str | None = None
    version: int | None = None  # the version that added it
    dropped: tuple[str, ...] = ()  # sample ids tombstoned in this shard, sorted
    dropped_rows: int = 0  # how many of `dropped` are rows of the file

    @property
    def live_rows(self) -> int:
        return self.rows - self.dropped_rows

    @cached_property
    def key_range(self) -> tuple[int, int] | None:
        """Partition-key range of the members as ints; None if unknown."""
        if self.key_lo is None or self.key_hi is None:
            return None
        return int(self.key_lo, 16), int(self.key_hi, 16)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["dropped"] = list(self.dropped)
        return out

    def __getstate__(self) -> dict[str, Any]:  # the cached key range stays out of pickles
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardEntry:
        data = dict(data)
        data["dropped"] = tuple(data.get("dropped", ()))
        # Paths from a manifest are data: they must stay under the dataset root.
        check_key(data.get("path"))
        if data.get("sidecar") is not None:
            check_key(data["sidecar"])
        return cls(**data)

    def with_drops(self, ids: set[str] | frozenset[str], rows: int) -> ShardEntry:
        return replace(
            self,
            dropped=tuple(sorted(set(self.dropped) | set(ids))),
            dropped_rows=self.dropped_rows + rows,
        )


@dataclass(frozen=True)
class Lineage:
    """A line of versions made with one target, layer set, template, codec and generation."""

    id: str  # "l-" + 12 hex digits, fresh when a lineage starts
    key: str  # Provenance.lineage_key() every shard of the lineage has
    num_buckets: int  # the fixed bucket space planning cuts conversations into
    first_version: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Totals:
    """Counts of the live rows of a version (dropped rows excluded)."""

    shards: int = 0
    rows: int = 0
    tokens: int = 0
    bytes: int = 0  # of the shard files (dropped rows still take their space)
    stored_rows: int = 0  # rows in the files, dropped ones included
    by_domain: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "rows": self.rows,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "stored_rows": self.stored_rows,
            "by_domain": dict(sorted(self.by_domain.items())),
            "by_source": dict(sorted(self.by_source.items())),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Totals:
        return cls(**{f.name: data.get(f.name, f.default) for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class SegmentRef:
    """A root's pointer to one segment (segments.py)."""

    key: str
    sha256: str
    level: int
    first_version: int
    last_version: int
    num_shards: int
    num_drops: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, eq=False)
class Manifest:
    """One committed dataset version, resolved: every live shard with its tombstones."""

    version: int
    parent_version: int | None
    created_at: str  # ISO 8601, UTC
    provenance: Provenance
    entries: Mapping[str, ShardEntry]  # path -> entry
    schema_version: int = 1
    manifest_version: int = MANIFEST_VERSION
    lineage: Lineage | None = None  # None until a commit sets it
    totals: Totals | None = None
    segments: tuple[SegmentRef, ...] = ()
    commit: Mapping[str, Any] = field(default_factory=dict)  # what this version's commit did
    history: tuple[Mapping[str, Any], ...] = ()
    last_complete_version: int | None = None

    @cached_property
    def shards(self) -> tuple[ShardEntry, ...]:
        """Every live shard, sorted by path."""
        return tuple(self.entries[p] for p in sorted(self.entries))

    @property
    def num_rows(self) -> int:
        """Live rows: what a reader of this version sees."""
        return sum(s.live_rows for s in self.entries.values())

    @property
    def num_stored_rows(self) -> int:
        return sum(s.rows for s in self.entries.values())

    @property
    def num_tokens(self) -> int:
        if self.totals is not None:
            return self.totals.tokens
        return sum(s.tokens for s in self.entries.values())

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.entries.values())

    @property
    def complete(self) -> bool:
        """The run that committed this version finished every unit it planned."""
        return bool(self.commit.get("complete"))

    def shard(self, path: str) -> ShardEntry:
        try:
            return self.entries[path]
        except KeyError:
            raise DatasetError(f"version {self.version} has no shard {path!r}") from None

    def dropped(self, entry: ShardEntry | str) -> frozenset[str]:
        """Sample ids tombstoned in a shard: readers skip those rows."""
        path = entry if isinstance(entry, str) else entry.path
        return frozenset(self.shard(path).dropped)

    # ------------------------------------------------------------------ JSON

    def root_json(self) -> bytes:
        """The format-2 root of this version (shards live in the segments)."""
        assert self.lineage is not None and self.totals is not None
        body = {
            "format": MANIFEST_FORMAT,
            "manifest_version": 2,
            "version": self.version,
            "parent_version": self.parent_version,
            "created_at": self.created_at,
            "schema_version": self.schema_version,
            "provenance": self.provenance.to_dict(),
            "lineage": self.lineage.to_dict(),
            "totals": self.totals.to_dict(),
            "segments": [s.to_dict() for s in self.segments],
            "commit": dict(self.commit),
            "last_complete_version": self.last_complete_version,
            "history": [dict(h) for h in self.history],
        }
        body["checksum"] = checksum(body)
        return (json.dumps(body, indent=1) + "\n").encode()


@dataclass(frozen=True)
class Root:
    """A parsed root file: the version's header, before its segments are read."""

    body: dict[str, Any]
    manifest_version: int
    where: str

    @property
    def version(self) -> int:
        return int(self.body["version"])

    @property
    def segments(self) -> tuple[SegmentRef, ...]:
        try:
            refs = tuple(SegmentRef(**s) for s in self.body.get("segments", ()))
            for ref in refs:
                check_key(ref.key)  # a key from the root: it must stay under the dataset root
        except (TypeError, ValueError) as err:
            raise DatasetError(f"{self.where}: malformed segment list ({err})") from None
        return refs


# Fields every root must have, with their JSON types (format 2 adds _ROOT_FIELDS_V2).
_ROOT_FIELDS = {
    "version": int,
    "created_at": str,
    "schema_version": int,
    "provenance": dict,
}
_ROOT_FIELDS_V2 = {"lineage": dict, "totals": dict, "segments": list}


def _check_fields(body: Mapping[str, Any], fields: Mapping[str, type], where: str) -> None:
    for name, kind in fields.items():
        if name not in body:
            raise DatasetError(f"{where}: field {name!r} is missing")
        value = body[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise DatasetError(
                f"{where}: field {name!r} is {type(value).__name__} {str(value)[:40]!r}, "
                f"expected {kind.__name__}"
            )
    parent = body.get("parent_version", "missing")
    if parent == "missing":
        raise DatasetError(f"{where}: field 'parent_version' is missing")
    if parent is not None and (not isinstance(parent, int) or isinstance(parent, bool)):
        raise DatasetError(f"{where}: field 'parent_version' is {parent!r}, expected int or null")


def parse_root(text: str | bytes, where: str) -> Root:
    """A root's JSON, checked: format, required fields and their types, checksum."""
    try:
        body = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetError(f"{where}: manifest is not valid JSON ({err})") from None
    if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
        raise DatasetError(
            f"{where}: not a dspark-targets manifest (format != {MANIFEST_FORMAT!r})"
        )
    mv = body.get("manifest_version")
    if mv == 1:
        raise DatasetError(
            f"{where}: manifest format 1 (a dataset written before lineages) is no longer read; "
            "regenerate the dataset"
        )
    if mv != MANIFEST_VERSION:
        raise DatasetError(
            f"{where}: manifest_version {mv!r} is not supported (this code reads "
            f"{MANIFEST_VERSION}; data written by newer code needs a newer dspark-targets)"
        )
    _check_fields(body, {**_ROOT_FIELDS, **_ROOT_FIELDS_V2}, where)
    check_checksum(body, where)
    return Root(body, int(mv), where)


def manifest_from_root(root: Root, entries: Mapping[str, ShardEntry]) -> Manifest:
    """A Manifest from a root and the `entries` resolved from its segments."""
    body, where = root.body, root.where
    try:
        common = dict(
            version=int(body["version"]),
            parent_version=body["parent_version"],
            created_at=str(body["created_at"]),
            provenance=Provenance.from_dict(body["provenance"], f"{where} provenance"),
            schema_version=int(body["schema_version"]),
            manifest_version=root.manifest_version,
        )
        manifest = Manifest(
            entries=entries,
            lineage=Lineage(**body["lineage"]),
            totals=Totals.from_dict(body["totals"]),
            segments=root.segments,
            commit=dict(body.get("commit", {})),
            history=tuple(body.get("history", ())),
            last_complete_version=body.get("last_complete_version"),
            **common,
        )
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, DatasetError):
            raise
        raise DatasetError(f"{where}: malformed manifest ({type(err).__name__}: {err})") from None
    totals = manifest.totals
    if totals.shards != len(entries) or totals.stored_rows != manifest.num_stored_rows:
        raise DatasetError(
            f"{where}: totals ({totals.shards} shards, {totals.stored_rows} rows) do not match "
            f"its segments ({len(entries)} shards, {manifest.num_stored_rows} rows)"
        )
    return manifest


class DatasetLike(Protocol):
    """What the commit, lease, check and card modules use of a `manifest.Dataset`.

    They sit below the Dataset class (which calls them), so they name this
    shape instead of importing it.
    """

    storage: Storage
    uri: str

    def manifest(self, version: int | None = None) -> Manifest: ...
    def check_not_retired(self, version: int) -> None: ...
    def remember(self, manifest: Manifest) -> None: ...
    def segment(self, ref: SegmentRef) -> Any: ...
    def cache_segment(self, key: str, segment: Any) -> None: ...
    def sample_index(self, entry: ShardEntry) -> Any: ...
    def sample_indexes(self, entries: Any) -> Any: ...
    def cache_index(self, index: Any) -> None: ...
    def key_ranges(self, manifest: Manifest) -> Any: ...
    def remember_key_ranges(self, version: int, ranges: Any) -> None: ...
    def latest_version(self) -> int | None: ...
    def commit(self, shards: Any, **kwargs: Any) -> Manifest: ...
    def shard_url(self, entry: ShardEntry | str) -> str: ...
    def advance_latest(self, version: int, num_attempts: int = 20) -> None: ...
