"""Where a dataset keeps its objects, and the checksummed pointer and roots.

Layout of a dataset root (local directory or s3://bucket/prefix):

    shards/<unit>.<attempt>.parquet   immutable data files, written create-only
    index/<unit>.<attempt>.json       per-shard sample index: ids + input hashes (shards/sidecar.py)
    manifests/v000001.json            one root per version (create-only, never modified or deleted)
    manifests/retired/v000001.json    gc's marker: the version is retired, its files may be gone
    manifests/segments/*.json         immutable lists of shard entries the roots name (segments.py)
    _latest                           {"version": N, "checksum": ...}: pointer to the newest version
    _lease, _sessions/, _pins/        writer lease, write sessions (lease.py), reader pins (pins.py)
    README.md                         the dataset card, rewritten at every commit (card.py)
    errors/<name>.jsonl               rows a run could not use, with the reason (no manifest names them)

Protocol (the Delta/Iceberg/Lance pattern, docs/design.md#storage-and-commit):

1. Writers put shards create-only; a shard no manifest names does not exist for readers.
2. A commit (commit.py) reads the parent version, checks the new shards at the
   sample level (a version never lists a sample id twice; every shard has the
   lineage's provenance), writes their sidecars and one delta segment, and
   publishes the next root with a create-only put. That put is the commit
   point: of two committers racing for one version exactly one wins, the other
   gets `CommitConflict` and has published nothing.
3. `_latest` then moves forward by compare-and-swap. It is a hint: if a
   committer dies between 2 and 3, or the pointer put fails, the commit still
   stands (the root is the truth), readers find the newer root by probing the
   next version numbers, and the next commit (or gc) moves the pointer.

Version numbers are never reused: roots are never deleted. gc *retires* a
version with a marker (`manifests/retired/v<N>.json`) and may then delete
the files only it named; its root stays, so a late create-only put of that
number fails like any other conflict. The root and the pointer carry a
checksum (this module); `repair.py` rebuilds either from what is present.

Readers list no directories: they resolve `_latest`, read one root and its
segments (a bounded number), and open exactly the files those name, skipping
the rows a version tombstoned. Only manifest format 2 reads; a root of the
earlier format 1 (every shard listed in the root) is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pipeline.table.errors import DatasetError

MANIFEST_FORMAT = "dspark-targets.manifest"
MANIFEST_VERSION = 2  # what this code writes and reads
HISTORY_LENGTH = 20  # versions summarised in each root (the dataset card shows them)
MANIFEST_PREFIX = "manifests/"
RETIRED_PREFIX = "manifests/retired/"
LATEST_KEY = "_latest"
ERRORS_PREFIX = "errors/"


def manifest_key(version: int) -> str:
    """The storage key of version `version`'s root."""
    return f"{MANIFEST_PREFIX}v{version:06d}.json"


def retired_key(version: int) -> str:
    """The marker gc leaves when it retires a version (its root stays: the number is taken)."""
    return f"{RETIRED_PREFIX}v{version:06d}.json"


def checksum(body: Mapping[str, Any]) -> str:
    """sha256 of a control object's JSON body without its own `checksum` field.

    Computed over a canonical form (sorted keys, no spaces), so the file's own
    layout does not matter and an edited value does."""
    canonical = json.dumps(
        {k: v for k, v in body.items() if k != "checksum"}, sort_keys=True, separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def check_checksum(body: Mapping[str, Any], where: str) -> None:
    """DatasetError if `body` carries a checksum that its fields do not match.

    Objects written before checksums have none and are read unchecked."""
    want = body.get("checksum")
    if want is not None and want != checksum(body):
        raise DatasetError(
            f"{where}: does not match its checksum (edited or damaged); "
            "`dspark-targets repair URI` says what it would rebuild"
        )


def pointer_json(version: int) -> bytes:
    """The `_latest` pointer naming `version`, with its checksum."""
    body: dict[str, Any] = {"version": version}
    body["checksum"] = checksum(body)
    return json.dumps(body).encode()


def parse_pointer(data: bytes, where: str) -> int:
    """The version a `_latest` pointer names; DatasetError (one line) if it is damaged."""
    try:
        body = json.loads(data)
        version = body["version"]
    except (ValueError, KeyError, TypeError):
        raise DatasetError(
            f"{where}: unreadable pointer {data[:40]!r}; `dspark-targets repair URI --apply` "
            "rebuilds it from the versions present"
        ) from None
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise DatasetError(f"{where}: field 'version' is {version!r}, not a version number")
    check_checksum(body, where)
    return version
