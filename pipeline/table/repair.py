"""`dspark-targets repair`: rebuild `_latest` and the newest root from the versions present.

The pointer and every root carry a checksum (layout.py), so a cut or
edited one is refused in one line instead of read. This module is what comes
after: it reads every root that is not retired and finds

* damaged roots (unparsable, checksum, wrong version, a segment gone): each
  is retired with a marker (its number stays taken, readers and gc skip it);
* if the newest versions are damaged, the newest intact one, G. A new version
  repeats G (`publish_copy`) plus the changes of each damaged version after G
  that its own level-0 segment still records (segments are immutable and
  self-describing); a version whose changes cannot be recovered that way is
  named in the report, and the rebuilt version is checked to list no sample
  twice before it is published;
* the pointer, rewritten when it is unreadable or names anything but the
  newest intact version.

Dry run by default: the report says what was found and what `--apply` does.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, replace

from pipeline.storage import AlreadyExists, PreconditionFailed
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.layout import (
    LATEST_KEY,
    manifest_key,
    parse_pointer,
    pointer_json,
    retired_key,
)
from pipeline.table.manifest import Manifest, Totals, parse_root
from pipeline.table.publish import publish_copy
from pipeline.table.segments import SEGMENT_PREFIX, Segment, apply

_SEGMENT_NAME = re.compile(r"manifests/segments/(\d{6,})-(\d{6,})-[0-9a-f]+\.json")


@dataclass(frozen=True)
class RepairReport:
    uri: str
    applied: bool
    pointer: int | None  # what `_latest` said (None: absent or unreadable)
    pointer_problem: str | None
    newest_intact: int | None
    damaged: tuple[tuple[int, str], ...]  # (version, why)
    actions: tuple[str, ...]  # done (applied) or to do

    @property
    def ok(self) -> bool:
        return not self.actions

    def to_text(self) -> str:
        lines = [
            f"{self.uri}: _latest says {self.pointer if self.pointer else '(nothing)'}; newest "
            f"intact version {self.newest_intact}; {len(self.damaged)} damaged root(s)"
        ]
        if self.pointer_problem:
            lines.append(f"  pointer: {self.pointer_problem}")
        lines += [f"  version {v}: {why}" for v, why in self.damaged]
        if not self.actions:
            lines.append("  nothing to repair")
            return "\n".join(lines)
        lines += [f"  {'did' if self.applied else 'would'}: {a}" for a in self.actions]
        if not self.applied:
            lines.append("dry run: pass --apply to write these repairs")
        return "\n".join(lines)


def repair_dataset(
    uri: str, *, apply: bool = False, endpoint_url: str | None = None
) -> RepairReport:
    ds = Dataset.open(uri, endpoint_url=endpoint_url)
    storage = ds.storage
    roots, retired = ds.versions(), ds.retired_versions()
    tagged = storage.read_tagged(LATEST_KEY)
    pointer, pointer_problem = None, None
    if tagged is not None:
        try:
            pointer = parse_pointer(tagged[0], storage.url(LATEST_KEY))
        except DatasetError as err:
            pointer_problem = str(err)
    if not roots:
        raise DatasetError(f"{ds.uri}: no version roots here: nothing to rebuild from")
    damaged = [(v, why) for v in roots if v not in retired and (why := _problem(ds, v))]
    bad = {v for v, _ in damaged}
    intact = [v for v in roots if v not in retired and v not in bad]
    newest_intact = intact[-1] if intact else None
    actions: list[str] = []
    above = [v for v in sorted(bad) if newest_intact is None or v > newest_intact]
    target = newest_intact
    if above:
        if newest_intact is None:
            raise DatasetError(
                f"{ds.uri}: every version root is damaged ({', '.join(map(str, above))}); "
                "nothing intact to rebuild from"
            )
        base = ds.manifest(newest_intact)
        rebuilt, notes = _recover(ds, base, above)
        target = roots[-1] + 1
        actions += notes
        actions.append(
            f"publish version {target}: version {newest_intact} with the recovered changes of "
            f"versions {', '.join(map(str, above))} ({len(rebuilt.entries)} shards, "
            f"{rebuilt.totals.rows} rows)"
        )
    actions += [f"retire damaged version {v} (its root stays; readers and gc skip it)" for v in bad]
    if pointer_problem is not None or pointer != target:
        actions.append(f"point _latest at version {target} (it said {pointer or 'nothing'})")
    if apply and actions:
        for v, why in damaged:
            _retire(ds, v, why)
        if above:
            publish_copy(ds, rebuilt, target, {"repairs": above, "reason": "damaged roots"})
            tagged = storage.read_tagged(LATEST_KEY)  # the copy moved it if it could
        try:
            storage.put_if_match(LATEST_KEY, pointer_json(target), tagged[1] if tagged else None)
        except PreconditionFailed:
            raise DatasetError(
                f"{ds.uri}: _latest changed while repair ran (a writer is active?); run it again"
            ) from None
    return RepairReport(
        ds.uri, apply, pointer, pointer_problem, newest_intact, tuple(damaged), tuple(actions)
    )


def _problem(ds: Dataset, version: int) -> str | None:
    """Why a root cannot stand (None: it reads, and so do its segments)."""
    key = manifest_key(version)
    try:
        root = parse_root(ds.storage.read_bytes(key), ds.storage.url(key))
        if root.version != version:
            return f"{key} says it is version {root.version}"
        if root.manifest_version >= 2:
            for ref in root.segments:
                ds.segment(ref)  # present and matching its sha256
    except DatasetError as err:
        return str(err)
    return None


def _recover(ds: Dataset, base: Manifest, versions: list[int]) -> tuple[Manifest, list[str]]:
    """`base` plus the changes each of `versions` recorded in its own level-0 segment."""
    deltas = _level0_segments(ds)
    refs, notes = list(base.segments), []
    for v in versions:
        hint = _delta_hint(ds, v)
        found = deltas.get(v, [])
        chosen = [r for r in found if r.key == hint] or (found if len(found) == 1 else [])
        if not chosen:
            why = "several candidates" if found else "none left (an empty commit, or removed)"
            notes.append(f"version {v}: no segment of its changes recovered ({why})")
            continue
        refs.append(chosen[0])
        notes.append(f"version {v}: changes recovered from {chosen[0].key}")
    entries = apply(ds.segment(r) for r in refs)
    manifest = replace(base, entries=entries, segments=tuple(refs), totals=_totals(ds, entries))
    _check_once(ds, manifest)
    return manifest, notes


def _level0_segments(ds: Dataset) -> dict[int, list]:
    """version -> refs of the level-0 segments (one version's changes) in the listing."""
    out: dict[int, list] = {}
    for obj in ds.storage.list(SEGMENT_PREFIX):
        m = _SEGMENT_NAME.fullmatch(obj.key)
        if not m or m.group(1) != m.group(2):
            continue
        seg = Segment.from_bytes(ds.storage.read_bytes(obj.key), ds.storage.url(obj.key))
        if seg.level == 0:
            key, _, ref = seg.encoded()
            if key == obj.key:  # its name holds its content hash: intact
                out.setdefault(seg.first_version, []).append(ref)
    return out


def _delta_hint(ds: Dataset, version: int) -> str | None:
    """The delta key a damaged root still names, if its JSON parses at all."""
    try:
        body = json.loads(ds.storage.read_bytes(manifest_key(version)))
        return body["commit"]["delta"]
    except (ValueError, KeyError, TypeError):
        return None


def _totals(ds: Dataset, entries) -> Totals:
    rows = tokens = stored = 0
    by_domain: Counter[str] = Counter()
    by_source: Counter[str] = Counter()
    for path, index in ds.sample_indexes(entries.values()).items():
        dropped = set(entries[path].dropped)
        stored += entries[path].rows
        for r in index.rows:
            if r.sample_id not in dropped:
                rows, tokens = rows + 1, tokens + r.tokens
                by_domain[r.domain] += 1
                by_source[r.source] += 1
    return Totals(
        shards=len(entries),
        rows=rows,
        tokens=tokens,
        bytes=sum(e.bytes for e in entries.values()),
        stored_rows=stored,
        by_domain=dict(by_domain),
        by_source=dict(by_source),
    )


def _check_once(ds: Dataset, manifest: Manifest) -> None:
    seen: Counter[str] = Counter()
    for path, index in ds.sample_indexes(manifest.entries.values()).items():
        dropped = set(manifest.entries[path].dropped)
        seen.update(sid for sid, _ in index.members() if sid not in dropped)
    twice = sorted(sid for sid, n in seen.items() if n > 1)
    if twice:
        raise DatasetError(
            f"{ds.uri}: the recovered changes would list samples twice (e.g. {twice[:3]}); "
            "nothing was repaired"
        )


def _retire(ds: Dataset, version: int, why: str) -> None:
    body = {"version": version, "retired_by": "repair", "reason": why[:200]}
    try:
        ds.storage.put_if_absent(retired_key(version), json.dumps(body).encode())
    except AlreadyExists:
        pass


__all__ = ["RepairReport", "repair_dataset"]
