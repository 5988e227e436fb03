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
between steps (docs/capture.md has the measurements).

The engine's process never touches the captured bytes: on `bind` the backend
hands the capture spool over (`hand_off_rows`), so its samples' rows are
`SpooledRows` handles, and this process reads the spool files itself
(`capture_rows.open_spool`) as it builds them. What crosses the pipe is
small: per sample its ids, tokens and rows handle; per unit its error
records and, back, its `ShardInfo`. Rows held in memory elsewhere (a backend
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
import queue
import threading
from collections import deque
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

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pipeline.corpus.records import RowError
    from pipeline.regenerate.replica.pending import PendingSample
    from pipeline.shards.schema import Provenance
    from pipeline.targets.base import CapturedRows, StreamingBackend

log = logging.getLogger(__name__)


class WritebackFailed(RuntimeError):
    """The write-back process died or broke: no unit in it can finish."""


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
        self._to_child = ctx.Queue()
        self._to_child.cancel_join_thread()  # never hang this process's exit on a dead child
        self._from_child, writer = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_child_main,
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
        self._batch: list[tuple] = []  # messages waiting for flush()
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
        self._send(("bind", contract))

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
            self._queue(("open", unit_id, provenance))
        self._sent_bytes += raw  # in transit from here: counted in nbytes until the child has it
        self._queue(("add", unit_id, sample, where))

    def discard(self, rows: CapturedRows) -> None:
        self._queue(("discard", rows))

    def finish(
        self, unit_id: str, target: ShardTarget, errors: Sequence[RowError], done: Done
    ) -> None:
        with self._done_lock:
            if self._failed is not None:
                done(None, self._failed)
                return
            self._done[unit_id] = done
        self._opened.discard(unit_id)
        self._queue(("finish", unit_id, target, list(errors)))

    def flush(self) -> None:
        """Send what was added, discarded and finished since the last flush, in order, as
        one message (the feeder flushes once per engine step: one pickle and one pipe
        write per step instead of per sample)."""
        if self._batch:
            batch, self._batch = self._batch, []
            self._send(("batch", batch))

    def close(self) -> None:
        """Stop the child (units not written fail); waits for it briefly, then kills it;
        gives the backend its rows back (it may serve another write-back after this one)."""
        self._closing = True
        if self._failed is None:
            try:
                self.flush()
                self._to_child.put(("close",))
            except (OSError, ValueError):  # the child is gone already
                pass
        self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10)
        if self._backend is not None:
            self._backend.hand_off_rows(False)
            self._backend = None
        self._fail_all(WritebackFailed("the write-back was closed before the unit was written"))

    # ------------------------------------------------------------------ internals

    def _queue(self, message: tuple) -> None:
        if self._failed is not None:
            raise self._failed
        self._batch.append(message)

    def _send(self, message: tuple) -> None:
        if self._failed is not None:
            raise self._failed
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
            kind, unit_id, payload = message
            if kind == "stopped":
                return
            with self._done_lock:
                done = self._done.pop(unit_id, None)
            if done is None:
                continue
            if kind == "written":
                done(payload, None)
            else:
                done(None, _rebuilt(payload))

    def _fail_all(self, err: BaseException) -> None:
        with self._done_lock:
            if self._failed is None:
                self._failed = err
            pending, self._done = self._done, {}
        for done in pending.values():
            done(None, err)


# --------------------------------------------------------------------------- the child


def _child_main(
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
    import pipeline.shards.manifest  # noqa: F401  (pyarrow, storage)
    import pipeline.shards.writer  # noqa: F401
    from pipeline.targets.capture_rows import close_spool, open_spool

    writeback = None  # made on "bind": by then the replica has placed this process
    contract = None
    replies: queue.SimpleQueue = queue.SimpleQueue()
    sender = threading.Thread(target=_send_replies, args=(replies, outbox), daemon=True)
    sender.start()
    provenance: dict[str, Any] = {}
    pending: deque[tuple] = deque()
    try:
        while True:
            if not pending:
                message = inbox.get()
                pending.extend(message[1] if message[0] == "batch" else [message])
            message = pending.popleft()
            kind = message[0]
            if kind == "open":
                provenance[message[1]] = message[2]
            elif kind == "add":
                _, unit_id, sample, where = message
                writeback.add(unit_id, sample, provenance=provenance[unit_id], where=where)
            elif kind == "discard":
                writeback.discard(message[1])
            elif kind == "bind":
                contract = message[1]
                if contract is not None:
                    open_spool(contract)  # the samples' SpooledRows read it from here
                cpus = _num_cpus()
                # More encode threads than CPUs to run them on only contend; on one
                # CPU this thread does the work itself.
                workers = min(config.num_encode_workers, cpus)
                writeback = ShardWriteback(
                    config.model_copy(update={"num_encode_workers": workers}),
                    spill_above_bytes=spill_above_bytes,
                    ledger=Ledger(ledger_values),
                    threads=cpus > 1,
                )
            elif kind == "finish":
                _, unit_id, target, errors = message
                provenance.pop(unit_id, None)

                def done(written, error, unit_id=unit_id):
                    replies.put(
                        ("written", unit_id, written)
                        if error is None
                        else ("failed", unit_id, _portable(error))
                    )

                writeback.finish(unit_id, target, errors, done)
            elif kind == "close":
                break
    finally:
        if writeback is not None:
            writeback.close()
        if contract is not None:
            close_spool(contract)
        replies.put(("stopped", "", None))
        sender.join(timeout=30)


def _num_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _send_replies(replies: queue.SimpleQueue, outbox) -> None:
    """One thread writes to the pipe, so callbacks from several write workers never interleave."""
    while True:
        message = replies.get()
        outbox.send(message)
        if message[0] == "stopped":
            return


def _portable(err: BaseException) -> tuple[bool, str]:
    """An error as (transient, text): what the scheduler needs of it (it retries transient
    ones), in a form that crosses the pipe whatever the error's class."""
    from pipeline.storage import is_transient

    return is_transient(err) or isinstance(err, TimeoutError), f"{type(err).__name__}: {err}"


def _rebuilt(portable: tuple[bool, str]) -> BaseException:
    transient, text = portable
    return ConnectionError(text) if transient else WritebackFailed(text)


def _exit_with_parent(parent: int) -> None:
    """Exit once the replica is gone (SIGKILLed: nothing else would tell this process)."""
    import time

    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def start_writeback(config: WritebackConfig, *, spill_above_bytes: int | None = None) -> Writeback:
    """The write-back `config` names, started: this process's threads (`ShardWriteback`)
    or a process of its own (`ProcessWriteback`, whose child starts now, so its imports
    overlap the engine's start; `bind` gives it the engine later). Here, above both
    implementations, so neither imports the other's module for it."""
    if config.mode == "threads":
        return ShardWriteback(config, spill_above_bytes=spill_above_bytes)
    return ProcessWriteback(config, spill_above_bytes=spill_above_bytes)
