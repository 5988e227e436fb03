"""Dataset versions: manifests, the exactly-once commit protocol and `_latest`.

Layout of a dataset root (local directory or s3://bucket/prefix):

    shards/<unit_id>.parquet     immutable data files, one per work unit
    manifests/v000001.json       one manifest per version: every shard with rows,
    manifests/v000002.json       tokens, bytes and sha256 (schemas/manifest.schema.json)
    _latest                      {"version": N}: pointer to the newest version
    errors/<unit_id>.jsonl       rows a run could not use, with the reason (no manifest names them)

Protocol (the Delta/Iceberg/Lance pattern, DESIGN.md §5):

1. Writers put shards; a shard not named by a manifest does not exist for readers.
2. A commit reads the parent version, builds the next manifest and publishes it
   with a create-only put. That put is the commit point: of two committers
   racing for the same version exactly one wins, the other gets `CommitConflict`
   and has published nothing.
3. `_latest` then moves forward by compare-and-swap. It is a hint: if a
   committer dies between 2 and 3, readers still find the newer manifest by
   probing the next version numbers, and the next commit repairs the pointer.

Readers list no directories: they resolve `_latest`, read one manifest, and open
exactly the files it names.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.shards.schema import Provenance
from pipeline.shards.writer import ShardInfo, ShardWriter
from pipeline.storage import AlreadyExists, PreconditionFailed, Storage, open_storage

log = logging.getLogger(__name__)

MANIFEST_FORMAT = "dspark-targets.manifest"
MANIFEST_VERSION = 1
MANIFEST_PREFIX = "manifests/"
LATEST_KEY = "_latest"
ERRORS_PREFIX = "errors/"
_MANIFEST_NAME = re.compile(r"manifests/v(\d{6,})\.json")
_LATEST = object()  # sentinel: commit on top of whatever version is newest


class DatasetError(ValueError):
    """A dataset, version or manifest is missing or invalid; the message names it."""


class CommitConflict(RuntimeError):
    """Another committer published the version this commit was going to publish."""


class ImmutableShardError(ValueError):
    """A commit tried to change a shard that an earlier version already names."""


def manifest_key(version: int) -> str:
    return f"{MANIFEST_PREFIX}v{version:06d}.json"


@dataclass(frozen=True)
class ShardEntry:
    """One shard as a manifest lists it."""

    path: str  # key relative to the dataset root
    unit_id: str
    rows: int
    tokens: int
    bytes: int
    sha256: str
    codec: str
    schema_version: int
    identity: str  # Provenance.identity_key() of the shard's data

    @classmethod
    def from_info(cls, info: ShardInfo) -> ShardEntry:
        return cls(
            path=info.path,
            unit_id=info.unit_id,
            rows=info.rows,
            tokens=info.tokens,
            bytes=info.bytes,
            sha256=info.sha256,
            codec=info.codec,
            schema_version=info.schema_version,
            identity=info.provenance.identity_key(),
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Manifest:
    """One committed dataset version."""

    version: int
    parent_version: int | None
    created_at: str  # ISO 8601, UTC
    provenance: Provenance
    shards: tuple[ShardEntry, ...]
    schema_version: int = field(default=1)

    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def shard(self, path: str) -> ShardEntry:
        for entry in self.shards:
            if entry.path == path:
                return entry
        raise DatasetError(f"version {self.version} has no shard {path!r}")

    def to_json(self) -> str:
        body = {
            "format": MANIFEST_FORMAT,
            "manifest_version": MANIFEST_VERSION,
            "version": self.version,
            "parent_version": self.parent_version,
            "created_at": self.created_at,
            "schema_version": self.schema_version,
            "provenance": self.provenance.to_dict(),
            "totals": {
                "shards": len(self.shards),
                "rows": self.num_rows,
                "tokens": self.num_tokens,
                "bytes": self.num_bytes,
            },
            "shards": [s.to_dict() for s in self.shards],
        }
        return json.dumps(body, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        try:
            body = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DatasetError(f"{where}: manifest is not valid JSON ({err})") from None
        if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
            raise DatasetError(
                f"{where}: not a dspark-targets manifest (format != {MANIFEST_FORMAT!r})"
            )
        if body.get("manifest_version") != MANIFEST_VERSION:
            raise DatasetError(
                f"{where}: manifest_version {body.get('manifest_version')!r} is not supported "
                f"(this code reads {MANIFEST_VERSION})"
            )
        try:
            shards = tuple(ShardEntry(**entry) for entry in body["shards"])
            manifest = cls(
                version=int(body["version"]),
                parent_version=body["parent_version"],
                created_at=str(body["created_at"]),
                provenance=Provenance.from_dict(body["provenance"], f"{where} provenance"),
                shards=shards,
                schema_version=int(body["schema_version"]),
            )
        except (KeyError, TypeError) as err:
            raise DatasetError(
                f"{where}: malformed manifest ({type(err).__name__}: {err})"
            ) from None
        totals = body.get("totals", {})
        if totals.get("rows") != manifest.num_rows or totals.get("bytes") != manifest.num_bytes:
            raise DatasetError(f"{where}: totals do not match the shard list")
        return manifest


class Dataset:
    """A versioned dataset of shards at one root; see the module docstring."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    @classmethod
    def open(cls, uri: str | Path, *, endpoint_url: str | None = None) -> Dataset:
        return cls(open_storage(uri, endpoint_url=endpoint_url))

    @property
    def uri(self) -> str:
        return self.storage.uri

    def __repr__(self) -> str:
        return f"Dataset({self.storage!r})"

    # -------------------------------------------------------------- reading

    def _read_latest_pointer(self) -> tuple[int, str | None] | None:
        tagged = self.storage.read_tagged(LATEST_KEY)
        if tagged is None:
            return None
        data, tag = tagged
        try:
            version = int(json.loads(data)["version"])
        except (ValueError, KeyError, TypeError):
            raise DatasetError(
                f"{self.storage.url(LATEST_KEY)}: unreadable pointer {data[:80]!r}"
            ) from None
        return version, tag

    def latest_version(self) -> int | None:
        """Newest committed version, or None for an empty dataset."""
        pointer = self._read_latest_pointer()
        version = pointer[0] if pointer else 0
        # The pointer may lag behind a committed manifest (committer died before
        # moving it): probe forward. Manifests are never deleted, so no gaps.
        while self.storage.exists(manifest_key(version + 1)):
            version += 1
        return version or None

    def versions(self) -> list[int]:
        """Every committed version (lists the manifests folder; for tools, not readers)."""
        found = []
        for obj in self.storage.list(MANIFEST_PREFIX):
            match = _MANIFEST_NAME.fullmatch(obj.key)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def manifest(self, version: int | None = None) -> Manifest:
        """The manifest of `version` (default: the latest)."""
        if version is None:
            version = self.latest_version()
            if version is None:
                raise DatasetError(f"{self.uri}: no committed version (empty or not a dataset)")
        key = manifest_key(version)
        try:
            data = self.storage.read_bytes(key)
        except FileNotFoundError:
            raise DatasetError(
                f"{self.uri}: version {version} does not exist ({key} not found)"
            ) from None
        manifest = Manifest.from_json(data, self.storage.url(key))
        if manifest.version != version:
            raise DatasetError(f"{self.storage.url(key)}: says it is version {manifest.version}")
        return manifest

    def committed_units(self, version: int | None = None) -> set[str]:
        """Unit ids in a version (resume: these units are done)."""
        if self.latest_version() is None:
            return set()
        return {s.unit_id for s in self.manifest(version).shards}

    def shard_url(self, entry: ShardEntry | str) -> str:
        return self.storage.url(entry if isinstance(entry, str) else entry.path)

    # -------------------------------------------------------------- writing

    def writer(self, unit_id: str, provenance: Provenance, **kwargs: Any) -> ShardWriter:
        """A ShardWriter for one unit of this dataset."""
        return ShardWriter(self.storage, unit_id, provenance, **kwargs)

    def write_errors(self, name: str, records: Sequence[Any]) -> str | None:
        """`errors/<name>.jsonl`: one JSON object per record (`to_dict()`); None if empty.

        Error records are side files for operators: no manifest names them and
        a rerun of the same unit overwrites them.
        """
        if not records:
            return None
        key = f"{ERRORS_PREFIX}{name}.jsonl"
        body = "".join(json.dumps(r.to_dict()) + "\n" for r in records).encode()
        with self.storage.open_write(key) as fh:
            fh.write(body)
        return key

    def commit(
        self,
        shards: Sequence[ShardInfo],
        *,
        remove: Sequence[str] = (),
        parent_version: int | None | object = _LATEST,
        provenance: Provenance | None = None,
    ) -> Manifest:
        """Publish the next version: the parent's shards - `remove` + `shards`.

        `parent_version` defaults to the newest version; pass an int (or None
        for "the dataset must be empty") to commit on top of a version you
        planned against. Raises CommitConflict if that version's successor was
        published meanwhile, ImmutableShardError if a shard path already in the
        parent would change, DatasetError if a shard file is missing or its size
        differs from what the writer recorded.
        """
        if parent_version is _LATEST:
            parent_version = self.latest_version()
        parent = self.manifest(parent_version) if parent_version is not None else None
        entries: dict[str, ShardEntry] = {e.path: e for e in parent.shards} if parent else {}
        for path in remove:
            if entries.pop(path, None) is None:
                raise DatasetError(
                    f"cannot remove {path!r}: version {parent_version} does not name it"
                )
        for info in shards:
            new = ShardEntry.from_info(info)
            old = entries.get(new.path)
            if old is not None and old.sha256 != new.sha256:
                raise ImmutableShardError(
                    f"{self.shard_url(new.path)} is committed in version {parent_version} with "
                    f"sha256 {old.sha256[:12]}..., the new file has {new.sha256[:12]}...: committed "
                    "data files are immutable (derive unit ids from the unit's inputs, or remove "
                    "the old shard in an earlier commit)"
                )
            self._check_written(info)
            entries[new.path] = new
        prov = provenance or (
            shards[-1].provenance if shards else parent.provenance if parent else None
        )
        if prov is None:
            raise ValueError("commit of an empty first version needs `provenance`")
        identity = prov.identity_key()
        mixed = sorted(e.path for e in entries.values() if e.identity != identity)
        if mixed:
            raise DatasetError(
                f"{self.uri}: shards {mixed[:5]} come from a different target, tokenizer or "
                "layer set than this commit's provenance; a version holds one kind of target "
                "(remove them in this commit or start a new dataset)"
            )
        version = (parent_version or 0) + 1
        manifest = Manifest(
            version=version,
            parent_version=parent_version,
            created_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            provenance=prov,
            shards=tuple(sorted(entries.values(), key=lambda e: e.path)),
            schema_version=max((e.schema_version for e in entries.values()), default=1),
        )
        try:
            self.storage.put_if_absent(manifest_key(version), manifest.to_json().encode())
        except AlreadyExists:
            raise CommitConflict(
                f"{self.uri}: version {version} was committed by another writer while this "
                f"commit was based on version {parent_version}; this commit published nothing "
                "(re-read the latest version and commit again)"
            ) from None
        log.info(
            "committed version=%d shards=%d rows=%d tokens=%d uri=%s",
            version,
            len(manifest.shards),
            manifest.num_rows,
            manifest.num_tokens,
            self.uri,
        )
        self._advance_latest(version)
        return manifest

    def _check_written(self, info: ShardInfo) -> None:
        try:
            found = self.storage.info(info.path).size
        except FileNotFoundError:
            raise DatasetError(
                f"cannot commit {self.shard_url(info.path)}: file not found"
            ) from None
        if found != info.bytes:
            raise DatasetError(
                f"cannot commit {self.shard_url(info.path)}: {found} bytes on storage, the "
                f"writer wrote {info.bytes} (overwritten by another writer of the same unit?)"
            )

    def _advance_latest(self, version: int, num_attempts: int = 20) -> None:
        """Move `_latest` forward to `version` (never backward) by compare-and-swap."""
        body = json.dumps({"version": version}).encode()
        for _ in range(num_attempts):
            pointer = self._read_latest_pointer()
            if pointer is not None and pointer[0] >= version:
                return
            try:
                self.storage.put_if_match(LATEST_KEY, body, pointer[1] if pointer else None)
                return
            except PreconditionFailed:
                continue  # someone moved it meanwhile: re-read and decide again
        log.warning(
            "could not move _latest to version %d (contention); readers probe past it", version
        )
