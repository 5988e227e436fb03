"""Shard writing off the engine's path: encode samples in workers, write each unit when complete.

Samples arrive from the feeder as requests finish, in any order and from
many units at once. Each is encoded (codec, validation) in an encode worker
as it arrives; a unit's encoded rows wait here until its last sample is in,
then a write worker puts the shard (Parquet, sha256, upload) in sample-id
order, writes the unit's error records, and resolves the unit's future. The
engine never waits for any of it.

Threads, not processes: the codecs spend their time in zstd and numpy, both
of which release the GIL (docs/capture.md has the measured encode MB/s per
core), and rows stay in one address space without copies.

`nbytes` is what is held for samples the feeder handed over and whose shard
is not written yet (raw tensors queued for encoding, then encoded rows); the
feeder adds it to its own in-flight reservations to bound captured memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from pipeline.logs import kv
from pipeline.regenerate.spill import SpillFile

if TYPE_CHECKING:
    from pipeline.regenerate.unit import DeferredSample, UnitJob, UnitResult
    from pipeline.shards.writer import Sample

log = logging.getLogger(__name__)


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
    """Background encoding and shard writing for the units of one replica."""

    def __init__(
        self,
        *,
        num_encode_workers: int = 2,
        num_write_workers: int = 1,
        spill_above_bytes: int | None = None,
        spill_dir: str | None = None,
    ) -> None:
        if num_encode_workers < 1 or num_write_workers < 1:
            raise ValueError("num_encode_workers and num_write_workers must be >= 1")
        # Past this many encoded bytes in memory, new rows of unfinished units go
        # to their unit's spill file on local disk (spill.py); None: never.
        self.spill_above_bytes = spill_above_bytes
        self.spill_dir = spill_dir
        self._spills: dict[str, SpillFile] = {}
        self.spilled_bytes = 0
        self._encode = ThreadPoolExecutor(num_encode_workers, thread_name_prefix="encode")
        self._write = ThreadPoolExecutor(num_write_workers, thread_name_prefix="write")
        # unit id -> (sample id, its encoded row or error record)
        self._rows: dict[str, list[tuple[str, Future]]] = {}
        self._lock = threading.Lock()
        self.nbytes = 0
        self.peak_nbytes = 0
        self.encode_seconds = 0.0  # summed over workers
        self.encoded_bytes = 0  # raw tensor bytes encoded

    def _account(self, delta: int) -> None:
        with self._lock:
            self.nbytes += delta
            self.peak_nbytes = max(self.peak_nbytes, self.nbytes)

    def add(
        self, job: UnitJob, sample: Sample | DeferredSample, *, nbytes: int | None = None
    ) -> None:
        """Queue one sample of `job`'s unit for building (if deferred) and encoding.

        `nbytes`: what a deferred sample holds until built (its captured rows).
        """
        raw = sample_nbytes(sample) if nbytes is None else nbytes
        self._account(raw)
        future = self._encode.submit(self._encode_one, job, sample, raw)
        self._rows.setdefault(job.unit.unit_id, []).append((sample.sample_id, future))

    def _encode_one(self, job: UnitJob, sample, raw: int):
        """The encoded row, or the row's error record when it cannot be built or validated."""
        from pipeline.corpus.records import RowError
        from pipeline.regenerate.unit import DeferredSample
        from pipeline.shards.codecs import get_codec
        from pipeline.shards.writer import encode_sample

        started = time.perf_counter()
        prov = job.spec.provenance
        where = job.locations.get(sample.sample_id, sample.sample_id)
        source = job.sources.get(sample.sample_id, "")
        try:
            if isinstance(sample, DeferredSample):
                sample = sample.build()
            row = encode_sample(sample, prov, get_codec(prov.codec), shard=job.unit.unit_id)
        except RuntimeError as err:  # the engine left positions of this request unwritten
            return RowError(source, where, "capture_incomplete", str(err))
        except (TypeError, ValueError) as err:
            return RowError(source, where, "invalid_sample", str(err))
        finally:
            self._account(-raw)
        with self._lock:
            self.encode_seconds += time.perf_counter() - started
            self.encoded_bytes += raw
            spill = self.spill_above_bytes is not None and self.nbytes > self.spill_above_bytes
            if spill:
                unit_id = job.unit.unit_id
                if unit_id not in self._spills:
                    self._spills[unit_id] = SpillFile(self.spill_dir, unit_id)
                target = self._spills[unit_id]
        if spill:
            target.append(row)
            with self._lock:
                self.spilled_bytes += row.nbytes
            return _Spilled(row.sample_id)
        self._account(row.nbytes)
        return row

    def finish(
        self, job: UnitJob, done: Callable[[UnitResult | None, BaseException | None], None]
    ) -> None:
        """Write `job`'s shard once its rows are encoded; then `done(result, error)`."""
        rows = self._rows.pop(job.unit.unit_id, [])
        self._write.submit(self._write_unit, job, rows, done)

    def _write_unit(self, job: UnitJob, rows, done) -> None:
        from pipeline.corpus.records import RowError
        from pipeline.shards.manifest import Dataset

        spec, result = job.spec, job.result
        held = 0
        spill = None
        try:
            encoded = []
            resolved = [(sid, future.result()) for sid, future in rows]
            with self._lock:  # every row of the unit is encoded (or spilled) by now
                spill = self._spills.pop(job.unit.unit_id, None)
            for sid, row in resolved:
                if isinstance(row, _Spilled):
                    encoded.append((sid, row))
                    continue
                if isinstance(row, RowError):
                    result.errors.append(row)
                    prompt_tokens, generated_tokens = job.token_counts[sid]
                    result.num_samples -= 1
                    result.num_prompt_tokens -= prompt_tokens
                    result.num_generated_tokens -= generated_tokens
                    continue
                held += row.nbytes
                encoded.append((sid, row))
            encoded.sort(key=lambda r: r[0])
            dataset = Dataset.open(spec.dataset_uri, endpoint_url=spec.endpoint_url)
            # A unit whose every answer failed still gets its (zero-row) shard, so
            # it counts as done and a rerun does not redo it.
            with dataset.writer(job.unit.unit_id, spec.provenance) as writer:
                for sid, row in encoded:
                    writer.write_encoded(spill.read(sid) if isinstance(row, _Spilled) else row)
            result.shard = writer.info
            dataset.write_errors(job.unit.unit_id, result.errors)
            result.seconds = time.monotonic() - job.started
        except BaseException as err:
            log.error("shard write failed %s", kv(unit=job.unit.unit_id, error=repr(err)))
            done(None, err)
            return
        finally:
            self._account(-held)  # rows that failed to encode were never counted
            if spill is not None:
                spill.close()
        done(result, None)

    def close(self) -> None:
        self._encode.shutdown(wait=True, cancel_futures=True)
        self._write.shutdown(wait=True, cancel_futures=True)
