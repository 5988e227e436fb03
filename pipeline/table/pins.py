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

Names are unique per run: a training run's pins carry its host and a run id
kept in its output folder (`run_pin_prefix`), so two hosts writing to the same
output path, or two runs on one machine, never share (and never release)
each other's pins. A pin file gc cannot read (cut, edited, not a pin) is
reported in one line and held as pinning every version: gc retires nothing
while it is there, and never deletes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.storage import AlreadyExists
from pipeline.table.errors import DatasetError
from pipeline.table.layout import manifest_key

if TYPE_CHECKING:
    from pipeline.table.manifest import DatasetLike

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
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"pin {name!r}: version must be a version number >= 1, got {version!r}")
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
        held, _ = _parse_pin(dataset.storage.read_bytes(key), name, dataset.storage.url(key))
        if held.problem is not None or held.version != version:
            what = held.problem or f"pins version {held.version}"
            raise ValueError(
                f"{dataset.storage.url(key)} {what}, not {version}: unpin it first or use "
                "another name"
            ) from None
    return key


def unpin_version(dataset: DatasetLike, name: str) -> None:
    dataset.storage.delete(f"{PINS_PREFIX}{name}.json")


def pin_checked(
    dataset: DatasetLike,
    version: int,
    name: str,
    *,
    owner: str = "",
    ttl_s: float | None = None,
    following: bool = False,
) -> str:
    """Keep `version` from gc under `name`; the pin's key.

    The pin is written before the version's root is looked up (a fresh stat,
    not the cache), so a gc running meanwhile either keeps the version or it
    is gone now (`DatasetError`, the pin removed again)."""
    key = pin_version(dataset, version, name, owner=owner, ttl_s=ttl_s, following=following)
    try:
        dataset.storage.info(manifest_key(version))
        dataset.check_not_retired(version)
    except FileNotFoundError:
        unpin_version(dataset, name)
        raise DatasetError(
            f"{dataset.uri}: version {version} does not exist ({manifest_key(version)} not found)"
        ) from None
    except DatasetError:
        unpin_version(dataset, name)
        raise
    dataset.manifest(version)
    return key


@contextlib.contextmanager
def pinned(dataset: DatasetLike, version: int, kind: str) -> Iterator[str | None]:
    """Pin `version` while the block reads it (`kind`: "export", "evaluate"); the pin's name.

    The pin expires after `READER_PIN_TTL_S`, so a reader killed on the way
    keeps nothing for ever. A store this reader may not write to (read-only
    credentials) gets a warning and no pin."""
    name = f"{kind}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        pin_checked(dataset, version, name, owner=kind, ttl_s=READER_PIN_TTL_S)
    except PermissionError as err:
        log.warning(
            "could not pin version %d of %s (%s): gc may retire it", version, dataset.uri, err
        )
        yield None
        return
    try:
        yield name
    finally:
        try:
            unpin_version(dataset, name)
        except OSError as err:  # the pin expires by itself
            log.warning("could not remove pin %s: %s", name, err)


@dataclass(frozen=True)
class Pin:
    name: str
    version: int
    following: bool  # every later version is kept too
    problem: str | None = None  # why the pin file is unreadable: it then holds every version

    def keeps(self, version: int) -> bool:
        if self.problem is not None:
            return True
        return version == self.version or (self.following and version > self.version)


def _parse_pin(data: bytes, name: str, where: str) -> tuple[Pin, float | None]:
    """(the pin, its expiry or None); a malformed file is a Pin with `problem` set."""
    try:
        body = json.loads(data)
        if not isinstance(body, dict):
            raise ValueError(f"not a JSON object but {type(body).__name__}")
        version, expires = body.get("version"), body.get("expires_at")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"field 'version' is {version!r}, not a version number")
        if expires is not None and (
            not isinstance(expires, (int, float)) or isinstance(expires, bool)
        ):
            raise ValueError(f"field 'expires_at' is {expires!r}, not a time")
        return Pin(name, version, bool(body.get("following"))), expires
    except (ValueError, UnicodeDecodeError) as err:
        problem = f"{where}: unreadable pin ({str(err)[:80]}); held as pinning every version"
        return Pin(name, 0, False, problem), None


def read_pins(
    dataset: DatasetLike, now: float | None = None, *, expired: bool = False
) -> list[Pin]:
    """Every unexpired pin (with `expired`, every pin), by name; an unreadable one comes
    back with `problem` set and is logged in one line, never raised."""
    now = time.time() if now is None else now
    out = []
    for obj in dataset.storage.list(PINS_PREFIX):
        if not obj.key.endswith(".json"):
            continue
        name = obj.key[len(PINS_PREFIX) : -len(".json")]
        try:
            data = dataset.storage.read_bytes(obj.key)
        except FileNotFoundError:
            continue  # removed since the listing
        pin, expires = _parse_pin(data, name, dataset.storage.url(obj.key))
        if pin.problem is not None:
            log.warning("%s", pin.problem)
        if expired or expires is None or expires > now:
            out.append(pin)
    return sorted(out, key=lambda p: p.name)


def pinned_versions(dataset: DatasetLike, now: float | None = None) -> dict[str, int]:
    """name -> version of every unexpired readable pin."""
    return {p.name: p.version for p in read_pins(dataset, now) if p.problem is None}


def release_pins(dataset: DatasetLike, prefix: str) -> list[str]:
    """Remove every pin whose name starts with `prefix` (unreadable ones too); the names."""
    names = [p.name for p in read_pins(dataset, expired=True) if p.name.startswith(prefix)]
    for name in names:
        unpin_version(dataset, name)
    return names


RUN_ID_FILE = ".run-id"


def run_id(out_dir: str | Path) -> str:
    """This run's id: made once and kept in its output folder, so a resume reuses it."""
    path = Path(out_dir) / RUN_ID_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{RUN_ID_FILE}.{secrets.token_hex(4)}")
        tmp.write_text(secrets.token_hex(4))
        try:
            os.link(tmp, path)  # create-only: of two starts racing, one id wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


def run_pin_prefix(out_dir: str | Path) -> str:
    """The pin names of a training run start with this: its folder's name, a hash of its
    path, its host and its run id (two hosts writing to one output path differ)."""
    path = str(Path(out_dir).resolve())
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(path).name)[:40] or "run"
    host = re.sub(r"[^A-Za-z0-9_-]+", "-", socket.gethostname())[:32] or "host"
    digest = hashlib.sha256(path.encode()).hexdigest()[:8]
    return f"train-{stem}-{digest}-{host}-{run_id(path)}."


def version_pin(prefix: str, version: int) -> str:
    return f"{prefix}v{version:06d}"
