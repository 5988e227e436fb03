"""The write-back process's own side: its main loop, and each message from the replica handled.

`ProcessWriteback` (writeback_process.py) starts `child_main` in a spawned
process. It runs a `ShardWriteback` (built on `Bind`, once the replica has
placed this process), answers each `Finish` with `Written` or `Failed` from
one sender thread, and exits with its parent (a SIGKILLed replica leaves no
writer behind). The messages are those of writeback_messages.py.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeline.regenerate.replica.writeback import Ledger, ShardWriteback, WritebackConfig
from pipeline.regenerate.replica.writeback_messages import (
    Add,
    Batch,
    Bind,
    Close,
    Discard,
    Failed,
    Finish,
    FromChild,
    Open,
    Stopped,
    ToChild,
    WritebackFailed,
    Written,
)

if TYPE_CHECKING:
    from pipeline.shards.schema import Provenance


def child_main(
    config: WritebackConfig,
    spill_above_bytes: int | None,
    ledger_values,
    inbox,
    outbox,
    parent: int,
) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    if config.nice:
        os.nice(config.nice)
    from pipeline.logs import setup_logging

    setup_logging()
    # What the first sample needs, imported now, while the engine starts.
    import pipeline.regenerate.replica.pending  # noqa: F401
    import pipeline.shards.codecs  # noqa: F401  (torch, zstandard)
    import pipeline.shards.writer  # noqa: F401
    import pipeline.table.dataset  # noqa: F401  (pyarrow, storage)
    import pipeline.targets.capture_rows  # noqa: F401  (the spool, opened on Bind)

    replies: queue.SimpleQueue = queue.SimpleQueue()
    sender = threading.Thread(target=_send_replies, args=(replies, outbox), daemon=True)
    sender.start()
    child = _Child(config, spill_above_bytes, Ledger(ledger_values), replies.put)
    try:
        while child.handle(inbox.get()):
            pass
    finally:
        child.close()
        replies.put(Stopped())
        sender.join(timeout=30)


class _Child:
    """The child's side: each message from the replica, handled in order (by its type)."""

    def __init__(
        self,
        config: WritebackConfig,
        spill_above_bytes: int | None,
        ledger: Ledger,
        reply: Callable[[FromChild], None],
    ) -> None:
        self.config = config
        self.spill_above_bytes = spill_above_bytes
        self.ledger = ledger
        self.reply = reply  # thread-safe: write workers call it as their units finish
        self.writeback: ShardWriteback | None = None  # made on Bind, once placed
        self.contract: Any = None  # the engine's spool, opened on Bind
        self.provenance: dict[str, Provenance] = {}  # per open unit

    def handle(self, message: ToChild) -> bool:
        """Act on `message`; False once it is `Close`."""
        match message:
            case Batch(messages=messages):
                for each in messages:
                    self.handle(each)
            case Open(unit_id=unit_id, provenance=provenance):
                self.provenance[unit_id] = provenance
            case Add(unit_id=unit_id, sample=sample, where=where):
                self._bound().add(unit_id, sample, provenance=self.provenance[unit_id], where=where)
            case Discard(rows=rows):
                self._bound().discard(rows)
            case Finish(unit_id=unit_id, target=target, errors=errors):
                self.provenance.pop(unit_id, None)

                def done(written, error, unit_id=unit_id):
                    self.reply(
                        Written(unit_id, written) if error is None else Failed.of(unit_id, error)
                    )

                self._bound().finish(unit_id, target, errors, done)
            case Bind(contract=contract):
                self._bind(contract)
            case Close():
                return False
            case _:
                raise TypeError(f"the write-back process got {message!r}: not a message to it")
        return True

    def _bind(self, contract: Any) -> None:
        from pipeline.targets.capture_rows import open_spool

        self.contract = contract
        if contract is not None:
            open_spool(contract, follow=True)  # the samples' SpooledRows read it from here
        cpus = _num_cpus()
        # More encode threads than CPUs to run them on only contend; on one
        # CPU this thread does the work itself.
        workers = min(self.config.num_encode_workers, cpus)
        self.writeback = ShardWriteback(
            self.config.model_copy(update={"num_encode_workers": workers}),
            spill_above_bytes=self.spill_above_bytes,
            ledger=self.ledger,
            threads=cpus > 1,
        )

    def _bound(self) -> ShardWriteback:
        if self.writeback is None:
            raise WritebackFailed("the write-back got a sample before `bind`")
        return self.writeback

    def close(self) -> None:
        if self.writeback is not None:
            self.writeback.close()
        if self.contract is not None:
            from pipeline.targets.capture_rows import close_spool

            close_spool(self.contract)


def _num_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _send_replies(replies: queue.SimpleQueue, outbox) -> None:
    """One thread writes to the pipe, so callbacks from several write workers never interleave."""
    while True:
        message = replies.get()
        outbox.send(message)
        if isinstance(message, Stopped):
            return


def _exit_with_parent(parent: int) -> None:
    """Exit once the replica is gone (SIGKILLed: nothing else would tell this process)."""
    import time

    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)
