"""Who may write a dataset, and what gc must keep: the writer lease, write sessions, reader pins.

* **Lease** (`_lease`): one object naming the single driver (a regeneration
  or a refresh) allowed to commit. Taken with a create-only put, or by
  compare-and-swap over a released or expired holder, so of two takers
  exactly one wins; the other gets `LeaseHeld`, which names the holder.
  The holder renews it every `ttl_s / 3` (a heartbeat thread); a renewal
  that finds another holder marks the lease lost.
* **Fencing**: a commit calls `WriteSession.check()` just before its commit
  point. It refuses (`LeaseLost`) once the lease was taken over, or when less
  than `CLOCK_MARGIN_S` is left before the expiry this holder last wrote. A
  taker only takes a lease `CLOCK_MARGIN_S` after that expiry, so a holder
  that lost its lease (paused, partitioned) cannot publish after the next one
  starts, as long as clocks agree within the margin and one root put takes
  less than it.
* **Sessions** (`_sessions/<id>.json`): every writing driver keeps a record
  with its start time and expiry, renewed by the same heartbeat. gc keeps every
  file no retained version names that appeared after the start of a live
  session (data files, sidecars and segments of commits in flight), whatever
  its age, and aborts unfinished uploads only when no live session could own them.
* **Pins** (`_pins/<name>.json`): a reader that trains on version N pins it;
  gc keeps pinned versions (and their files) whatever the retention.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pipeline.errors import PipelineError
from pipeline.storage import AlreadyExists, PreconditionFailed

if TYPE_CHECKING:
    from pipeline.shards.versions import DatasetLike

log = logging.getLogger(__name__)

LEASE_KEY = "_lease"
SESSIONS_PREFIX = "_sessions/"
PINS_PREFIX = "_pins/"
DEFAULT_TTL_S = 60.0
CLOCK_MARGIN_S = 10.0


class LeaseHeld(PipelineError):
    """Another driver holds the dataset's writer lease."""


class LeaseLost(PipelineError):
    """This driver's lease expired or was taken over: it must not publish."""


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class LeaseRecord:
    session: str
    owner: str
    host: str
    pid: int
    epoch: int  # +1 at every new holder
    acquired_at: float
    expires_at: float
    released: bool = False

    def live(self, now: float) -> bool:
        return not self.released and now < self.expires_at + CLOCK_MARGIN_S

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        left = self.expires_at - now
        state = f"expires in {left:.0f} s" if left > 0 else f"expired {-left:.0f} s ago"
        return (
            f"{self.owner} (session {self.session}, host {self.host}, pid {self.pid}), held since "
            f"{_iso(self.acquired_at)}, {state}"
        )

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseRecord:
        return cls(**json.loads(data))


def read_lease(dataset: DatasetLike) -> LeaseRecord | None:
    tagged = dataset.storage.read_tagged(LEASE_KEY)
    return LeaseRecord.from_bytes(tagged[0]) if tagged else None


def lease_holder(dataset: DatasetLike) -> LeaseRecord | None:
    """The live holder of the dataset's lease (a writer is running), or None."""
    record = read_lease(dataset)
    return record if record is not None and record.live(time.time()) else None


@dataclass(frozen=True)
class SessionRecord:
    session: str
    owner: str
    started_at: float
    expires_at: float


def live_sessions(dataset: DatasetLike, now: float | None = None) -> list[SessionRecord]:
    """Write sessions whose heartbeat has not lapsed (gc keeps what they may commit)."""
    now = time.time() if now is None else now
    out = []
    for obj in dataset.storage.list(SESSIONS_PREFIX):
        try:
            record = SessionRecord(**json.loads(dataset.storage.read_bytes(obj.key)))
        except (FileNotFoundError, ValueError, TypeError):
            continue  # closed meanwhile, or not ours
        if now < record.expires_at + CLOCK_MARGIN_S:
            out.append(record)
    return out


class WriteSession:
    """One driver's right to write a dataset: a session record, the lease if exclusive, heartbeats.

    Use as a context manager or `start()` / `close()`. `check` is the commit fence.
    """

    def __init__(
        self,
        dataset: DatasetLike,
        *,
        owner: str,
        exclusive: bool = True,
        ttl_s: float | None = None,
    ) -> None:
        self.dataset = dataset
        self.owner = owner
        self.exclusive = exclusive
        self.ttl_s = ttl_s if ttl_s is not None else DEFAULT_TTL_S
        if self.ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {self.ttl_s}")
        self.id = "s-" + secrets.token_hex(5)
        self.started_at = 0.0
        self.expires_at = 0.0
        self.epoch = 0
        self._tag: str | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> WriteSession:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ start / stop

    def start(self, *, wait_s: float = 0.0, poll_s: float = 1.0) -> WriteSession:
        """Take the lease (waiting up to `wait_s` for a holder to go) and start heartbeats."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._try_acquire()
                break
            except LeaseHeld:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        self._write_session_record()
        self._thread = threading.Thread(
            target=_heartbeat_loop,
            args=(weakref.ref(self), self._stop, self.ttl_s / 3),
            name=f"lease-heartbeat-{self.id}",
            daemon=True,
        )
        self._thread.start()
        log.info(
            "write session started session=%s owner=%s uri=%s",
            self.id,
            self.owner,
            self.dataset.uri,
        )
        return self

    def _record(self, now: float, epoch: int, released: bool = False) -> LeaseRecord:
        return LeaseRecord(
            session=self.id,
            owner=self.owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            epoch=epoch,
            acquired_at=self.started_at or now,
            expires_at=now + self.ttl_s,
            released=released,
        )

    def _try_acquire(self) -> None:
        now = time.time()
        self.started_at = now
        if not self.exclusive:
            self.expires_at = now + self.ttl_s
            return
        storage = self.dataset.storage
        tagged = storage.read_tagged(LEASE_KEY)
        current = LeaseRecord.from_bytes(tagged[0]) if tagged else None
        if current is not None and current.live(now):
            raise LeaseHeld(
                f"{self.dataset.uri} is being written by {current.describe(now)}; "
                "wait for it to finish (refresh --wait-for-lease S) or stop it first"
            )
        record = self._record(now, (current.epoch if current else 0) + 1)
        try:
            storage.put_if_match(LEASE_KEY, record.to_bytes(), tagged[1] if tagged else None)
        except PreconditionFailed:
            other = read_lease(self.dataset)
            holder = other.describe() if other else "another driver"
            raise LeaseHeld(f"{self.dataset.uri} was just taken by {holder}") from None
        self._tag = storage.read_tagged(LEASE_KEY)[1]
        self.epoch, self.expires_at = record.epoch, record.expires_at
        if current is not None and not current.released:
            log.warning("took over an expired lease from %s", current.describe(now))

    def _write_session_record(self) -> None:
        record = SessionRecord(self.id, self.owner, self.started_at, self.expires_at)
        with self.dataset.storage.open_write(f"{SESSIONS_PREFIX}{self.id}.json") as fh:
            fh.write(json.dumps(asdict(record)).encode())

    def renew(self) -> None:
        """One heartbeat: push the expiry forward (lease by compare-and-swap, then the record)."""
        with self._lock:
            if self._lost:
                return
            now = time.time()
            if self.exclusive:
                record = self._record(now, self.epoch)
                storage = self.dataset.storage
                try:
                    storage.put_if_match(LEASE_KEY, record.to_bytes(), self._tag)
                except PreconditionFailed:
                    other = read_lease(self.dataset)
                    self._lost = f"taken over by {other.describe() if other else 'another driver'}"
                    log.error("lease lost session=%s: %s", self.id, self._lost)
                    return
                self._tag = storage.read_tagged(LEASE_KEY)[1]
            self.expires_at = now + self.ttl_s
            self._write_session_record()

    def check(self) -> None:
        """The commit fence: raise LeaseLost unless this session may still publish."""
        if self._lost:
            raise LeaseLost(
                f"{self.dataset.uri}: the writer lease of session {self.id} was "
                f"{self._lost}; this commit published nothing"
            )
        left = self.expires_at - time.time()
        if left < CLOCK_MARGIN_S:
            raise LeaseLost(
                f"{self.dataset.uri}: the writer lease of session {self.id} expires in "
                f"{left:.0f} s (renewals failed); this commit published nothing"
            )

    def close(self) -> None:
        """Stop heartbeats, release the lease (if still ours), remove the session record."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            if self.exclusive and self._tag is not None and not self._lost:
                record = self._record(time.time(), self.epoch, released=True)
                try:
                    self.dataset.storage.put_if_match(LEASE_KEY, record.to_bytes(), self._tag)
                except PreconditionFailed:
                    pass  # someone took it over: nothing of ours to release
                self._tag = None
            try:
                self.dataset.storage.delete(f"{SESSIONS_PREFIX}{self.id}.json")
            except FileNotFoundError:
                pass


def _heartbeat_loop(ref: weakref.ref, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        session = ref()
        if session is None:
            return  # the session was dropped without close(): its lease just expires
        try:
            session.renew()
        except Exception as err:  # transient storage trouble: the fence decides when to stop
            log.warning("lease heartbeat failed: %s", err)
        del session


# --------------------------------------------------------------------------- pins


def pin_version(
    dataset: DatasetLike, version: int, name: str, *, owner: str = "", ttl_s: float | None = None
) -> str:
    """Keep `version` from gc under `name` (create-only); the pin's key."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"pin name {name!r} must be non-empty, without '/' or a leading '.'")
    now = time.time()
    body = {
        "version": int(version),
        "owner": owner,
        "created_at": now,
        "expires_at": now + ttl_s if ttl_s else None,
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


def pinned_versions(dataset: DatasetLike, now: float | None = None) -> dict[str, int]:
    """name -> version of every unexpired pin."""
    now = time.time() if now is None else now
    out = {}
    for obj in dataset.storage.list(PINS_PREFIX):
        try:
            body = json.loads(dataset.storage.read_bytes(obj.key))
        except (FileNotFoundError, ValueError):
            continue
        if body.get("expires_at") is None or body["expires_at"] > now:
            out[obj.key[len(PINS_PREFIX) : -len(".json")]] = int(body["version"])
    return out
