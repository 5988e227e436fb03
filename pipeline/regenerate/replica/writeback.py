"""Shard writing off the engine's path: the `Writeback` interface and its in-process implementation.

Samples arrive as requests finish, in any order and from many units at once.
Each is built (tensors from its captured rows, `PendingSample.build`) and
encoded (codec, validation) in an encode worker as it arrives; a unit's
encoded rows wait here until its last sample is in, then a write worker puts
the shard (Parquet, sha256, upload) in sample-id order, writes the unit's
error records, and reports what it wrote. The engine never waits for any of it.

Two implementations of `Writeback`, chosen by `regenerate.writeback.mode`
(`WritebackConfig`, this module, is the section both read):
`ShardWriteback` (here) runs in the process that holds it, with threads:
the codecs spend their time in zstd and numpy, which release the GIL. The
replica runs it in a separate, lower-priority process by default
(`writeback_process.py`), which reads the engine's spool itself, so none of
this work holds the engine thread's GIL or takes a CPU the engine wants
(docs/capture.md, "Memory and writing").

`nbytes` is what is held for samples handed over and whose shard is not
written yet (rows queued for building, then encoded rows); the feeder adds
it to its own in-flight reservations to bound captured memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field

from pipeline.config import ConfigModel
from pipeline.logs import kv
from pipeline.regenerate.replica.spill import SpillFile

if TYPE_CHECKING:
    from pipeline.corpus.records import RowError
    from pipeline.regenerate.replica.pending import PendingSample
    from pipeline.shards.schema import Provenance
    from pipeline.shards.writer import ShardInfo
    from pipeline.targets.base import CapturedRows, StreamingBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardTarget:
    """Where a unit's shard goes (the same for every unit of a run)."""

    dataset_uri: str
    endpoint_url: str | None
    provenance: Provenance


@dataclass
class UnitWritten:
    """A unit's shard, and the samples that became error records on the way (by sample id)."""

    shard: ShardInfo
    row_errors: list[tuple[str, RowError]] = field(default_factory=list)


Done = Callable[[UnitWritten | None, BaseException | None], None]


class WritebackConfig(ConfigModel):
    """`regenerate.writeback`: where and with how many workers a replica builds, encodes
    and writes its shards."""

    # "process": a child of the replica at `nice` above it, which reads the engine's
    # capture spool itself (writeback_process.py); "threads": in the replica's own
    # process. The process measured faster on a CPU host (bench/RESULTS.md).
    mode: Literal["process", "threads"] = "process"
    # Encode threads (codec; capped at the process's CPUs) and shard-write threads.
    num_encode_workers: int = Field(2, gt=0)
    num_write_workers: int = Field(1, gt=0)
    # Local directory for encoded rows of unfinished units once half the capture
    # bound is used (a unit's shard is written when its last sample lands);
    # None: the system's temp dir.
    spill_dir: str | None = None
    # The write-back process's nice value above the replica's (mode "process").
    nice: int = Field(5, ge=0, le=19)


@dataclass(frozen=True)
class WritebackStats:
    """A write-back's counters, for the replica's stats and the tests."""

    nbytes: int  # held now: rows queued for building + encoded rows in memory
    peak_nbytes: int
    encode_seconds: float  # summed over workers
    encoded_bytes: int  # raw tensor bytes encoded
    spilled_bytes: int  # encoded bytes that went to spill files
    pid: int | None  # the write-back's own process, if it has one


class Writeback(Protocol):
    """Builds, encodes and writes the shards of one replica's units, off the engine's thread.

    Called from the feeder's engine thread: `add` and `discard` per finished
    request, `flush` once per engine step, `finish` once per unit; `nbytes` on
    every admission. None of them waits for the work.
    """

    @property
    def nbytes(self) -> int:
        """Captured bytes held for samples whose shard is not written yet."""
        ...

    def bind(
        self,
        backend: StreamingBackend | None,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Start serving `backend`'s rows (once, before the first `add`); `on_fatal`: the
        write-back itself broke, so no unit here can finish."""
        ...

    def add(
        self, unit_id: str, sample: PendingSample, *, provenance: Provenance, where: str
    ) -> None:
        """Queue one sample of `unit_id` for building and encoding; `where` names it in
        its error record if it cannot be built."""
        ...

    def discard(self, rows: CapturedRows) -> None:
        """Rows of a finished request that becomes no sample: drop them where they are held."""
        ...

    def flush(self) -> None:
        """The end of an engine step's results (a process write-back sends them now)."""
        ...

    def finish(
        self, unit_id: str, target: ShardTarget, errors: Sequence[RowError], done: Done
    ) -> None:
        """Write `unit_id`'s shard once its rows are encoded, with `errors` (and its rows'
        own) as its error records; then `done(written, error)`."""
        ...

    def stats(self) -> WritebackStats: ...

    def close(self) -> None: ...


LEDGER_FIELDS = (
    "nbytes",  # held now: raw rows queued for encoding + encoded rows in memory
    "peak_nbytes",
    "encode_seconds",  # summed over workers
    "encoded_bytes",  # raw tensor bytes encoded
    "spilled_bytes",  # encoded bytes that went to spill files
    "received_bytes",  # raw bytes of every sample ever added (the feeder's in-transit count)
)
_SLOT = {name: i for i, name in enumerate(LEDGER_FIELDS)}


class Ledger:
    """The write-back's counters: a list, or a shared `multiprocessing.RawArray('d')`.

    Only the write-back writes them (under its lock); another process may
    read them at any time (an aligned double is read whole).
    """

    def __init__(self, values: Any = None) -> None:
        self.values = values if values is not None else [0.0] * len(LEDGER_FIELDS)

    def __getitem__(self, name: str) -> float:
        return self.values[_SLOT[name]]

    def add(self, name: str, delta: float) -> None:
        self.values[_SLOT[name]] += delta

    def raise_to(self, name: str, value: float) -> None:
        slot = _SLOT[name]
        if value > self.values[slot]:
            self.values[slot] = value


class _Inline:
    """Runs each task at once on the calling thread (an executor without threads)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as err:
            future.set_exception(err)
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


class _Spilled:
    """Stands for an encoded row that went to its unit's spill file."""

    def __init__(self, sample_id: str) -> None:
        self.sample_id = sample_id


class ShardWriteback:
    """A `Writeback` in this process: encode threads and write threads.

    `threads=False`: encode on the calling thread instead (a process with
    one CPU gains nothing from handing encoding to threads, and pays their
    switches); writes keep their threads, which mostly wait on storage.
    `ledger`: where the counters live (shared memory, in the write-back process).
    """

    def __init__(
        self,
        config: WritebackConfig | None = None,
        *,
        spill_above_bytes: int | None = None,
        ledger: Ledger | None = None,
        threads: bool = True,
    ) -> None:
        config = config or WritebackConfig(mode="threads")
        # Past this many encoded bytes in memory, new rows of unfinished units go
        # to their unit's spill file on local disk (spill.py); None: never.
        self.spill_above_bytes = spill_above_bytes
        self.spill_dir = config.spill_dir
        self.ledger = ledger or Ledger()
        self._spills: dict[str, SpillFile] = {}
        self._encode = (
            ThreadPoolExecutor(config.num_encode_workers, thread_name_prefix="encode")
            if threads
            else _Inline()
        )
        self._write = ThreadPoolExecutor(config.num_write_workers, thread_name_prefix="write")
        # unit id -> (sample id, its encoded row or error record)
        self._rows: dict[str, list[tuple[str, Future]]] = {}
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return int(self.ledger["nbytes"])

    def stats(self) -> WritebackStats:
        ledger = self.ledger
        return WritebackStats(
            nbytes=int(ledger["nbytes"]),
            peak_nbytes=int(ledger["peak_nbytes"]),
            encode_seconds=ledger["encode_seconds"],
            encoded_bytes=int(ledger["encoded_bytes"]),
            spilled_bytes=int(ledger["spilled_bytes"]),
            pid=None,
        )

    def bind(self, backend=None, *, on_fatal=None) -> None:
        """Nothing to do: rows come in memory, and the threads fail per unit, not all at once."""

    def _account(self, delta: int) -> None:
        with self._lock:
            self.ledger.add("nbytes", delta)
            self.ledger.raise_to("peak_nbytes", self.ledger["nbytes"])

    def add(
        self, unit_id: str, sample: PendingSample, *, provenance: Provenance, where: str
    ) -> None:
        raw = sample.nbytes
        self._account(raw)
        with self._lock:
            self.ledger.add("received_bytes", raw)
        future = self._encode.submit(self._encode_one, unit_id, sample, provenance, where, raw)
        self._rows.setdefault(unit_id, []).append((sample.sample_id, future))

    def flush(self) -> None:
        """Nothing to do here (the process write-back batches its messages until this)."""

    def discard(self, rows: CapturedRows) -> None:
        rows.release()

    def _encode_one(self, unit_id: str, sample: PendingSample, provenance, where: str, raw: int):
        """The encoded row, or the row's error record when it cannot be built or validated."""
        from pipeline.corpus.records import RowError
        from pipeline.shards.codecs import get_codec
        from pipeline.shards.writer import encode_sample

        started = time.perf_counter()
        try:
            built = sample.build()
            row = encode_sample(built, provenance, get_codec(provenance.codec), shard=unit_id)
        except RuntimeError as err:  # the engine left positions of this request unwritten
            return RowError(sample.source, where, "capture_incomplete", str(err))
        except (TypeError, ValueError) as err:
            return RowError(sample.source, where, "invalid_sample", str(err))
        finally:
            self._account(-raw)
        with self._lock:
            self.ledger.add("encode_seconds", time.perf_counter() - started)
            self.ledger.add("encoded_bytes", raw)
            spill = self.spill_above_bytes is not None and self.nbytes > self.spill_above_bytes
            if spill:
                if unit_id not in self._spills:
                    self._spills[unit_id] = SpillFile(self.spill_dir, unit_id)
                target = self._spills[unit_id]
        if spill:
            target.append(row)
            with self._lock:
                self.ledger.add("spilled_bytes", row.nbytes)
            return _Spilled(row.sample_id)
        self._account(row.nbytes)
        return row

    def finish(
        self, unit_id: str, target: ShardTarget, errors: Sequence[RowError], done: Done
    ) -> None:
        """Write `unit_id`'s shard once its rows are encoded, with the unit's `errors`
        (and its rows' own) as its error records; then `done(written, error)`."""
        rows = self._rows.pop(unit_id, [])
        self._write.submit(self._write_unit, unit_id, target, list(errors), rows, done)

    def _write_unit(self, unit_id: str, target: ShardTarget, errors, rows, done: Done) -> None:
        from pipeline.corpus.records import RowError
        from pipeline.table.dataset import Dataset

        held = 0
        spill = None
        try:
            encoded, row_errors = [], []
            resolved = [(sid, future.result()) for sid, future in rows]
            with self._lock:  # every row of the unit is encoded (or spilled) by now
                spill = self._spills.pop(unit_id, None)
            for sid, row in resolved:
                if isinstance(row, RowError):
                    row_errors.append((sid, row))
                    continue
                if not isinstance(row, _Spilled):
                    held += row.nbytes
                encoded.append((sid, row))
            encoded.sort(key=lambda r: r[0])
            dataset = Dataset.open(target.dataset_uri, endpoint_url=target.endpoint_url)
            # A unit whose every answer failed still gets its (zero-row) shard, so
            # it counts as done and a rerun does not redo it.
            with dataset.writer(unit_id, target.provenance) as writer:
                for sid, row in encoded:
                    writer.write_encoded(spill.read(sid) if isinstance(row, _Spilled) else row)
            dataset.write_errors(unit_id, [*errors, *(e for _, e in row_errors)])
            written = UnitWritten(writer.info, row_errors)
        except BaseException as err:
            log.error("shard write failed %s", kv(unit=unit_id, error=repr(err)))
            done(None, err)
            return
        finally:
            self._account(-held)  # rows that failed to encode were never counted
            if spill is not None:
                spill.close()
        done(written, None)

    def close(self) -> None:
        self._encode.shutdown(wait=True, cancel_futures=True)
        self._write.shutdown(wait=True, cancel_futures=True)
