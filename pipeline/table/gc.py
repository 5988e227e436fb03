"""Garbage collection and retention: what no retained version names, and no live writer may commit.

Decided from manifests, session records and the store's own clock, never
from a writer's clock:

1. List every object and every unfinished upload **first**. A file that
   appears after this listing is not a candidate, so a commit that lands
   while gc runs cannot lose a file it names. Then take the store's time
   (`Storage.clock`): every age below is the store's `LastModified` (local:
   mtime) against it.
2. Read the live write sessions (lease.py, judged on the store's clock). Any
   candidate that appeared after the start of a live session is kept,
   whatever its age. Unfinished uploads are aborted only while no session
   is live.
3. Read the versions. Retained: all of them, or with `keep_versions=K` the
   newest K, every pinned version, the newest complete one, and the version
   `_latest` names and every newer one. An unreadable pin holds every
   version. A file is referenced if a retained version names it.
4. Delete (with `delete=True`): move `_latest` up to the newest root, then
   *retire* the versions no longer retained: a marker each; their roots stay,
   so their numbers are never reused (a late commit on one conflicts).
5. Read again, just before deleting files: the pins (a version pinned since
   step 3 is un-retired and keeps its files; pins.py says why that order is
   safe) and the versions published since step 3; and again before any
   delete that comes `retention.GC_REREAD_S` after the last read. What they
   name is kept.
6. Delete the unreferenced, unprotected files older than `min_age_s`; abort
   stale uploads.

`min_age_s` (default `retention.DEFAULT_MIN_AGE_S`, 3 days) is what keeps gc
and commits apart (retention.py): a commit names no file older than
`retention.MAX_COMMIT_AGE_S` (a day) at its commit point, so no file gc may
delete can appear in a root it did not see. A minimum age at or below that
bound needs `unsafe_min_age=True`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, fields

from pipeline.shards.sidecar import SIDECAR_PREFIX
from pipeline.shards.writer import SHARD_PREFIX
from pipeline.storage import AlreadyExists, ObjectInfo, UploadInfo
from pipeline.table import lease, retention
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.layout import manifest_key, retired_key
from pipeline.table.lease import CLOCK_MARGIN_S, SESSIONS_PREFIX, SessionRecord
from pipeline.table.manifest import parse_root
from pipeline.table.pins import Pin, read_pins
from pipeline.table.segments import SEGMENT_PREFIX

log = logging.getLogger(__name__)

_ROOT = re.compile(r"manifests/v(\d{6,})\.json")
_RETIRED = re.compile(r"manifests/retired/v(\d{6,})\.json")


@dataclass(frozen=True)
class LiveSession:
    """A write session gc must respect, with its start on the store's clock."""

    session: str
    owner: str
    started_at: float  # store clock


def live_sessions(dataset: Dataset, now: float | None = None) -> list[LiveSession]:
    """Write sessions whose heartbeat has not lapsed, judged on the store's clock (`now`:
    the store's time, default `storage.clock()`); gc keeps what they may commit."""
    now = dataset.storage.clock() if now is None else now
    out = []
    for obj in dataset.storage.list(lease.SESSIONS_PREFIX):
        if not obj.key.endswith(".json"):
            continue
        try:
            body = json.loads(dataset.storage.read_bytes(obj.key))
            record = SessionRecord(
                **{f.name: body[f.name] for f in fields(SessionRecord) if f.name in body}
            )
        except (FileNotFoundError, ValueError, TypeError, KeyError):
            continue  # closed meanwhile, or not ours
        if record.ttl_s is None:  # an older writer: its own clock is all there is
            if time.time() < record.expires_at + lease.CLOCK_MARGIN_S:
                out.append(LiveSession(record.session, record.owner, record.started_at))
            continue
        if now - obj.mtime < record.ttl_s + lease.CLOCK_MARGIN_S:
            start = record.store_started_at if record.store_started_at is not None else obj.mtime
            out.append(LiveSession(record.session, record.owner, start))
    return out


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
    unreadable_pins: tuple[str, ...] = ()  # one line each: held as pinning every version
    retired_before: int = 0  # versions retired by earlier runs (their roots stay)

    def to_text(self) -> str:
        total = sum(o.size for o in self.garbage)
        lines = [
            f"{self.uri}: {self.num_versions} versions ({self.retired_before} retired before), "
            f"{len(self.retained)} retained, referencing {self.num_referenced} files; "
            f"{len(self.garbage)} unreferenced file(s), {_mb(total)}"
        ]
        verb = "deleted" if self.deleted else "would delete"
        lines += [f"  kept every version: {problem}" for problem in self.unreadable_pins]
        lines += [f"  kept version {v} (pinned by {name})" for name, v in self.pins]
        if self.expired:
            verb_retire = "retired" if self.deleted else "would retire"
            lines.append(
                f"  {verb_retire} versions {', '.join(map(str, self.expired))} (their roots stay)"
            )
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
    min_age_s: float = retention.DEFAULT_MIN_AGE_S,
    unsafe_min_age: bool = False,
    endpoint_url: str | None = None,
) -> GcReport:
    """What gc finds (and, with `delete`, does) at `uri`; the module docstring has the steps."""
    _check_keep_versions(keep_versions)
    min_age_s = retention.check_min_age(min_age_s, unsafe=unsafe_min_age)
    ds = Dataset.open(uri, endpoint_url=endpoint_url)
    storage = ds.storage
    objects = storage.list()  # 1. first: later files are not candidates
    uploads = storage.list_uploads()
    now = storage.clock()  # the store's time, before the versions are read
    sessions = live_sessions(ds, now)  # 2.
    protect_from = min((s.started_at for s in sessions), default=None)
    retired = {int(m.group(1)) for o in objects if (m := _RETIRED.fullmatch(o.key))}
    roots = {int(m.group(1)) for o in objects if (m := _ROOT.fullmatch(o.key))}
    roots = sorted(roots | set(ds.versions()))  # 3. roots committed since the listing too
    if not roots and not objects:
        raise DatasetError(f"{ds.uri}: no dataset here (no manifests, no shards)")
    pointer = ds.pointer_version()  # a damaged pointer stops gc here, in one line
    versions = [v for v in roots if v not in retired]
    pins = read_pins(ds)
    unreadable = tuple(p.problem for p in pins if p.problem is not None)
    if keep_versions is None or not versions or unreadable:
        retained = list(versions)
    else:
        retained = _kept(ds, versions, pins, keep_versions, pointer)
    expired = [v for v in versions if v not in set(retained)]
    referenced = _referenced(ds, versions, retained)
    garbage, in_flight, young = _sort_candidates(objects, referenced, protect_from, now, min_age_s)
    # An upload's listed start time comes from the server (and some servers fake
    # it), so uploads are aborted only while no session is live at all.
    stale = [] if sessions else [u for u in uploads if now - u.initiated >= min_age_s]
    dead_sessions = _dead_sessions(objects, sessions, now)
    if delete:
        if roots:
            ds.advance_latest(roots[-1])  # 4. a lagging pointer catches up first
        for v in expired:
            _retire(ds, v, now)
        pins = read_pins(ds)  # 5. what was pinned or published meanwhile keeps its files
        rescued = sorted(_pinned(pins, expired))
        for v in rescued:
            storage.delete(retired_key(v))
        expired = [v for v in expired if v not in rescued]
        newer = _newer(ds, roots)
        retained = sorted(set(retained) | set(rescued) | set(newer))
        if rescued or newer:
            referenced |= _referenced(ds, [], rescued + newer)
            garbage = [o for o in garbage if o.key not in referenced]
        garbage = _delete(ds, garbage, referenced, retained)  # 6.
        for upload in stale:
            storage.abort_upload(upload)
        for key in dead_sessions:
            storage.delete(key)
    honoured = tuple((p.name, v) for p in pins for v in sorted(set(retained)) if v == p.version)
    return GcReport(
        ds.uri,
        len(roots),
        tuple(retained),
        len(referenced),
        tuple(garbage),
        tuple(in_flight),
        tuple(young),
        tuple(expired),
        tuple(stale),
        delete,
        honoured,
        unreadable,
        len(retired),
    )


def _check_keep_versions(keep_versions: int | None) -> None:
    if keep_versions is not None and (
        not isinstance(keep_versions, int) or isinstance(keep_versions, bool) or keep_versions < 1
    ):
        raise ValueError(f"keep_versions must be at least 1, got {keep_versions!r}")


def _kept(
    ds: Dataset, versions: list[int], pins: list[Pin], keep_versions: int, pointer: int | None
) -> list[int]:
    """The versions `--keep-versions` keeps: the newest, the pinned, the last complete one,
    and the pointer's version with everything newer (readers start at the pointer)."""
    keep = set(versions[-keep_versions:])
    keep.update(_pinned(pins, versions))
    latest = ds.manifest(versions[-1])
    if latest.last_complete_version in versions:
        keep.add(latest.last_complete_version)
    keep.update(v for v in versions if pointer is not None and v >= pointer)
    return sorted(keep)


def _dead_sessions(objects, sessions: list[LiveSession], now: float) -> list[str]:
    """The records of write sessions that are no longer live (past the clock margin)."""
    live = {s.session for s in sessions}
    return [
        o.key
        for o in objects
        if o.key.startswith(SESSIONS_PREFIX)
        and o.key[len(SESSIONS_PREFIX) : -len(".json")] not in live
        and now - o.mtime > CLOCK_MARGIN_S
    ]


def _retire(ds: Dataset, version: int, now: float) -> None:
    body = {"version": version, "retired_by": "gc", "retired_at": now}
    try:
        ds.storage.put_if_absent(retired_key(version), json.dumps(body).encode())
    except AlreadyExists:
        pass  # a concurrent gc retired it too


def _newer(ds: Dataset, roots: list[int]) -> list[int]:
    """Versions published since `roots` were read (retired ones never are: gc retires only
    what it listed)."""
    newest = roots[-1] if roots else 0
    return [v for v in ds.versions() if v > newest]


def _delete(
    ds: Dataset, garbage: list[ObjectInfo], referenced: set[str], retained: list[int]
) -> list[ObjectInfo]:
    """Delete `garbage`, reading the versions again whenever the last read is older than
    `retention.GC_REREAD_S` (a commit that lands late relies on it); what was deleted."""
    last_read, seen, done = time.monotonic(), list(retained), []
    for obj in garbage:
        if time.monotonic() - last_read > retention.GC_REREAD_S:
            newer = _newer(ds, sorted(seen))
            if newer:
                referenced |= _referenced(ds, [], newer)
                seen += newer
            last_read = time.monotonic()
        if obj.key in referenced:
            continue
        ds.storage.delete(obj.key)
        done.append(obj)
    return done


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
