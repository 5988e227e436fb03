"""Who may write a dataset: the writer lease and write sessions (reader pins are in pins.py).

* **Lease** (`_lease`): one object naming the single driver (a regeneration
  or a refresh) allowed to commit. Taken with a create-only put, or by
  compare-and-swap over a released or expired holder, so of two takers
  exactly one wins; the other gets `LeaseHeld`, which names the holder.
  The holder renews it every `ttl_s / 3` (a heartbeat thread); a renewal
  that finds another holder marks the lease lost. Every put of the lease is
  a compare-and-swap on the tag the last one returned; when a put's reply is
  lost (it may have landed), the next one fails its precondition, reads the
  lease, and goes on with its tag if the record there is still this
  session's (`_adopt`). `close()` always tries to release what is still ours.
* **Fencing**, twice: `WriteSession.check()` just before a commit point
  refuses (`LeaseLost`) once the lease was taken over or is within
  `CLOCK_MARGIN_S` of expiring; and a taker of an unreleased lease first
  publishes an empty *fencing version*, so a commit the old holder prepared
  before a pause is a create-only put of a taken number, which the store
  refuses (docs/RELIABILITY.md).
* **Sessions** (`_sessions/<id>.json`): every writing driver keeps a record,
  rewritten by the same heartbeat. gc judges it on the store's clock alone
  (`LastModified` within its TTL plus the margin) and keeps every unnamed
  file that appeared after a live session started, so a writer's clock
  ahead or behind changes nothing gc decides (docs/shards.md).
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
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pipeline.storage import PreconditionFailed
from pipeline.table.errors import LeaseHeld, LeaseLost

if TYPE_CHECKING:
    from pipeline.table.manifest import DatasetLike

log = logging.getLogger(__name__)

LEASE_KEY = "_lease"
SESSIONS_PREFIX = "_sessions/"
DEFAULT_TTL_S = 60.0
CLOCK_MARGIN_S = 10.0


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
    took_over: str | None = None  # the session of an unreleased holder this one replaced

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
        body = json.loads(data)  # fields a newer writer added are left out
        return cls(**{f.name: body[f.name] for f in fields(cls) if f.name in body})


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
    started_at: float  # the writer's clock (for people; gc uses the store's times)
    expires_at: float
    ttl_s: float | None = None  # None: written before store-clock liveness
    store_started_at: float | None = None  # the first record's LastModified


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
        self.took_over: str | None = None  # the unreleased holder this session replaced
        self.store_started_at: float | None = None  # the first record's LastModified
        self._first_write: float | None = None  # monotonic time of the first record
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
        if self.took_over is not None:
            try:
                self._seal()
            except BaseException:
                self.close()
                raise
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
            took_over=self.took_over,
        )

    def _try_acquire(self) -> None:
        now = time.time()
        if not self.exclusive:
            self.started_at, self.expires_at = now, now + self.ttl_s
            return
        storage = self.dataset.storage
        tagged = storage.read_tagged(LEASE_KEY)
        current = LeaseRecord.from_bytes(tagged[0]) if tagged else None
        if current is not None and current.session == self.id and not current.released:
            # An earlier take by this session landed but its reply was lost.
            self._tag, self.epoch = tagged[1], current.epoch
            self.started_at, self.expires_at = current.acquired_at, current.expires_at
            self.took_over = current.took_over
            return
        if current is not None and current.live(now):
            raise LeaseHeld(
                f"{self.dataset.uri} is being written by {current.describe(now)}; "
                "wait for it to finish (refresh --wait-for-lease S) or stop it first"
            )
        self.started_at = now
        self.took_over = current.session if current is not None and not current.released else None
        record = self._record(now, (current.epoch if current else 0) + 1)
        try:
            self._tag = storage.put_if_match(
                LEASE_KEY, record.to_bytes(), tagged[1] if tagged else None
            )
        except PreconditionFailed:
            other = read_lease(self.dataset)
            if other is not None and other.session == self.id:
                return self._try_acquire()  # ours after all (a retried put)
            holder = other.describe() if other else "another driver"
            raise LeaseHeld(f"{self.dataset.uri} was just taken by {holder}") from None
        self.epoch, self.expires_at = record.epoch, record.expires_at
        if self.took_over is not None:
            log.warning("took over an expired lease from %s", current.describe(now))

    def _put_lease(self, record: LeaseRecord) -> bool:
        """Compare-and-swap the lease to `record`; False if another session holds it."""
        storage = self.dataset.storage
        try:
            self._tag = storage.put_if_match(LEASE_KEY, record.to_bytes(), self._tag)
            return True
        except PreconditionFailed:
            if not self._adopt():
                return False
        self._tag = storage.put_if_match(LEASE_KEY, record.to_bytes(), self._tag)
        return True

    def _adopt(self) -> bool:
        """After a failed precondition: take the lease's tag if the record is still ours."""
        tagged = self.dataset.storage.read_tagged(LEASE_KEY)
        if tagged is None:
            return False
        current = LeaseRecord.from_bytes(tagged[0])
        if current.session != self.id or current.epoch != self.epoch:
            return False
        log.info("lease put of session %s landed without its reply: adopting its tag", self.id)
        self._tag = tagged[1]
        return True

    def _seal(self) -> None:
        """After a takeover: publish an empty version, so the old holder's prepared commit
        names a version number that exists and the store's create-only put refuses it."""
        from pipeline.table.errors import CommitConflict, DatasetError

        for _ in range(10):
            latest = self.dataset.latest_version()
            if latest is None:
                return  # nothing to build on; the first commit is create-only anyway
            try:
                self.dataset.commit(
                    [], parent_version=latest, fence=self.check, session=self.id, fencing=True
                )
                return
            except CommitConflict:
                continue  # the old holder's late commit landed first: seal on top of it
            except DatasetError as err:
                log.warning("could not publish the fencing version: %s", err)
                return
        raise LeaseLost(f"{self.dataset.uri}: could not publish a fencing version (contention)")

    def _write_session_record(self) -> None:
        record = SessionRecord(
            self.id,
            self.owner,
            self.started_at,
            self.expires_at,
            ttl_s=self.ttl_s,
            store_started_at=self.store_started_at,
        )
        key = f"{SESSIONS_PREFIX}{self.id}.json"
        with self.dataset.storage.open_write(key) as fh:
            fh.write(json.dumps(asdict(record)).encode())
        if self._first_write is None:
            self._first_write = time.monotonic()
        if self.store_started_at is None:  # the start as the store stamped it, for gc
            try:
                written = self.dataset.storage.info(key).mtime
            except OSError as err:  # the next heartbeat tries again
                log.warning("could not read back session record %s: %s", key, err)
                return
            # Minus the time since the first write (this process's own clock: durations
            # only, so no skew), and a second for the store's timestamp granularity.
            self.store_started_at = written - (time.monotonic() - self._first_write) - 1.0

    def renew(self) -> None:
        """One heartbeat: push the expiry forward (lease by compare-and-swap, then the record)."""
        with self._lock:
            if self._lost:
                return
            now = time.time()
            if self.exclusive and not self._put_lease(self._record(now, self.epoch)):
                other = read_lease(self.dataset)
                self._lost = f"taken over by {other.describe() if other else 'another driver'}"
                log.error("lease lost session=%s: %s", self.id, self._lost)
                return
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
        """Stop heartbeats, release the lease if it is still ours, remove the session record."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            if self.exclusive and self.epoch:
                self._release()
            try:
                self.dataset.storage.delete(f"{SESSIONS_PREFIX}{self.id}.json")
            except FileNotFoundError:
                pass

    def _release(self, num_attempts: int = 3) -> None:
        record = self._record(time.time(), self.epoch, released=True)
        for attempt in range(1, num_attempts + 1):
            try:
                if not self._put_lease(record):
                    return  # someone took it over: nothing of ours to release
                self._tag = None
                return
            except Exception as err:  # a lost reply or a flaky store: the lease expires anyway
                if attempt == num_attempts:
                    log.warning("could not release the lease of session %s: %s", self.id, err)
                    return
                time.sleep(0.1 * attempt)


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
