"""The replica's write-back in a process of its own, at a lower CPU priority than the engine.

Why a process: building, encoding and writing a sample is CPU work that the
replica does for every request, and the engine loop (`feeder.py`) is on the
critical path of every engine step. As threads of the replica, that work
shared the engine thread's GIL: each time the engine thread gave the GIL up
around an engine call, a write-back thread could keep it for a switch
interval, and a lowered thread priority turned that into priority
inversion. As a process, it holds no lock the engine thread wants, and the
kernel schedules it below the engine's processes (`nice`), so it runs on the
cycles they leave: the engine-core process spin-waits with `sched_yield`
between steps (docs/capture.md; the measurements are in bench/RESULTS.md).

The engine's process never touches the captured bytes: on `bind` the backend
hands the capture spool over (`hand_off_rows`), so its samples' rows are
`SpooledRows` handles, and this process reads the spool files itself
(`capture_rows.open_spool`) as it builds them. What crosses the pipe is
small: per sample its ids, tokens and rows handle; per unit its error
records and, back, its `ShardInfo`; the messages are the typed ones of
`writeback_messages.py`. Rows held in memory elsewhere (a backend
without a spool, such as the transformers reference) cross with their bytes.

Memory: the write-back's counters live in shared memory (`Ledger`), so the
feeder reads what is held there without asking; bytes sent and not yet
counted there are in transit, and count too. The child exits once the replica is
gone (it watches its parent), so a SIGKILLed replica leaves no writer behind.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
from typing import TYPE_CHECKING, Any

from pipeline.logs import kv
from pipeline.regenerate.replica.writeback import (
    LEDGER_FIELDS,
    Done,
    Ledger,
    ShardTarget,
    ShardWriteback,
    Writeback,
    WritebackConfig,
    WritebackStats,
)
from pipeline.regenerate.replica.writeback_child import child_main
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
    from collections.abc import Callable, Sequence

    from pipeline.corpus.records import RowError
    from pipeline.regenerate.replica.pending import PendingSample
    from pipeline.shards.schema import Provenance
    from pipeline.targets.base import CapturedRows, StreamingBackend

log = logging.getLogger(__name__)


class ProcessWriteback:
    """A `ShardWriteback` in a child process: a `Writeback` (see the module docstring).

    `config.nice`: the child's nice value above this process's. Its CPUs are
    this process's when it starts; the replica's CPU placement moves it with
    the rest of the host work (cpu_host.py).
    """

    def __init__(
        self,
        config: WritebackConfig | None = None,
        *,
        spill_above_bytes: int | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        config = config or WritebackConfig()
        ctx = mp.get_context("spawn")  # no fork of a process that holds an engine and threads
        self._ledger = Ledger(ctx.RawArray("d", len(LEDGER_FIELDS)))
        # To the child: a Queue, whose put never blocks the engine thread (a thread of
        # this process writes the pipe). Back: a one-way pipe this process only reads,
        # so the child's death is an EOF here.
        self._to_child: Any = ctx.Queue()
        self._to_child.cancel_join_thread()  # never hang this process's exit on a dead child
        self._from_child, writer = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=child_main,
            args=(
                config,
                spill_above_bytes,
                self._ledger.values,
                self._to_child,
                writer,
                os.getpid(),
            ),
            name="dspark-writeback",
            daemon=True,
        )
        self._process.start()
        writer.close()
        self._backend: StreamingBackend | None = None  # whose rows were handed over
        self._sent_bytes = 0  # raw bytes of every sample sent to the child
        self._batch: list[Open | Add | Discard | Finish] = []  # waiting for flush()
        self._opened: set[str] = set()  # units whose provenance the child has
        self._done: dict[str, Done] = {}
        self._done_lock = threading.Lock()
        self._failed: BaseException | None = None
        self._closing = False
        self._on_fatal = on_fatal
        self._listener = threading.Thread(
            target=self._listen, name="writeback-results", daemon=True
        )
        self._listener.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def bind(
        self,
        backend: StreamingBackend | None,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Take over `backend`'s capture spool, where it has one (then its rows stay there
        and the child reads them), and the owner's fatal-error hook. The replica starts
        this process before its engine, so its imports overlap the engine's start, and
        binds it once the engine is up and the process placed."""
        if on_fatal is not None:
            self._on_fatal = on_fatal
        contract = backend.hand_off_rows() if backend is not None else None
        if contract is not None:
            self._backend = backend
        self._send(Bind(contract))

    # ------------------------------------------------------------------ counters

    @property
    def nbytes(self) -> int:
        """Held in the child, plus sent and not yet counted there (read in that order: an
        update between the two reads counts twice, never not at all)."""
        received = self._ledger["received_bytes"]
        held = self._ledger["nbytes"]
        return int(held + (self._sent_bytes - received))

    def stats(self) -> WritebackStats:
        ledger = self._ledger
        return WritebackStats(
            nbytes=self.nbytes,
            peak_nbytes=int(ledger["peak_nbytes"]),
            encode_seconds=ledger["encode_seconds"],
            encoded_bytes=int(ledger["encoded_bytes"]),
            spilled_bytes=int(ledger["spilled_bytes"]),
            pid=self._process.pid,
        )

    # ------------------------------------------------------------------ the Writeback interface

    def add(
        self, unit_id: str, sample: PendingSample, *, provenance: Provenance, where: str
    ) -> None:
        raw = sample.nbytes
        if unit_id not in self._opened:
            self._opened.add(unit_id)
            self._queue(Open(unit_id, provenance))
        self._sent_bytes += raw  # in transit from here: counted in nbytes until the child has it
        self._queue(Add(unit_id, sample, where))

    def discard(self, rows: CapturedRows) -> None:
        self._queue(Discard(rows))

    def finish(
        self, unit_id: str, target: ShardTarget, errors: Sequence[RowError], done: Done
    ) -> None:
        with self._done_lock:
            if self._failed is not None:
                done(None, self._failed)
                return
            self._done[unit_id] = done
        self._opened.discard(unit_id)
        self._queue(Finish(unit_id, target, tuple(errors)))

    def flush(self) -> None:
        """Send what was added, discarded and finished since the last flush, in order, as
        one message (the feeder flushes once per engine step: one pickle and one pipe
        write per step instead of per sample)."""
        if self._batch:
            batch, self._batch = self._batch, []
            self._send(Batch(tuple(batch)))

    def close(self) -> None:
        """Stop the child (units not written fail); waits for it briefly, then kills it;
        gives the backend its rows back (it may serve another write-back after this one)."""
        self._closing = True
        if self._failed is None:
            try:
                self.flush()
                self._to_child.put(Close())
            except (OSError, ValueError):  # the child is gone already
                pass
        self._process.join(timeout=60)
        clean = self._process.exitcode == 0
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10)
        self._release_queue(join=clean)
        if self._backend is not None:
            self._backend.hand_off_rows(False)
            self._backend = None
        self._fail_all(WritebackFailed("the write-back was closed before the unit was written"))

    def _release_queue(self, join: bool) -> None:
        """Unlink the queue's named semaphores now, not at this process's exit: Ray ends a
        replica with SIGKILL, which runs no finalizer, and multiprocessing's resource
        tracker, which would unlink them, is killed with it (each replica left three
        `sem.mp-*` files in /dev/shm). The last reference going runs their finalizers,
        and the feeder thread holds references until it ends: a child that read every
        message lets it end now (one that was killed may leave it blocked on the pipe)."""
        queue, self._to_child = self._to_child, None
        if queue is not None:
            queue.close()
            feeder = getattr(queue, "_thread", None)  # join_thread() is off: cancelled above
            if join and feeder is not None:
                feeder.join(timeout=10)

    # ------------------------------------------------------------------ internals

    def _queue(self, message: Open | Add | Discard | Finish) -> None:
        if self._failed is not None:
            raise self._failed
        self._batch.append(message)

    def _send(self, message: ToChild) -> None:
        if self._failed is not None:
            raise self._failed
        if self._to_child is None:
            raise WritebackFailed("the write-back is closed")
        self._to_child.put(message)

    def _listen(self) -> None:
        """Unit results from the child, to their callbacks; a dead child fails them all."""
        while True:
            try:
                message = self._from_child.recv()
            except (EOFError, OSError) as err:
                self._process.join(timeout=5)  # for its exit code
                lost = WritebackFailed(
                    f"the write-back process is gone (exit code {self._process.exitcode}, {err!r})"
                )
                self._fail_all(lost)
                if not self._closing:
                    log.error("write-back process lost %s", kv(error=repr(lost)))
                    if self._on_fatal is not None:
                        self._on_fatal(lost)
                return
            if isinstance(message, Stopped):
                return
            self._resolve(message)

    def _resolve(self, message: FromChild) -> None:
        """A unit's result, to its callback (none: it failed already, with the process)."""
        match message:
            case Written(unit_id=unit_id, written=written):
                result: tuple[Any, BaseException | None] = (written, None)
            case Failed(unit_id=unit_id):
                result = (None, message.error())
            case _:
                raise TypeError(f"the write-back process sent {message!r}: not a reply")
        with self._done_lock:
            done = self._done.pop(unit_id, None)
        if done is not None:
            done(*result)

    def _fail_all(self, err: BaseException) -> None:
        with self._done_lock:
            if self._failed is None:
                self._failed = err
            pending, self._done = self._done, {}
        for done in pending.values():
            done(None, err)


def start_writeback(config: WritebackConfig, *, spill_above_bytes: int | None = None) -> Writeback:
    """The write-back `config` names, started: this process's threads (`ShardWriteback`)
    or a process of its own (`ProcessWriteback`, whose child starts now, so its imports
    overlap the engine's start; `bind` gives it the engine later). Here, above both
    implementations, so neither imports the other's module for it."""
    if config.mode == "threads":
        return ShardWriteback(config, spill_above_bytes=spill_above_bytes)
    return ProcessWriteback(config, spill_above_bytes=spill_above_bytes)
