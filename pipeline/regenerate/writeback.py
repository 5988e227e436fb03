"""Shard writing off the engine's path: encode samples in workers, write each unit when complete.

Samples arrive as requests finish, in any order and from many units at once.
Each is built (tensors from the capture's rows) and encoded (codec,
validation) in an encode worker as it arrives; a unit's encoded rows wait here
until its last sample is in, then a write worker puts the shard (Parquet,
sha256, upload) in sample-id order, writes the unit's error records, and
reports what it wrote. The engine never waits for any of it.

`ShardWriteback` runs in the process that holds it, with threads: the codecs
spend their time in zstd and numpy, both of which release the GIL
(docs/capture.md has the measured encode MB/s per core). The replica hosts
it in a separate, lower-priority process (`writeback_process.py`), so none
of this work holds the engine thread's GIL or takes a CPU the engine wants.
There it reads the engine's spool itself (`SpooledSample`, `SpoolRows`) and
keeps its counters in shared memory (`Ledger`).

`nbytes` is what is held for samples handed over and whose shard is not
written yet (raw tensors queued for encoding, then encoded rows); the feeder
adds it to its own in-flight reservations to bound captured memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.logs import kv
from pipeline.regenerate.spill import SpillFile

if TYPE_CHECKING:
    from pipeline.corpus.records import RowError
    from pipeline.regenerate.unit import DeferredSample, SpooledSample
    from pipeline.shards.schema import Provenance
    from pipeline.shards.writer import Sample, ShardInfo
    from pipeline.targets.capture_rows import SpoolRows

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


def sample_nbytes(sample: Sample) -> int:
    """Bytes of a sample's captured tensors (what it holds until encoded)."""
    return sum(
        t.numel() * t.element_size() for t in (sample.hidden_states, sample.last_hidden_state)
    )


class ShardWriteback:
    """Background building, encoding and shard writing for the units of one replica.

    `rows`: the engine's spool, for `SpooledSample`s (their rows are taken
    on the calling thread, so call `add` and `discard` from one thread).
    `threads=False`: encode on the calling thread instead (a process with
    one CPU gains nothing from handing encoding to threads, and pays their
    switches); writes keep their threads, which mostly wait on storage.
    """

    def __init__(
        self,
        *,
        num_encode_workers: int = 2,
        num_write_workers: int = 1,
        spill_above_bytes: int | None = None,
        spill_dir: str | None = None,
        rows: SpoolRows | None = None,
        ledger: Ledger | None = None,
        threads: bool = True,
    ) -> None:
        if num_encode_workers < 1 or num_write_workers < 1:
            raise ValueError("num_encode_workers and num_write_workers must be >= 1")
        # Past this many encoded bytes in memory, new rows of unfinished units go
        # to their unit's spill file on local disk (spill.py); None: never.
        self.spill_above_bytes = spill_above_bytes
        self.spill_dir = spill_dir
        self.rows = rows
        self.ledger = ledger or Ledger()
        self._spills: dict[str, SpillFile] = {}
        self._encode = (
            ThreadPoolExecutor(num_encode_workers, thread_name_prefix="encode")
            if threads
            else _Inline()
        )
        self._write = ThreadPoolExecutor(num_write_workers, thread_name_prefix="write")
        # unit id -> (sample id, its encoded row or error record)
        self._rows: dict[str, list[tuple[str, Future]]] = {}
        self._lock = threading.Lock()

    # Counters, read by the feeder, the replica's stats and the tests.
    nbytes = property(lambda self: int(self.ledger["nbytes"]))
    peak_nbytes = property(lambda self: int(self.ledger["peak_nbytes"]))
    encode_seconds = property(lambda self: self.ledger["encode_seconds"])
    encoded_bytes = property(lambda self: int(self.ledger["encoded_bytes"]))
    spilled_bytes = property(lambda self: int(self.ledger["spilled_bytes"]))

    def _account(self, delta: int) -> None:
        with self._lock:
            self.ledger.add("nbytes", delta)
            self.ledger.raise_to("peak_nbytes", self.ledger["nbytes"])

    def add(
        self,
        unit_id: str,
        sample: Sample | DeferredSample | SpooledSample,
        *,
        provenance: Provenance,
        where: str,
        source: str,
        nbytes: int | None = None,
    ) -> None:
        """Queue one sample of `unit_id` for building (unless built) and encoding.

        `nbytes`: what a deferred or spooled sample holds until built (its
        captured rows); `where`/`source` name it in an error record.
        """
        from pipeline.regenerate.unit import SpooledSample

        raw = sample_nbytes(sample) if nbytes is None else nbytes
        parts = None
        if isinstance(sample, SpooledSample):
            if self.rows is None:
                raise TypeError("a spooled sample needs the write-back's spool rows")
            parts = self.rows.take(sample.sample_id, sample.num_tokens - 1)
        self._account(raw)
        with self._lock:
            self.ledger.add("received_bytes", raw)
        future = self._encode.submit(
            self._encode_one, unit_id, sample, parts, provenance, where, source, raw
        )
        self._rows.setdefault(unit_id, []).append((sample.sample_id, future))

    def flush(self) -> None:
        """Nothing to do here (the process write-back batches its messages until this)."""

    def discard(self, request_id: str) -> None:
        """A finished request that becomes no sample: drop its rows from the spool."""
        if self.rows is not None:
            self.rows.discard(request_id)

    def _encode_one(self, unit_id: str, sample, parts, provenance, where: str, source: str, raw):
        """The encoded row, or the row's error record when it cannot be built or validated."""
        from pipeline.corpus.records import RowError
        from pipeline.regenerate.unit import DeferredSample, SpooledSample, captured_sample
        from pipeline.shards.codecs import get_codec
        from pipeline.shards.writer import encode_sample
        from pipeline.targets.base import Generation

        started = time.perf_counter()
        try:
            if isinstance(sample, DeferredSample):
                sample = sample.build()
            elif isinstance(sample, SpooledSample):
                if not parts:
                    raise RuntimeError(f"capture {sample.sample_id!r}: no hidden states captured")
                gen = Generation(
                    sample.sample_id, sample.prompt_ids, sample.output_ids, sample.finish_reason
                )
                cap = self.rows.layout.to_captured(gen, parts, normed=True)  # SpoolRows.drain
                sample = captured_sample(cap, sample.source, sample.domain)
            row = encode_sample(sample, provenance, get_codec(provenance.codec), shard=unit_id)
        except RuntimeError as err:  # the engine left positions of this request unwritten
            return RowError(source, where, "capture_incomplete", str(err))
        except (TypeError, ValueError) as err:
            return RowError(source, where, "invalid_sample", str(err))
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
        from pipeline.shards.manifest import Dataset

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
