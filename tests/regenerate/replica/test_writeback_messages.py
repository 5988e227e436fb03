"""The write-back's messages: each one produced by its side, carried, and handled by the other.

The replica's side (`ProcessWriteback`) is watched at its real queue to the
child, whose real process handles what it sends; the child's side (`_Child`)
is also driven in this process, message by message, where a test needs to
see its state.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import time
from concurrent.futures import Future

import pytest
from shards.helpers import provenance

from pipeline.regenerate.replica.writeback import Ledger, ShardTarget, UnitWritten, WritebackConfig
from pipeline.regenerate.replica.writeback_child import _Child
from pipeline.regenerate.replica.writeback_messages import (
    Add,
    Batch,
    Bind,
    Close,
    Discard,
    Failed,
    Finish,
    Open,
    Stopped,
    WritebackFailed,
    Written,
)
from pipeline.regenerate.replica.writeback_process import ProcessWriteback
from pipeline.targets.base import CapturedStates, HeldRows

from .test_writeback_process import pending


class _Rows(HeldRows):
    """Rows that remember being released (in this process only)."""

    released = False

    def release(self) -> None:
        self.released = True


def _rows() -> _Rows:
    states = pending(0).generation.rows.states()
    return _Rows(CapturedStates(states.hidden_states, states.last_hidden_state))


def _done() -> tuple[Future, object]:
    future: Future = Future()

    def done(written, error):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(written)

    return future, done


def test_every_message_crosses_a_real_queue_unchanged(tmp_path):
    prov = provenance()
    target = ShardTarget(str(tmp_path), None, prov)
    sample = pending(3)
    messages = [
        Bind(None),
        Open("u-1", prov),
        Discard(HeldRows(sample.generation.rows.states())),
        Finish("u-1", target, ()),
        Batch((Open("u-1", prov), Finish("u-1", target, ()))),
        Close(),
        Failed("u-1", True, "ConnectionError: reset"),
        Stopped(),
    ]
    ctx = mp.get_context("spawn")
    carried = ctx.Queue()
    for message in messages:
        carried.put(message)
    back = [carried.get(timeout=30) for _ in messages]
    assert back[:2] == messages[:2] and back[3:] == messages[3:]
    assert type(back[2]) is Discard
    add = pickle.loads(pickle.dumps(Add("u-1", sample, "row 3")))
    assert (add.unit_id, add.where, add.sample.sample_id) == ("u-1", "row 3", sample.sample_id)
    carried.close()
    carried.join_thread()


def test_the_owner_sends_typed_messages_and_the_child_answers_them(tmp_path):
    """Bind alone; an engine step's Open, Add, Discard and Finish as one Batch; Written
    back for the unit; Close last, answered by Stopped (the child exits cleanly)."""
    process = ProcessWriteback(WritebackConfig())
    sent: list = []
    real_put = process._to_child.put

    def put(message, *args, **kwargs):
        sent.append(message)
        real_put(message, *args, **kwargs)

    process._to_child.put = put
    try:
        process.bind(None)
        prov = provenance()
        for i in (1, 0):
            process.add("u-1", pending(i), provenance=prov, where=f"row {i}")
        process.discard(HeldRows(pending(2).generation.rows.states()))
        future, done = _done()
        process.finish("u-1", ShardTarget(str(tmp_path / "ds"), None, prov), [], done)
        process.flush()
        written = future.result(timeout=120)
    finally:
        process.close()
    assert isinstance(written, UnitWritten) and written.shard.rows == 2
    assert [type(m) for m in sent] == [Bind, Batch, Close]
    assert [type(m) for m in sent[1].messages] == [Open, Add, Add, Discard, Finish]
    assert sent[1].messages[-1] == Finish("u-1", ShardTarget(str(tmp_path / "ds"), None, prov), ())
    process._listener.join(timeout=30)
    assert not process._listener.is_alive()  # it returned on Stopped
    assert process._process.exitcode == 0  # Close ended the loop; it was not killed


def test_a_failed_unit_comes_back_as_failed_and_is_rebuilt():
    transient = Failed.of("u-1", TimeoutError("slow put"))
    assert transient == Failed("u-1", True, "TimeoutError: slow put")
    assert isinstance(transient.error(), ConnectionError)  # the scheduler retries these
    lasting = Failed.of("u-2", PermissionError("denied"))
    assert not lasting.transient and isinstance(lasting.error(), WritebackFailed)
    assert str(lasting.error()) == "PermissionError: denied"


def test_the_child_handles_each_message_by_its_type(tmp_path):
    replies: list = []
    arrived = threading.Event()

    def reply(message):
        replies.append(message)
        arrived.set()

    child = _Child(WritebackConfig(), None, Ledger(), reply)
    with pytest.raises(WritebackFailed, match="before `bind`"):
        child.handle(Add("u-1", pending(0), "row 0"))
    assert child.handle(Bind(None)) and child.writeback is not None
    prov = provenance()
    rows = _rows()
    good = ShardTarget(str(tmp_path / "ds"), None, prov)
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    try:
        assert child.handle(
            Batch((Open("u-1", prov), Add("u-1", pending(0), "row 0"), Discard(rows)))
        )
        assert child.provenance == {"u-1": prov} and rows.released
        assert child.handle(Finish("u-1", good, ()))
        assert child.provenance == {}
        assert arrived.wait(timeout=120)
        assert type(replies[0]) is Written and replies[0].written.shard.rows == 1
        arrived.clear()
        child.handle(Open("u-2", prov))
        child.handle(Finish("u-2", ShardTarget(str(blocked / "ds"), None, prov), ()))
        assert arrived.wait(timeout=120)
        assert type(replies[1]) is Failed and replies[1].unit_id == "u-2"
        assert "file" in replies[1].text
        with pytest.raises(TypeError, match="not a message"):
            child.handle(Stopped())  # a reply is no message to the child
        assert child.handle(Close()) is False
    finally:
        child.close()


def test_the_owner_refuses_a_reply_it_does_not_know():
    process = ProcessWriteback(WritebackConfig())
    try:
        future, done = _done()
        process._done["u-1"] = done
        with pytest.raises(TypeError, match="not a reply"):
            process._resolve(Close())
        process._resolve(Failed("u-1", False, "ValueError: bad"))
        with pytest.raises(WritebackFailed, match="bad"):
            future.result(timeout=5)
        deadline = time.monotonic() + 5
        while process._done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process._done == {}
    finally:
        process.close()
