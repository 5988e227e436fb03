"""A bounded soak of the dataset's lifecycle, everything at once (marker `soak`, `make chaos`).

On the loopback S3 server with a share of S3 calls failing (tests/faults.py):

* two writers, a regeneration (adds new units) and a refresh (replaces a
  live shard by a new file holding the same samples), compete for the lease
  through `WriteSession`; each now and then pauses past its lease, either
  holding it (its heartbeats stop with it) or between its fence and its
  commit point (the zombie of docs/RELIABILITY.md);
* a following reader (a training run's shape: pins where it starts, follows
  every version in turn, reads every sample, releases its pins and starts
  again), an exporter (`export_dataset` of the latest version) and gc
  (`keep_versions=1`, deleting) every few seconds;
* a share of the `_latest` puts fails past every retry (the commit stands,
  readers probe past the pointer), and the writers' clocks run 30 s ahead of
  the store's (gc judges on the store's clock). gc's minimum age and the
  commit bound (retention.py) are scaled down with the lease, in the same
  order: pauses < commit bound < gc's minimum age.

A checker takes every published version in turn (pinned while it looks)
and checks: every pinned version readable; no sample twice in a version; no
sample of the previous version lost; the committing sessions' lease epochs
never go back (two sessions never both commit under the lease); and no
reader, exporter or gc call failed. At the end every sample of every commit
that reported success is read back from the newest version, exactly once. The plan (who pauses, when, for how
long, what each commit holds) is drawn from seeded generators; thread
timing is not, so the figures vary from run to run, the invariants do not.

It is not in `make test` (pyproject deselects the marker); `make chaos`
runs it and records its figures in docs/RELIABILITY.md. DSPARK_SOAK_S sets
its length (default 120 s).
"""

# ruff: noqa: F811  (fixtures imported from s3_server are redefined as arguments)

from __future__ import annotations

import errno
import json
import os
import random
import threading
import time
from collections import Counter

import pytest
from faults import Faults, install_faults
from reliability import record
from s3_server import moto_endpoint, s3_uri  # noqa: F401  (fixtures)
from shards.helpers import write_unit

from pipeline.table import lease, retention
from pipeline.table.dataset import Dataset
from pipeline.table.errors import CommitConflict, DatasetError
from pipeline.table.export import export_dataset
from pipeline.table.gc import gc_dataset
from pipeline.table.layout import LATEST_KEY, manifest_key
from pipeline.table.lease import LeaseHeld, LeaseLost, WriteSession
from pipeline.table.pins import read_pins, release_pins, version_pin
from pipeline.table.publish import StaleCommit
from pipeline.table.reader import ShardReader

SEED = 32
SOAK_S = float(os.environ.get("DSPARK_SOAK_S", "120"))
TTL_S = 1.5  # the writers' lease
MARGIN_S = 0.5  # lease.CLOCK_MARGIN_S for this test
PAUSE_P = 0.12  # share of a writer's steps that pause past its lease
FAULT_RATE = 0.03
GC_EVERY_S, EXPORT_EVERY_S = 3.0, 4.0
COMMIT_BOUND_S = 6.0  # retention.MAX_COMMIT_AGE_S here: longer than any pause
MIN_AGE_S = 8.0  # gc's minimum age: above the commit bound (retention.py)
POINTER_DOWN_P = 0.2  # share of `_latest` puts that fail past every retry
WRITER_CLOCK_S = 30.0  # the writers' clocks, ahead of the store's

pytestmark = pytest.mark.soak


class Soak:
    def __init__(self, uri: str, tmp_path) -> None:
        self.uri, self.tmp = uri, tmp_path
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.counts: Counter[str] = Counter()
        self.epoch_of: dict[str, int] = {}  # session -> lease epoch
        self.committed: set[str] = set()  # sample ids of every commit that returned

    def violation(self, what: str) -> None:
        with self.lock:
            self.violations.append(what)

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    # ------------------------------------------------------------------ writers

    def writer(self, name: str) -> None:
        rng = random.Random(f"{SEED}-{name}")
        ds = Dataset.open(self.uri)
        unit = 0
        while not self.stop.is_set():
            session = WriteSession(ds, owner=name, ttl_s=TTL_S)
            try:
                session.start(wait_s=4 * TTL_S, poll_s=0.1)
            except LeaseHeld:
                continue
            with self.lock:
                self.epoch_of[session.id] = session.epoch
                self.counts["sessions"] += 1
                self.counts["takeovers"] += session.took_over is not None
            try:
                for _ in range(rng.randint(1, 5)):
                    if self.stop.is_set():
                        break
                    pause = rng.random() < PAUSE_P
                    where = rng.choice(["holding", "at the fence"]) if pause else None
                    pause_s = TTL_S + MARGIN_S + rng.uniform(0.3, 1.5)
                    if where == "holding":
                        self._pause(session, pause_s)
                    fence = session.check
                    if where == "at the fence":

                        def fence(session=session, pause_s=pause_s):
                            session.check()
                            self._pause(session, pause_s)

                    if name == "refresh" and rng.random() < 0.7:
                        self._refresh(ds, session, rng, fence)
                    else:
                        unit += 1
                        self._regenerate(ds, session, f"{name}-{unit:04d}", rng, fence)
                    if where is not None:
                        break  # a paused driver's heartbeats are gone: it ends its session
                    time.sleep(rng.uniform(0.1, 0.4))
            except (LeaseLost, CommitConflict, DatasetError) as err:
                self.count(f"refused: {type(err).__name__}")
                if isinstance(err, StaleCommit) and "restores version" in str(err):
                    self.count("late commits replaced by a copy")
            finally:
                session.close()

    def _pause(self, session: WriteSession, seconds: float) -> None:
        session._stop.set()  # a stopped process: its heartbeat thread stops too
        self.count("pauses past the lease")
        time.sleep(seconds)

    def _commit(self, ds, session, shards, fence, **kwargs) -> None:
        ds.commit(shards, fence=fence, session=session.id, **kwargs)
        ids = {sid for info in shards for sid, *_ in info.samples}
        with self.lock:
            self.committed |= ids
            self.counts["commits"] += 1

    def _regenerate(self, ds, session, unit: str, rng, fence) -> None:
        shards = [write_unit(ds, unit, rng.randint(2, 5))[0]]
        self._commit(ds, session, shards, fence)

    def _refresh(self, ds, session, rng, fence) -> None:
        latest = ds.latest_version()
        if latest is None:
            return
        manifest = ds.manifest(latest)
        if not manifest.shards:
            return
        old = rng.choice(manifest.shards)
        if old.dropped:
            return
        new, _ = write_unit(ds, old.unit_id, old.rows)  # the same samples, a new file
        self._commit(ds, session, [new], fence, remove=[old.path], parent_version=latest)

    # ------------------------------------------------------------------ readers

    def follower(self) -> None:
        """A training run's shape: pin where it starts (and what follows), read every
        version in turn, release at its end, start again on the newest."""
        ds = Dataset.open(self.uri)
        run = 0
        while not self.stop.is_set():
            start = ds.latest_version()
            if start is None:
                time.sleep(0.2)
                continue
            run += 1
            prefix = f"soak-run-{run}."
            try:
                ds.pin(start, version_pin(prefix, start), owner="follower", following=True)
            except DatasetError:
                self.count("follower pins refused (version retired first)")
                continue
            version = start
            try:
                while version < start + 6 and not self.stop.is_set():
                    if not _replaced(ds, version):  # a late commit's copy stands in for it
                        self._read_all(ds, version)
                        self.count("versions followed")
                    while ds.latest_version() == version and not self.stop.is_set():
                        time.sleep(0.1)
                    version += 1
                    if version <= (ds.latest_version() or 0):
                        ds.pin(version, version_pin(prefix, version), owner="follower")
            except Exception as err:
                if not _replaced(ds, version, wait_s=10):  # read before its copy landed
                    self.violation(f"follower, version {version}: {type(err).__name__}: {err}")
            finally:
                release_pins(ds, prefix)

    def _read_all(self, ds, version: int) -> None:
        reader = ShardReader(ds, version=version, prefetch=0)
        rows = sum(1 for _ in reader)
        if rows != reader.manifest.num_rows:
            self.violation(
                f"version {version}: read {rows} rows, it holds {reader.manifest.num_rows}"
            )

    def exporter(self) -> None:
        n = 0
        while not self.stop.wait(EXPORT_EVERY_S):
            n += 1
            try:
                export_dataset(self.uri, self.tmp / f"export-{n}", format="speculators")
                self.count("exports")
            except DatasetError as err:
                if "retired by gc" in str(err):  # retired between "latest" and its pin
                    self.count("export pins refused (version retired first)")
                else:
                    self.violation(f"export {n}: {err}")
            except Exception as err:
                self.violation(f"export {n}: {type(err).__name__}: {err}")

    def collector(self) -> None:
        while not self.stop.wait(GC_EVERY_S):
            try:
                report = gc_dataset(
                    self.uri, keep_versions=2, delete=True, min_age_s=MIN_AGE_S, unsafe_min_age=True
                )
            except Exception as err:
                self.violation(f"gc: {type(err).__name__}: {err}")
                continue
            self.count("gc runs")
            self.count("gc: files deleted", len(report.garbage))
            self.count("gc: versions retired", len(report.expired))
            self.count("gc: pins honoured", len(report.pins))

    # ------------------------------------------------------------------ invariants

    def checker(self) -> None:
        ds = Dataset.open(self.uri)
        version, previous, max_epoch = 0, set(), 0
        while True:
            stopping = self.stop.is_set()
            latest = ds.latest_version() or 0
            if version >= latest:
                if stopping:
                    return
                time.sleep(0.1)
                continue
            version += 1
            try:
                # Pinned (with every later version) from before it can be retired: the
                # first pin is written before any version exists.
                if version > 1:
                    ds.pin(version, version_pin("soak-checker.", version), following=True)
                    release_pins(ds, f"soak-checker.v{version - 1:06d}")
                if _replaced(ds, version):
                    self.count("versions replaced by a copy (checked as their copy)")
                    continue
                previous, max_epoch = self._check(ds, version, previous, max_epoch)
                self.count("versions checked")
            except Exception as err:
                if _replaced(ds, version, wait_s=10):  # read before its copy landed
                    self.count("versions replaced by a copy (checked as their copy)")
                    continue
                self.violation(f"checker, version {version}: {type(err).__name__}: {err}")

    def _check(self, ds, version: int, previous: set[str], max_epoch: int):
        manifest = ds.manifest(version)
        live: Counter[str] = Counter()
        for entry in manifest.shards:
            dropped = set(entry.dropped)
            live.update(s for s, _ in ds.sample_index(entry).members() if s not in dropped)
        twice = [s for s, n in live.items() if n > 1]
        if twice:
            self.violation(f"version {version} lists {twice[:3]} more than once")
        lost = previous - set(live)
        if lost:
            self.violation(f"version {version} lost {sorted(lost)[:3]} of version {version - 1}")
        session = manifest.commit.get("session")
        for _ in range(100):  # a fencing version lands before its session's start() returns
            with self.lock:
                epoch = self.epoch_of.get(session)
            if epoch is not None or session is None:
                break
            time.sleep(0.05)
        epoch = epoch or 0
        if session is not None and epoch < max_epoch:
            self.violation(
                f"version {version} committed under lease epoch {epoch} after epoch {max_epoch}"
            )
        if manifest.commit.get("fencing"):
            self.count("fencing versions")
        rng = random.Random(f"{SEED}-check-{version}")
        for pin in read_pins(ds):
            try:  # its root, its segments and a sample of its shards and sidecars
                pinned = ds.manifest(pin.version)
                ds.storage.info(f"manifests/v{pin.version:06d}.json")
                for ref in pinned.segments:
                    ds.storage.info(ref.key)
                for entry in rng.sample(pinned.shards, min(4, len(pinned.shards))):
                    ds.storage.info(entry.path)
                    ds.storage.info(entry.sidecar)
            except (DatasetError, FileNotFoundError) as err:
                if any(p.name == pin.name for p in read_pins(ds)):  # still pinned
                    self.violation(f"pinned version {pin.version} ({pin.name}): {err}")
        return set(live), max(max_epoch, epoch)


def _replaced(ds, version: int, wait_s: float = 0.0) -> bool:
    """Whether the next version is (within `wait_s`) a copy published over `version`: a
    commit that landed late and found its files gone. Readers are meant to skip it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            root = json.loads(ds.storage.read_bytes(manifest_key(version + 1)))
            return root.get("commit", {}).get("reverts") == version
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)


class _PointerDown:
    """`_latest` puts that fail past every retry, a share `POINTER_DOWN_P` of them."""

    def __init__(self) -> None:
        self.rng, self.lock, self.num = random.Random(f"{SEED}-pointer"), threading.Lock(), 0

    def install(self, monkeypatch) -> None:
        from pipeline.storage.s3 import S3Storage

        real = S3Storage.put_if_match

        def put_if_match(storage, key, data, tag):
            with self.lock:
                down = key == LATEST_KEY and self.rng.random() < POINTER_DOWN_P
                self.num += down
            if down:
                raise OSError(errno.EIO, "injected: InternalError on _latest after 5 tries")
            return real(storage, key, data, tag)

        monkeypatch.setattr(S3Storage, "put_if_match", put_if_match)


class _WriterClock:
    """The lease module's clock, `WRITER_CLOCK_S` ahead of the store's."""

    def time(self) -> float:
        return time.time() + WRITER_CLOCK_S

    def __getattr__(self, name):
        return getattr(time, name)


def test_the_lifecycle_holds_with_everything_at_once(s3_uri, moto_endpoint, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setattr(lease, "CLOCK_MARGIN_S", MARGIN_S)
    monkeypatch.setattr(lease, "time", _WriterClock())
    monkeypatch.setattr(retention, "MAX_COMMIT_AGE_S", COMMIT_BOUND_S)
    monkeypatch.setattr(retention, "GC_REREAD_S", 1.0)
    faults = Faults(rate=FAULT_RATE, seed=SEED, max_in_a_row=2)
    install_faults(monkeypatch, faults)
    pointer = _PointerDown()
    pointer.install(monkeypatch)
    soak = Soak(s3_uri, tmp_path)
    Dataset.open(s3_uri).storage.put_if_absent(
        "_pins/soak-checker.v000001.json",
        b'{"version": 1, "owner": "checker", "expires_at": null, "following": true}',
    )
    actors = [
        threading.Thread(target=soak.writer, args=("regenerate",), name="regenerate"),
        threading.Thread(target=soak.writer, args=("refresh",), name="refresh"),
        threading.Thread(target=soak.follower, name="follower"),
        threading.Thread(target=soak.exporter, name="exporter"),
        threading.Thread(target=soak.collector, name="gc"),
    ]
    checker = threading.Thread(target=soak.checker, name="checker")
    started = time.monotonic()
    for thread in [*actors, checker]:
        thread.start()
    time.sleep(SOAK_S)
    soak.stop.set()
    for thread in [*actors, checker]:
        thread.join(120)
    assert not any(t.is_alive() for t in [*actors, checker]), "an actor did not stop"
    seconds = time.monotonic() - started
    faults.enabled = False
    ds = Dataset.open(s3_uri)
    read = [s.sample_id for s in ShardReader(ds, prefetch=0)]  # every committed sample, once
    lost, twice = soak.committed - set(read), len(read) - len(set(read))
    if lost or twice:
        soak.violation(f"{len(lost)} committed samples lost, {twice} read twice at the end")
    c = soak.counts
    figures = dict(
        seconds=round(seconds, 1),
        versions_published=ds.latest_version(),
        versions_checked=c["versions checked"],
        commits=c["commits"],
        commits_refused=sum(v for k, v in c.items() if k.startswith("refused")),
        faults_injected=faults.num_injected + pointer.num,
        pointer_puts_failed=pointer.num,
        s3_calls=faults.num_calls,
        pauses_past_the_lease=c["pauses past the lease"],
        takeovers=c["takeovers"],
        fencing_versions=c["fencing versions"],
        gc_runs=c["gc runs"],
        gc_files_deleted=c["gc: files deleted"],
        gc_versions_retired=c["gc: versions retired"],
        gc_pins_honoured=c["gc: pins honoured"],
        versions_followed=c["versions followed"],
        exports=c["exports"],
        late_commits_replaced=c["late commits replaced by a copy"],
        samples_committed=len(soak.committed),
        samples_verified=len(set(read) & soak.committed),
        violations=len(soak.violations),
    )
    record("soak", "lifecycle soak", **figures)
    print(figures)
    assert soak.violations == [], soak.violations[:10]
    replaced = c["versions replaced by a copy (checked as their copy)"]
    assert figures["versions_checked"] + replaced == figures["versions_published"]
    assert figures["takeovers"] >= 1 and figures["gc_runs"] >= 3 and figures["exports"] >= 1
    assert figures["faults_injected"] > 0 and figures["versions_followed"] > 0
