"""Reader pins: `_pins/<name>.json` keeps a version (and every file it names) from gc.

A reader that holds a version for a while pins it: a training run pins the
version it trains on and every version it follows, under names that start
with the run's (`run_pin_prefix`), until the run is finished; `export` and
`evaluate` pin the version they read for as long as they read it
(`pinned`). gc keeps every unexpired pinned version whatever its retention,
and lists the pins it honoured.

Order matters against a concurrent gc: a reader writes its pin *first*, then
reads the version (`Dataset.pin`). gc deletes the roots of the versions it
retires, then reads the pins again and puts back the root of any version
pinned meanwhile before it deletes a file (gc.py). So either gc sees the pin
and keeps the version, or the reader finds the root gone and gets a clear
"version N does not exist", never a version whose files go under it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.storage import AlreadyExists

if TYPE_CHECKING:
    from pipeline.shards.versions import DatasetLike

log = logging.getLogger(__name__)

PINS_PREFIX = "_pins/"
READER_PIN_TTL_S = 7 * 24 * 3600.0  # a reader that dies keeps its version a week, not forever


def pin_version(
    dataset: DatasetLike,
    version: int,
    name: str,
    *,
    owner: str = "",
    ttl_s: float | None = None,
    following: bool = False,
) -> str:
    """Keep `version` from gc under `name` (create-only); the pin's key.

    `following`: keep every later version too (a following reader replays them all)."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"pin name {name!r} must be non-empty, without '/' or a leading '.'")
    now = time.time()
    body = {
        "version": int(version),
        "owner": owner,
        "created_at": now,
        "expires_at": now + ttl_s if ttl_s else None,
        "following": following,
    }
    key = f"{PINS_PREFIX}{name}.json"
    try:
        dataset.storage.put_if_absent(key, json.dumps(body).encode())
    except AlreadyExists:
        held = json.loads(dataset.storage.read_bytes(key))
        if held["version"] != version:
            raise ValueError(
                f"{dataset.storage.url(key)} pins version {held['version']}, not {version}: "
                "unpin it first or use another name"
            ) from None
    return key


def unpin_version(dataset: DatasetLike, name: str) -> None:
    dataset.storage.delete(f"{PINS_PREFIX}{name}.json")


@dataclass(frozen=True)
class Pin:
    name: str
    version: int
    following: bool  # every later version is kept too

    def keeps(self, version: int) -> bool:
        return version == self.version or (self.following and version > self.version)


def read_pins(dataset: DatasetLike, now: float | None = None) -> list[Pin]:
    """Every unexpired pin, by name."""
    now = time.time() if now is None else now
    out = []
    for obj in dataset.storage.list(PINS_PREFIX):
        try:
            body = json.loads(dataset.storage.read_bytes(obj.key))
        except (FileNotFoundError, ValueError):
            continue
        if body.get("expires_at") is None or body["expires_at"] > now:
            name = obj.key[len(PINS_PREFIX) : -len(".json")]
            out.append(Pin(name, int(body["version"]), bool(body.get("following"))))
    return sorted(out, key=lambda p: p.name)


def pinned_versions(dataset: DatasetLike, now: float | None = None) -> dict[str, int]:
    """name -> version of every unexpired pin."""
    return {p.name: p.version for p in read_pins(dataset, now)}


def release_pins(dataset: DatasetLike, prefix: str) -> list[str]:
    """Remove every pin whose name starts with `prefix`; the names removed."""
    names = [n for n in pinned_versions(dataset, now=0.0) if n.startswith(prefix)]
    for name in names:
        unpin_version(dataset, name)
    return names


def run_pin_prefix(out_dir: str | Path) -> str:
    """The pin names of a training run start with this: its folder's name and a hash of its path."""
    path = str(Path(out_dir).resolve())
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(path).name)[:40] or "run"
    return f"train-{stem}-{hashlib.sha256(path.encode()).hexdigest()[:8]}."


def version_pin(prefix: str, version: int) -> str:
    return f"{prefix}v{version:06d}"
