"""`Dataset`: a versioned table's handle: versions, roots, segments and indexes read through
caches, pins, commits and the `_latest` pointer (the layout and protocol: layout.py)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.shards.schema import Provenance
from pipeline.shards.sidecar import SampleIndex
from pipeline.shards.writer import ShardInfo, ShardWriter
from pipeline.storage import PreconditionFailed, Storage, open_storage
from pipeline.table.errors import (
    DatasetError,
)
from pipeline.table.layout import (
    ERRORS_PREFIX,
    LATEST_KEY,
    MANIFEST_PREFIX,
    RETIRED_PREFIX,
    manifest_key,
    parse_pointer,
    pointer_json,
    retired_key,
)
from pipeline.table.manifest import Manifest, ShardEntry, manifest_from_root, parse_root
from pipeline.table.ranges import RangeIndex
from pipeline.table.segments import Segment, apply

log = logging.getLogger(__name__)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_MANIFEST_NAME = re.compile(r"manifests/v(\d{6,})\.json")
_RETIRED_NAME = re.compile(r"manifests/retired/v(\d{6,})\.json")
_LATEST = object()  # sentinel: commit on top of whatever version is newest


class _Lru(OrderedDict):
    """A small least-recently-used cache of immutable objects (roots, segments, indexes)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get_or(self, key: Any, make: Callable[[], Any]) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        if len(self) > self.size:
            self.popitem(last=False)
        return value


class Dataset:
    """A versioned dataset of shards at one root; see the module docstring.

    Versions, segments and sample indexes are immutable, so a Dataset caches
    them: a process that commits repeatedly (the sink) reads its parent
    version once, and each commit after that reads only what it adds.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._lock = threading.Lock()
        self._manifests = _Lru(4)
        self._segments = _Lru(512)
        self._indexes = _Lru(200_000)
        self._key_ranges = _Lru(4)

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
        return parse_pointer(data, self.storage.url(LATEST_KEY)), tag

    def pointer_version(self) -> int | None:
        """What `_latest` says (it may lag behind the newest root), or None without one."""
        pointer = self._read_latest_pointer()
        return pointer[0] if pointer else None

    def latest_version(self) -> int | None:
        """Newest committed version, or None for an empty dataset."""
        version = self.pointer_version() or 0
        # The pointer may lag behind a committed root (a committer died before
        # moving it, or its put failed): probe forward. Roots are only ever added
        # after the newest and never deleted, so the probe meets no gap.
        while self.storage.exists(manifest_key(version + 1)):
            version += 1
        return version or None

    def versions(self) -> list[int]:
        """Every version whose root exists, retired ones included (lists the manifests folder;
        for tools, not readers)."""
        return sorted(
            int(m.group(1))
            for obj in self.storage.list(MANIFEST_PREFIX)
            if (m := _MANIFEST_NAME.fullmatch(obj.key))
        )

    def retired_versions(self) -> set[int]:
        """Versions gc retired: their roots stay, their files may be gone."""
        return {
            int(m.group(1))
            for obj in self.storage.list(RETIRED_PREFIX)
            if (m := _RETIRED_NAME.fullmatch(obj.key))
        }

    def check_not_retired(self, version: int) -> None:
        """DatasetError if gc retired `version` (a fresh read, never a cache)."""
        if self.storage.exists(retired_key(version)):
            raise DatasetError(
                f"{self.uri}: version {version} was retired by gc ({retired_key(version)}); "
                "its files may be gone: read a newer version"
            )

    def manifest(self, version: int | None = None) -> Manifest:
        """The resolved manifest of `version` (default: the latest)."""
        if version is None:
            version = self.latest_version()
            if version is None:
                raise DatasetError(f"{self.uri}: no committed version (empty or not a dataset)")
        with self._lock:
            cached = self._manifests.get(version)
        if cached is not None:
            return cached
        key = manifest_key(version)
        try:
            data = self.storage.read_bytes(key)
        except FileNotFoundError:
            raise DatasetError(
                f"{self.uri}: version {version} does not exist ({key} not found)"
            ) from None
        self.check_not_retired(version)  # first: a retired root may also be a damaged one
        root = parse_root(data, self.storage.url(key))
        if root.version != version:
            raise DatasetError(f"{self.storage.url(key)}: says it is version {root.version}")
        entries = apply(self.segment(ref) for ref in root.segments)
        manifest = manifest_from_root(root, entries)
        self.remember(manifest)
        return manifest

    def remember(self, manifest: Manifest) -> None:
        """Cache a version this process resolved or built (versions never change)."""
        with self._lock:
            self._manifests.get_or(manifest.version, lambda: manifest)

    def _cached(self, cache: _Lru, key: Any, load: Callable[[], Any]) -> Any:
        with self._lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        value = load()  # outside the lock: a storage read
        with self._lock:
            return cache.get_or(key, lambda: value)

    def segment(self, ref) -> Segment:
        """A segment named by a root, checked against the root's sha256."""

        def load() -> Segment:
            url = self.storage.url(ref.key)
            try:
                data = self.storage.read_bytes(ref.key)
            except FileNotFoundError:
                raise DatasetError(f"{url}: segment is missing") from None
            if sha256_hex(data) != ref.sha256:
                raise DatasetError(f"{url}: segment does not match its sha256 in the root")
            return Segment.from_bytes(data, url)

        return self._cached(self._segments, ref.key, load)

    def cache_segment(self, key: str, segment: Segment) -> None:
        with self._lock:
            self._segments.get_or(key, lambda: segment)

    def sample_index(self, entry: ShardEntry) -> SampleIndex:
        """Members of a committed shard, from its sidecar."""

        def load() -> SampleIndex:
            if entry.sidecar is None:
                raise DatasetError(
                    f"{self.uri}: committed shard {entry.path} names no sample index"
                )
            url = self.storage.url(entry.sidecar)
            try:
                data = self.storage.read_bytes(entry.sidecar)
            except FileNotFoundError:
                raise DatasetError(f"{url}: sample index of {entry.path} is missing") from None
            if entry.sidecar_sha256 is not None and sha256_hex(data) != entry.sidecar_sha256:
                raise DatasetError(
                    f"{url}: sample index of {entry.path} does not match its sha256 in the "
                    "manifest (edited or damaged); restore it or run `dspark-targets verify`"
                )
            index = SampleIndex.from_json(data, url)
            if index.shard != entry.path or index.sha256 != entry.sha256:
                raise DatasetError(f"{url}: describes another file than {entry.path}")
            return index

        return self._cached(self._indexes, entry.path, load)

    def sample_indexes(
        self, entries: Iterable[ShardEntry], *, num_threads: int = 16
    ) -> dict[str, SampleIndex]:
        """`sample_index` of many shards, read in parallel (planning reads every shard's)."""
        from concurrent.futures import ThreadPoolExecutor

        entries = list(entries)
        if len(entries) <= 1:
            return {e.path: self.sample_index(e) for e in entries}
        with ThreadPoolExecutor(min(num_threads, len(entries))) as pool:
            indexes = list(pool.map(self.sample_index, entries))
        return {e.path: ix for e, ix in zip(entries, indexes, strict=True)}

    def key_ranges(self, manifest: Manifest) -> RangeIndex:
        """A version's shards by partition-key range: built once per version, or remembered
        from the commit that made it (`remember_key_ranges`)."""
        buckets = manifest.lineage.num_buckets if manifest.lineage else 1
        return self._cached(
            self._key_ranges,
            manifest.version,
            lambda: RangeIndex.build(manifest.entries.values(), buckets),
        )

    def remember_key_ranges(self, version: int, ranges: RangeIndex) -> None:
        with self._lock:
            self._key_ranges.get_or(version, lambda: ranges)

    def cache_index(self, index: SampleIndex) -> None:
        with self._lock:
            self._indexes.get_or(index.shard, lambda: index)

    def live_members(self, version: int | None = None) -> dict[str, tuple[str, str]]:
        """sample id -> (shard path, input hash) of every live member of a version."""
        manifest = self.manifest(version)
        out: dict[str, tuple[str, str]] = {}
        for path, index in self.sample_indexes(manifest.shards).items():
            dropped = set(manifest.entries[path].dropped)
            for sid, ihash in index.members():
                if sid not in dropped:
                    out[sid] = (path, ihash)
        return out

    def committed_units(self, version: int | None = None) -> set[str]:
        """Unit ids in a version (for tools; planning works on sample ids, see units.py)."""
        if self.latest_version() is None:
            return set()
        return {s.unit_id for s in self.manifest(version).shards}

    def pin(
        self,
        version: int,
        name: str,
        *,
        owner: str = "",
        ttl_s: float | None = None,
        following: bool = False,
    ) -> str:
        """Keep `version` from gc under `name` (pins.py `pin_checked`); the pin's key."""
        from pipeline.table.pins import pin_checked

        return pin_checked(self, version, name, owner=owner, ttl_s=ttl_s, following=following)

    def unpin(self, name: str) -> None:
        from pipeline.table.pins import unpin_version

        unpin_version(self, name)

    def pinned(self, version: int, kind: str) -> contextlib.AbstractContextManager[str | None]:
        """Pin `version` while a block reads it (pins.py `pinned`); yields the pin's name."""
        from pipeline.table.pins import pinned

        return pinned(self, version, kind)

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
        drop: Mapping[str, Iterable[str]] | None = None,
        remove: Sequence[str] = (),
        parent_version: int | None | object = _LATEST,
        provenance: Provenance | None = None,
        new_lineage: bool = False,
        num_buckets: int | None = None,
        fence: Callable[[], None] | None = None,
        complete: bool = False,
        session: str | None = None,
        fencing: bool = False,
    ) -> Manifest:
        """Publish the next version: the parent's shards - `remove` + `shards`, minus `drop`.

        What each argument means and what a commit raises: commit.py's `CommitRequest`."""
        from pipeline.table.commit import CommitRequest, commit

        if parent_version is _LATEST:
            parent_version = self.latest_version()
        request = CommitRequest(
            shards=tuple(shards),
            parent_version=parent_version,  # type: ignore[arg-type]
            drop={p: frozenset(ids) for p, ids in (drop or {}).items()},
            remove=tuple(remove),
            provenance=provenance,
            new_lineage=new_lineage,
            num_buckets=num_buckets,
            fence=fence,
            complete=complete,
            session=session,
            fencing=fencing,
        )
        return commit(self, request)

    def advance_latest(self, version: int, num_attempts: int = 20) -> bool:
        """Move `_latest` forward to `version` (never backward) by compare-and-swap; whether
        it points at `version` or later now.

        Never raises: it runs after a commit point, where the version is the truth
        and the pointer only a hint readers probe past. A failure is logged."""
        body = pointer_json(version)
        try:
            for _ in range(num_attempts):
                pointer = self._read_latest_pointer()
                if pointer is not None and pointer[0] >= version:
                    return True
                try:
                    self.storage.put_if_match(LATEST_KEY, body, pointer[1] if pointer else None)
                    return True
                except PreconditionFailed:
                    continue  # someone moved it meanwhile: re-read and decide again
            reason = "contention"
        except Exception as err:  # S3 errors past the retries, a damaged pointer
            reason = f"{type(err).__name__}: {err}"
        log.warning(
            "could not move _latest to version %d (%s); readers probe past it, the next "
            "commit or gc moves it",
            version,
            reason,
        )
        return False
