"""Keep one replica's engine full: requests from many units in flight, results handled as they land.

One thread owns the engine (a `StreamingBackend`): it admits requests,
advances the engine a step, and hands every finished request to its unit's
`UnitJob`, whose next turn goes back in at once. There is no batch barrier:
a long answer holds only its own slot while the engine keeps serving the
rest. Why a step loop and not vLLM's AsyncLLM: the loop is the one place that
sees both the engine and the capture sink, so a finished request's rows are
taken exactly when its output arrives, admission can account every captured
byte before it exists, and nothing needs an event loop inside the engine's
process; vLLM's engine core runs in its own process and keeps stepping while
this thread handles results (docs/capture.md).

Admission: requests of older units first (a unit's shard is written when its
last sample lands), up to `max_requests_in_flight` (a little above the
engine's own `max_num_seqs`, so the engine never waits for the next request)
and as long as captured memory stays under `max_capture_bytes`: every
request reserves `(prompt + answer budget) x bytes per token` for its rows
until it finishes, and the write-back's queued and in-memory encoded rows
count until their shard is written (past half the bound, encoded rows of
unfinished units go to local spill files instead). If nothing is in flight, one request is admitted even
over the bound, so a bound smaller than one unit cannot deadlock (a warning
says the bound is too small).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from pipeline.logs import kv
from pipeline.regenerate.replica.unit_job import UnitJob
from pipeline.regenerate.replica.writeback import (
    ShardTarget,
    UnitWritten,
    Writeback,
    WritebackConfig,
)
from pipeline.regenerate.replica.writeback_process import start_writeback
from pipeline.regenerate.units import UnitResult, UnitSpec, WorkUnit
from pipeline.targets.base import GenerationRequest, Result, StreamingBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeedLimits:
    """Admission: requests in the engine at once, and captured bytes held at once."""

    max_requests_in_flight: int
    max_capture_bytes: int

    def __post_init__(self) -> None:
        if self.max_requests_in_flight < 1 or self.max_capture_bytes < 1:
            raise ValueError("max_requests_in_flight and max_capture_bytes must be positive")


@dataclass
class FeedStats:
    """What the feeder did, for the run summary and the benchmark."""

    requests: int = 0
    steps: int = 0
    step_seconds: float = 0.0  # in backend.poll
    handle_seconds: float = 0.0  # turning results into samples and next requests
    admit_seconds: float = 0.0  # starting units (rendering first turns) and submitting requests
    idle_seconds: float = 0.0  # nothing to run: waiting for the next unit
    busy_slots: int = 0  # requests in the engine summed over steps (/ steps: the mean batch)
    peak_capture_bytes: int = 0  # reserved rows + write-back, at its highest
    peak_in_flight: int = 0
    over_bound_admissions: int = 0
    last_step_at: float = 0.0  # time.monotonic() of the last completed engine step


class EngineFeeder:
    """Runs one backend for many units at once (see the module docstring)."""

    def __init__(
        self,
        backend: StreamingBackend,
        tokenizer,
        limits: FeedLimits,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
        writeback: Writeback | None = None,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.limits = limits
        self.on_fatal = on_fatal
        # The owner may start it earlier (the replica: before its engine); default: a
        # write-back process as `regenerate.writeback` ships. The feeder closes it.
        self.writeback = writeback or start_writeback(WritebackConfig())
        self.writeback.bind(backend, on_fatal=self._writeback_lost)
        self.stats = FeedStats()
        self._cond = threading.Condition()
        self._incoming: list[tuple[UnitJob, Future]] = []
        self._futures: dict[int, Future] = {}  # id(job) -> its result
        self._pending: list[tuple[tuple[int, int], int, UnitJob, GenerationRequest]] = []
        self._order = itertools.count()
        self._seq: dict[int, int] = {}  # id(job) -> admission priority (older first)
        self._owner: dict[str, tuple[UnitJob, int]] = {}  # request id -> (job, reserved bytes)
        self._reserved = 0
        self._stopping = False
        self._fatal: BaseException | None = None
        self._hunger: list[Future] = []  # hungry() calls waiting for the engine to run short
        self._warned_bound = False
        self._thread = threading.Thread(target=self._run, name="engine-feeder", daemon=True)
        self._thread.start()

    def _writeback_lost(self, err: BaseException) -> None:
        """The write-back process died: no unit here can finish, as if the engine had."""
        with self._cond:
            if self._stopping:
                return
            self._fatal = err
            self._release_hunger(False)
        if self.on_fatal is not None:
            self.on_fatal(err)

    # ------------------------------------------------------------------ caller side

    def submit_unit(self, unit: WorkUnit, spec: UnitSpec) -> Future[UnitResult]:
        """Start `unit`; the future resolves once its shard is written."""
        future: Future[UnitResult] = Future()
        with self._cond:
            if self._fatal is not None:
                raise RuntimeError(f"the engine failed earlier: {self._fatal!r}")
            if self._stopping:
                raise RuntimeError("the feeder is closed")
            self._incoming.append((UnitJob(unit, spec, self.tokenizer), future))
            self._cond.notify()
        return future

    def hungry(self) -> Future[bool]:
        """Resolves True once every request of the units held here is in the engine and it
        has room, i.e. the engine runs short of work without another unit (the scheduler
        then may give one more than `units_wanted`); False if the feeder stops first."""
        future: Future[bool] = Future()
        with self._cond:
            if self._stopping or self._fatal is not None:
                future.set_result(False)
            else:
                self._hunger.append(future)
                self._cond.notify()
        return future

    def _answer_hunger(self) -> None:
        """With the lock held: resolve the hungry() calls if the engine is short of work."""
        if (
            self._hunger
            and not self._incoming
            and not self._pending
            and self.backend.num_unfinished() < self.limits.max_requests_in_flight
        ):
            self._release_hunger(True)

    def _release_hunger(self, hungry: bool) -> None:
        """With the lock held: answer every waiting hungry() call."""
        for future in self._hunger:
            future.set_result(hungry)
        self._hunger = []

    def health(self) -> dict[str, float]:
        """Requests in the engine and seconds since its last completed step (a stall check)."""
        in_flight = len(self._owner)
        since = time.monotonic() - self.stats.last_step_at if self.stats.last_step_at else 0.0
        return {"in_flight": in_flight, "seconds_since_step": since if in_flight else 0.0}

    @property
    def capture_bytes(self) -> int:
        """Captured bytes held now: in-flight reservations + the write-back's rows."""
        return self._reserved + self.writeback.nbytes

    def close(self) -> None:
        """Stop the loop (units still running fail) and the write-back workers."""
        with self._cond:
            self._stopping = True
            self._release_hunger(False)
            self._cond.notify()
        self._thread.join(timeout=60)
        self.writeback.close()
        err = RuntimeError("the feeder was closed before the unit finished")
        for future in list(self._futures.values()):
            if not future.done():
                future.set_exception(err)

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    waited = time.perf_counter()
                    while (
                        not self._stopping
                        and not self._incoming
                        and not self._pending
                        and not self.backend.num_unfinished()
                    ):
                        self._answer_hunger()
                        self._cond.wait()
                    if self._stopping:
                        return
                    incoming, self._incoming = self._incoming, []
                admitting = time.perf_counter()
                if self.stats.steps:  # before the first unit the engine is not idle, only unused
                    self.stats.idle_seconds += admitting - waited
                for job, future in incoming:
                    self._start(job, future)
                if incoming:
                    self.writeback.flush()  # a unit whose every conversation failed to render
                self._admit()
                if self._hunger:
                    with self._cond:
                        self._answer_hunger()
                self.stats.busy_slots += self.backend.num_unfinished()
                started = time.perf_counter()
                self.stats.admit_seconds += started - admitting
                if not self.backend.num_unfinished():
                    continue
                results = self.backend.poll()
                polled = time.perf_counter()
                self.stats.last_step_at = time.monotonic()
                self.stats.steps += 1
                self.stats.step_seconds += polled - started
                for result in results:
                    self._on_result(result)
                self.writeback.flush()
                self.stats.handle_seconds += time.perf_counter() - polled
                self._note_peak()
        except BaseException as err:  # the engine is gone: fail every unit, let the owner decide
            log.error("engine loop failed %s", kv(error=repr(err)))
            with self._cond:
                self._fatal = err
                self._release_hunger(False)
            for future in list(self._futures.values()) + [f for _, f in self._incoming]:
                if not future.done():
                    future.set_exception(err)
            if self.on_fatal is not None:
                self.on_fatal(err)

    def _start(self, job: UnitJob, future: Future) -> None:
        key = id(job)
        self._futures[key] = future
        self._seq[key] = next(self._order)
        for index, request in enumerate(job.first_requests()):
            self._push(job, request, index)
        if job.done:  # every conversation failed before reaching the engine
            self._finish(job)

    def _push(self, job: UnitJob, request: GenerationRequest, index: int) -> None:
        priority = (self._seq[id(job)], index)
        heapq.heappush(self._pending, (priority, next(self._order), job, request))

    def _admit(self) -> None:
        backend, limits = self.backend, self.limits
        per_token = backend.capture_bytes_per_token
        while self._pending and backend.num_unfinished() < limits.max_requests_in_flight:
            _, _, job, request = self._pending[0]
            cost = (len(request.prompt_ids) + request.max_new_tokens) * per_token
            if self.capture_bytes + cost > limits.max_capture_bytes:
                if backend.num_unfinished():
                    break
                self.stats.over_bound_admissions += 1
                if not self._warned_bound:
                    self._warned_bound = True
                    log.warning(
                        "capture memory bound below one request's rows plus unfinished units; "
                        "admitting one at a time %s",
                        kv(bound_mb=limits.max_capture_bytes >> 20, request_mb=cost >> 20),
                    )
            heapq.heappop(self._pending)
            backend.submit(request, job.spec.generation)
            self._owner[request.request_id] = (job, cost)
            self._reserved += cost
            self.stats.requests += 1
            self.stats.peak_in_flight = max(self.stats.peak_in_flight, backend.num_unfinished())
            self._note_peak()

    def _note_peak(self) -> None:
        self.stats.peak_capture_bytes = max(self.stats.peak_capture_bytes, self.capture_bytes)

    def _on_result(self, result: Result) -> None:
        job, cost = self._owner.pop(result.request_id)
        self._reserved -= cost
        sample, follow_ups = job.on_result(result)
        if sample is not None:
            sid = result.request_id
            self.writeback.add(
                job.unit.unit_id,
                sample,
                provenance=job.spec.provenance,
                where=job.locations.get(sid, sid),
            )
        elif result.rows is not None:
            self.writeback.discard(result.rows)  # its rows become nobody's sample
        for request in follow_ups:
            self._push(job, request, -1)  # a next turn goes ahead of its unit's first turns
        if job.done:
            self._finish(job)

    def _finish(self, job: UnitJob) -> None:
        key = id(job)
        future = self._futures.pop(key)
        self._seq.pop(key, None)
        spec = job.spec

        def done(written: UnitWritten | None, error: BaseException | None) -> None:
            if error is not None:
                future.set_exception(error)
                return
            result = job.result
            for sid, record in written.row_errors:  # counted as samples when they returned
                prompt_tokens, generated_tokens = job.token_counts[sid]
                result.errors.append(record)
                result.num_samples -= 1
                result.num_prompt_tokens -= prompt_tokens
                result.num_generated_tokens -= generated_tokens
            result.shard = written.shard
            result.seconds = time.monotonic() - job.started
            future.set_result(result)

        target = ShardTarget(spec.dataset_uri, spec.endpoint_url, spec.provenance)
        self.writeback.finish(job.unit.unit_id, target, list(job.result.errors), done)
