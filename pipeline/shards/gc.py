"""Garbage collection and retention: what no retained version names, and no live writer may commit.

Decided from manifests and session records, never from file age alone:

1. List every object and every unfinished upload **first**. A file that
   appears after this listing is not a candidate, so a commit that lands
   while gc runs cannot lose a file it names.
2. Read the live write sessions (lease.py): every driver that may still
   commit keeps one, heartbeating. Any candidate that appeared after the start
   of a live session (minus the clock margin) is kept, whatever its age: a
   shard waiting for its batch commit, a sidecar or segment of a commit in
   flight. Unfinished uploads (an hour-long multipart upload, whose listed
   time is its start) are aborted only while no session is live.
3. Read the versions. Retained: all of them, or with `keep_versions=K` the
   newest K, every pinned version and the newest complete one. A file is
   referenced if a retained version names it: its root, its segments, its
   live shards and their sidecars.
4. Delete (with `delete=True`) the roots of versions no longer retained.
5. Read again, just before deleting files: the pins (a version pinned since
   step 3 gets its root back and keeps its files; pins.py says why that order
   is safe) and the versions published since step 3 (a commit may name a
   file this run found unreferenced: a retried commit reuses the segment and
   sidecars its first attempt left). What they name is kept.
6. Delete the unreferenced, unprotected files; abort stale uploads.

`min_age_s` (default one hour) is a second guard for writers that work
outside any session (direct library use of `Dataset.writer`/`commit`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from pipeline.shards.lease import CLOCK_MARGIN_S, SESSIONS_PREFIX, live_sessions
from pipeline.shards.manifest import Dataset, DatasetError, manifest_key
from pipeline.shards.pins import Pin, read_pins
from pipeline.shards.segments import SEGMENT_PREFIX
from pipeline.shards.sidecar import SIDECAR_PREFIX
from pipeline.shards.versions import parse_root
from pipeline.shards.writer import SHARD_PREFIX
from pipeline.storage import ObjectInfo, UploadInfo

_ROOT = re.compile(r"manifests/v(\d{6,})\.json")


def _mb(n: int | float) -> str:
    return f"{n / 1e6:,.1f} MB"


@dataclass(frozen=True)
class GcReport:
    uri: str
    num_versions: int
    retained: tuple[int, ...]
    num_referenced: int
    garbage: tuple[ObjectInfo, ...]  # unreferenced, unprotected: deleted (or would be)
    in_flight: tuple[ObjectInfo, ...]  # unreferenced, but a live session may commit them
    young: tuple[ObjectInfo, ...]  # unreferenced, no session, younger than min_age_s
    expired: tuple[int, ...]  # versions whose roots are removed (retention)
    stale_uploads: tuple[UploadInfo, ...]
    deleted: bool
    pins: tuple[tuple[str, int], ...] = ()  # (name, version) of every pin honoured

    def to_text(self) -> str:
        total = sum(o.size for o in self.garbage)
        lines = [
            f"{self.uri}: {self.num_versions} versions, {len(self.retained)} retained, referencing "
            f"{self.num_referenced} files; {len(self.garbage)} unreferenced file(s), {_mb(total)}"
        ]
        verb = "deleted" if self.deleted else "would delete"
        lines += [f"  kept version {v} (pinned by {name})" for name, v in self.pins]
        if self.expired:
            lines.append(f"  {verb} the roots of versions {', '.join(map(str, self.expired))}")
        lines += [f"  {verb} {o.key} ({o.size} bytes)" for o in self.garbage]
        lines += [f"  kept (a live write session may commit it) {o.key}" for o in self.in_flight]
        lines += [f"  kept (younger than min age, no session) {o.key}" for o in self.young]
        verb_up = "aborted" if self.deleted else "would abort"
        lines += [f"  {verb_up} unfinished upload {u.key}" for u in self.stale_uploads]
        if (self.garbage or self.expired or self.stale_uploads) and not self.deleted:
            lines.append("dry run: pass --delete to remove them")
        return "\n".join(lines)


def _is_candidate(key: str) -> bool:
    # Data files only, with the hidden temp files of puts killed before their link
    # (they live beside the file they were becoming). A temp file beside a control
    # object (the lease, a root, a session) is a put_if_match in flight, often
    # before any session exists to protect it: never a candidate.
    return key.startswith((SHARD_PREFIX, SIDECAR_PREFIX, SEGMENT_PREFIX))


def _referenced(ds: Dataset, versions: list[int], retained: list[int]) -> set[str]:
    """Keys the retained versions name: roots, segments, live shards, sidecars."""
    out: set[str] = set()
    if len(retained) == len(versions):
        # Every version retained: every shard any segment lists was live in some
        # version, so the union of the segments is exact (and cheap: segments are shared).
        for v in retained:
            key = manifest_key(v)
            out.add(key)
            root = parse_root(ds.storage.read_bytes(key), ds.storage.url(key))
            if root.manifest_version == 1:
                out.update(e["path"] for e in root.body["shards"])
                continue
            for ref in root.segments:
                out.add(ref.key)
                for entry in ds.segment(ref).shards:
                    out.add(entry.path)
                    if entry.sidecar:
                        out.add(entry.sidecar)
        return out
    for v in retained:
        manifest = ds.manifest(v)
        out.add(manifest_key(v))
        out.update(ref.key for ref in manifest.segments)
        for entry in manifest.shards:
            out.add(entry.path)
            if entry.sidecar:
                out.add(entry.sidecar)
    return out


def gc_dataset(
    uri: str,
    *,
    delete: bool = False,
    keep_versions: int | None = None,
    min_age_s: float = 3600.0,
    endpoint_url: str | None = None,
    now: float | None = None,
) -> GcReport:
    if keep_versions is not None and keep_versions < 1:
        raise ValueError(f"keep_versions must be at least 1, got {keep_versions}")
    ds = Dataset.open(uri, endpoint_url=endpoint_url)
    storage = ds.storage
    objects = storage.list()  # 1. first: later files are not candidates
    uploads = storage.list_uploads()
    now = time.time() if now is None else now
    sessions = live_sessions(ds, now)  # 2.
    protect_from = min((s.started_at for s in sessions), default=None)
    versions = sorted(  # 3.
        int(m.group(1)) for o in objects if (m := _ROOT.fullmatch(o.key))
    )
    newer = ds.versions()  # roots committed since the listing are retained too
    versions = sorted(set(versions) | set(newer))
    if not versions and not objects:
        raise DatasetError(f"{ds.uri}: no dataset here (no manifests, no shards)")
    pins = read_pins(ds, now)
    if keep_versions is None or not versions:
        retained = list(versions)
    else:
        keep = set(versions[-keep_versions:])
        keep.update(_pinned(pins, versions))
        latest = ds.manifest(versions[-1])
        if latest.last_complete_version in versions:
            keep.add(latest.last_complete_version)
        retained = sorted(keep)
    expired = [v for v in versions if v not in set(retained)]
    referenced = _referenced(ds, versions, retained)
    garbage, in_flight, young = _sort_candidates(objects, referenced, protect_from, now, min_age_s)
    # An upload's listed start time comes from the server (and some servers fake
    # it), so uploads are aborted only while no session is live at all.
    stale = [] if sessions else [u for u in uploads if now - u.initiated >= min_age_s]
    dead_sessions = [
        o.key
        for o in objects
        if o.key.startswith(SESSIONS_PREFIX)
        and o.key[len(SESSIONS_PREFIX) : -len(".json")] not in {s.session for s in sessions}
        and now - o.mtime > CLOCK_MARGIN_S
    ]
    if delete:  # 4. roots first: a crash in between leaves garbage, never a dangling version
        roots = {v: storage.read_bytes(manifest_key(v)) for v in expired}
        for v in expired:
            storage.delete(manifest_key(v))
        # 5. what was pinned or published meanwhile keeps its files
        pins = read_pins(ds, now)
        rescued = sorted(_pinned(pins, expired))
        for v in rescued:
            _put_back(ds, manifest_key(v), roots[v])
        expired = [v for v in expired if v not in rescued]
        newer = [v for v in ds.versions() if v > versions[-1]] if versions else ds.versions()
        retained = sorted(set(retained) | set(rescued) | set(newer))
        if rescued or newer:
            referenced |= _referenced(ds, [], rescued + newer)
            garbage = [o for o in garbage if o.key not in referenced]
        for obj in garbage:  # 6.
            storage.delete(obj.key)
        for upload in stale:
            storage.abort_upload(upload)
        for key in dead_sessions:
            storage.delete(key)
    honoured = tuple((p.name, v) for p in pins for v in sorted(set(retained)) if v == p.version)
    return GcReport(
        ds.uri,
        len(versions),
        tuple(retained),
        len(referenced),
        tuple(garbage),
        tuple(in_flight),
        tuple(young),
        tuple(expired),
        tuple(stale),
        delete,
        honoured,
    )


def _pinned(pins: list[Pin], versions: list[int]) -> set[int]:
    return {v for v in versions if any(p.keeps(v) for p in pins)}


def _sort_candidates(objects, referenced, protect_from, now, min_age_s):
    """(garbage, in_flight, young) among the listed files no retained version names."""
    garbage, in_flight, young = [], [], []
    for obj in objects:
        if obj.key in referenced or not _is_candidate(obj.key):
            continue
        if protect_from is not None and obj.mtime >= protect_from - CLOCK_MARGIN_S:
            in_flight.append(obj)
        elif now - obj.mtime < min_age_s:
            young.append(obj)
        else:
            garbage.append(obj)
    return garbage, in_flight, young


def _put_back(ds: Dataset, key: str, data: bytes) -> None:
    from pipeline.storage import AlreadyExists

    try:
        ds.storage.put_if_absent(key, data)
    except AlreadyExists:
        pass
