"""The writer lease, write sessions and pins, on local disk and on the loopback S3 server."""

from __future__ import annotations

import threading
import time

import pytest
from shards.helpers import assert_exactly_once, write_unit

from pipeline.table import lease
from pipeline.table.dataset import Dataset
from pipeline.table.errors import CommitConflict
from pipeline.table.gc import gc_dataset, live_sessions
from pipeline.table.lease import (
    LeaseHeld,
    LeaseLost,
    WriteSession,
    lease_holder,
    read_lease,
)


def test_one_holder_at_a_time_and_the_second_names_the_first(root):
    ds = Dataset.open(root)
    with WriteSession(ds, owner="nightly refresh") as first:
        assert lease_holder(ds).session == first.id
        assert [s.session for s in live_sessions(ds)] == [first.id]
        with pytest.raises(LeaseHeld, match=rf"nightly refresh \(session {first.id}, host .*pid"):
            WriteSession(ds, owner="second").start()
        first.check()  # the holder may publish
    assert lease_holder(ds) is None and live_sessions(ds) == []
    with WriteSession(ds, owner="next") as nxt:
        assert read_lease(ds).epoch == 2 and read_lease(ds).session == nxt.id


def test_racing_takers_exactly_one_wins(root):
    barrier, won, held = threading.Barrier(4), [], []

    def take(i: int) -> None:
        session = WriteSession(Dataset.open(root), owner=f"taker {i}")
        barrier.wait()
        try:
            session.start()
            won.append(session)
        except LeaseHeld as err:
            held.append(err)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(held) == 3
    won[0].close()


def test_an_expired_lease_is_taken_over_and_fences_its_old_holder(root, monkeypatch):
    monkeypatch.setattr(lease, "CLOCK_MARGIN_S", 0.2)
    ds = Dataset.open(root)
    old = WriteSession(ds, owner="paused", ttl_s=0.6)
    old.start()
    old._stop.set()  # its heartbeats stop (a paused or partitioned driver)
    with pytest.raises(LeaseHeld):
        WriteSession(ds, owner="early").start()
    new = WriteSession(ds, owner="taker", ttl_s=30).start(wait_s=5, poll_s=0.1)
    assert read_lease(ds).session == new.id and read_lease(ds).epoch == 2
    with pytest.raises(LeaseLost, match="published nothing"):
        old.check()  # expired by its own clock
    old.expires_at = time.time() + 60  # even if its clock were behind:
    old.renew()  # the renewal finds another holder
    with pytest.raises(LeaseLost, match="taken over by taker"):
        old.check()
    old.close()  # releases nothing of the new holder's
    assert read_lease(ds).session == new.id and not read_lease(ds).released
    info, _ = write_unit(ds, "unit-a", 1)
    with pytest.raises(LeaseLost):
        ds.commit([info], fence=old.check)
    assert ds.latest_version() is None
    assert ds.commit([info], fence=new.check).version == 1
    new.close()


def test_heartbeats_keep_a_long_run_alive(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "CLOCK_MARGIN_S", 0.1)
    ds = Dataset.open(tmp_path / "ds")
    with WriteSession(ds, owner="long", ttl_s=0.6) as session:
        time.sleep(1.5)  # more than twice the ttl
        session.check()
        assert lease_holder(ds).session == session.id


class _LostReplies:
    """A store whose next `num` conditional puts of the lease land but lose their reply."""

    def __init__(self, storage) -> None:
        self._storage, self.num = storage, 0

    def __getattr__(self, name):
        return getattr(self._storage, name)

    def put_if_match(self, key, data, tag):
        result = self._storage.put_if_match(key, data, tag)
        if key == lease.LEASE_KEY and self.num > 0:
            self.num -= 1
            raise ConnectionResetError(104, "injected: the reply was lost")
        return result


def test_a_lease_put_whose_reply_was_lost_is_adopted_not_lost(root):
    store = _LostReplies(Dataset.open(root).storage)
    ds = Dataset(store)
    session = WriteSession(ds, owner="multi-day regeneration", ttl_s=60)
    store.num = 1
    with pytest.raises(ConnectionResetError):
        session.start()  # the take landed, its answer did not
    session.start()  # a retry finds its own record and goes on
    assert read_lease(ds).session == session.id
    store.num = 1
    with pytest.raises(ConnectionResetError):
        session.renew()  # the renewal landed, its answer did not
    session.renew()  # the next one finds its own record: adopted, not "taken over"
    session.check()
    info, _ = write_unit(ds, "unit-a", 2)
    assert ds.commit([info], fence=session.check).version == 1
    store.num = 1
    session.close()  # the release's reply is lost too: close tries again
    assert read_lease(ds).released and read_lease(ds).session == session.id
    with WriteSession(ds, owner="next") as nxt:  # and the next writer takes it at once
        assert read_lease(ds).session == nxt.id


@pytest.mark.parametrize("gc_in_the_pause", [False, True], ids=["no gc", "gc in the pause"])
def test_a_zombie_commit_after_a_takeover_is_refused_by_the_store(
    root, monkeypatch, gc_in_the_pause
):
    """The old holder passes its clock fence, pauses past its lease, then puts its root.
    With gc --keep-versions 1 in the pause, the fencing version is retired, not deleted:
    its number stays taken and the zombie's put is still refused."""
    monkeypatch.setattr(lease, "CLOCK_MARGIN_S", 0.2)
    zombie_ds, ds = Dataset.open(root), Dataset.open(root)
    old = WriteSession(zombie_ds, owner="paused", ttl_s=0.6).start()
    first, first_samples = write_unit(zombie_ds, "unit-a", 2)
    zombie_ds.commit([first], fence=old.check)
    old._stop.set()  # its heartbeats stop
    late, _ = write_unit(zombie_ds, "unit-b", 2)
    paused, resume, outcome = threading.Event(), threading.Event(), []

    def fence():
        old.check()  # still inside its lease by its own clock...
        paused.set()
        resume.wait(10)  # ...then a stop-the-world pause past it

    def zombie():
        try:
            outcome.append(zombie_ds.commit([late], parent_version=1, fence=fence))
        except Exception as err:
            outcome.append(err)

    thread = threading.Thread(target=zombie)
    thread.start()
    paused.wait(10)
    new = WriteSession(ds, owner="successor", ttl_s=30).start(wait_s=5, poll_s=0.1)
    planned_on = ds.latest_version()  # the successor plans its commit...
    own, own_samples = write_unit(ds, "unit-c", 2)
    if gc_in_the_pause:  # the successor commits and gc retires everything older, first
        published = ds.commit([own], parent_version=planned_on, fence=new.check)
        report = gc_dataset(root, keep_versions=1, min_age_s=0, unsafe_min_age=True, delete=True)
        assert planned_on in report.expired
    resume.set()  # ...the zombie wakes and puts its root...
    thread.join(10)
    if not gc_in_the_pause:
        published = ds.commit([own], parent_version=planned_on, fence=new.check)  # no conflict
    assert isinstance(outcome[0], CommitConflict), f"the zombie got {outcome[0]!r}"
    fresh = Dataset.open(root)
    live = [v for v in fresh.versions() if v not in fresh.retired_versions()]
    sessions = [fresh.manifest(v).commit.get("session") for v in live]
    assert old.id not in sessions[1:] and published.version == fresh.latest_version()
    assert {e.path for e in fresh.manifest().shards} == {first.path, own.path}
    assert_exactly_once(root, first_samples + own_samples)
    new.close()
    old.close()


class _SkewedTime:
    """The writer's clock, `offset_s` off the store's (durations and sleeps are real)."""

    def __init__(self, offset_s: float) -> None:
        self.offset_s = offset_s

    def time(self) -> float:
        return time.time() + self.offset_s

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.mark.parametrize("offset_s", [30.0, -90.0], ids=["30 s ahead", "90 s behind"])
def test_a_skewed_writer_clock_changes_nothing_gc_decides(root, monkeypatch, offset_s):
    """gc judges sessions and files on the store's clock: a live writer whose clock is off
    keeps its uncommitted shard through gc, and its commit lands."""
    ds = Dataset.open(root)
    first, committed = write_unit(ds, "unit-a", 2)
    ds.commit([first])
    monkeypatch.setattr(lease, "time", _SkewedTime(offset_s))
    with WriteSession(ds, owner="skewed writer", ttl_s=60) as session:
        waiting, samples = write_unit(ds, "unit-b", 3)  # finished, waiting for its commit
        report = gc_dataset(root, min_age_s=0, unsafe_min_age=True, delete=True)
        assert [o.key for o in report.in_flight] == [waiting.path] and report.garbage == ()
        assert ds.commit([waiting], fence=session.check).version == 2
    assert_exactly_once(root, committed + samples)
