"""Which unit runs on which replica, and what happens when a replica fails, hangs or dies.

The driver's side of the replica pool, apart from planning and committing:

* units go to the least-loaded live replica with room (as many units as each
  asked for), preferring one the unit has not failed on;
* a replica may take more units than it asked for, up to its ceiling: with a
  `hunger` call, the scheduler keeps one in flight per replica while units
  wait, and the replica answers it when every request of the units it holds
  is in its engine and the engine has room. A unit's last requests (the long
  answers, the later turns of a conversation) hold its slot long after most
  of its requests are done, so a fixed count leaves the engine short of work;
  each answered call while the replica's slots are full adds one slot;
* a replica that dies (OOM, node loss, SIGKILL) fails its in-flight units
  with a `RayActorError`; they go back in the queue and the replica is
  probed: Ray restarts it (`replicas.max_restarts`) and it takes units again
  once its engine is up (a probe that finds it unavailable, i.e. restarting,
  is sent again), or it is dead for good (`ActorDiedError`) and leaves the pool;
* an error raised inside a unit is retried only when it is transient (a
  storage timeout, throttling), after a backoff with jitter; a deterministic
  one (bad data reaching the shard writer, a bug) fails the unit at once;
* a replica whose engine completes no step for `replica_stall_timeout_s`
  while it has work, or a unit past `unit_timeout_s`, means a hung engine:
  the replica is killed, Ray restarts it, and its units go elsewhere;
* `ray.wait` never blocks for longer than `poll_seconds`, so none of this
  waits on a hung replica.

A unit that exhausts `max_unit_attempts`, or whose every replica is dead, is
reported failed; everything else is committed by the caller.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.logs import kv
from pipeline.regenerate.units import WorkUnit

log = logging.getLogger(__name__)

PROBE_RETRY_S = 0.5  # between probes of a replica Ray is still restarting


@dataclass(frozen=True)
class SchedulerLimits:
    max_unit_attempts: int = 3
    unit_timeout_s: float = 7200.0
    replica_stall_timeout_s: float = 600.0
    # A replica Ray is restarting must be up again within this long, else it leaves the pool.
    replica_restart_timeout_s: float = 1800.0
    poll_seconds: float = 5.0
    # Backoff before retrying a unit after a transient error (full jitter).
    retry_base_delay_s: float = 2.0
    retry_max_delay_s: float = 60.0


@dataclass
class SchedulerReport:
    retries: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # unit id -> why
    replicas_restarted: int = 0
    replicas_lost: int = 0
    peak_units: list[int] = field(default_factory=list)  # most units each replica held at once


@dataclass
class _Replica:
    actor: Any
    capacity: int
    state: str = "up"  # up | probing | dead
    ceiling: int = 0  # the most units it may be given (hunger adds slots up to this)
    load: int = 0
    hunger: Any = None  # the hunger() call in flight
    probe: Any = None  # the ready() call in flight while it restarts
    probe_started: float = 0.0
    probe_after: float = 0.0  # when to ask again (a probe that found it still restarting)
    stats: Any = None  # the stats() call in flight (stall check)
    stats_sent: float = 0.0


class UnitScheduler:
    """Runs units on a pool of replica actors until each is done or failed for good."""

    def __init__(
        self,
        actors: list[Any],
        capacities: list[int],
        submit: Callable[[Any, WorkUnit], Any],
        limits: SchedulerLimits,
        *,
        hunger: Callable[[Any], Any] | None = None,
        ceilings: list[int] | None = None,
    ) -> None:
        ceilings = ceilings or capacities
        self.replicas = [
            _Replica(a, c, ceiling=max(c, top))
            for a, c, top in zip(actors, capacities, ceilings, strict=True)
        ]
        self.submit = submit  # (actor, unit) -> ObjectRef of its UnitResult
        self.hunger = hunger  # actor -> ObjectRef of a bool (see the module docstring)
        self.limits = limits
        self.report = SchedulerReport(peak_units=[0] * len(self.replicas))

    def run(
        self, units: list[WorkUnit], on_done: Callable[[WorkUnit, Any], None]
    ) -> SchedulerReport:
        import ray

        queue: deque[tuple[float, WorkUnit, int]] = deque((0.0, u, 1) for u in units)
        in_flight: dict[
            Any, tuple[WorkUnit, int, int, float]
        ] = {}  # ref -> unit, attempt, replica, t0
        failed_on: dict[str, set[int]] = {}
        while queue or in_flight:
            self._dispatch(queue, in_flight, failed_on)
            if not in_flight and queue and not self._live():
                for _, unit, _ in queue:
                    self.report.failed[unit.unit_id] = "no live replica left"
                break
            hungry = self._ask_hunger(queue)
            ready, _ = ray.wait(
                [*in_flight, *hungry], num_returns=1, timeout=self.limits.poll_seconds
            )
            for ref in ready:
                if ref in hungry:
                    self._on_hunger(hungry[ref], ref)
                    continue
                unit, attempt, index, _ = in_flight.pop(ref)
                self.replicas[index].load -= 1
                self._collect(ref, unit, attempt, index, queue, failed_on, on_done)
            self._check_replicas(in_flight, queue, failed_on)
        return self.report

    # ------------------------------------------------------------------ dispatch

    def _live(self) -> list[int]:
        return [i for i, r in enumerate(self.replicas) if r.state != "dead"]

    def _dispatch(self, queue, in_flight, failed_on) -> None:
        now = time.monotonic()
        for _ in range(len(queue)):
            not_before, unit, attempt = queue[0]
            if not_before > now:
                queue.rotate(-1)
                continue
            index = self._pick(failed_on.get(unit.unit_id, set()))
            if index is None:
                return
            queue.popleft()
            replica = self.replicas[index]
            in_flight[self.submit(replica.actor, unit)] = (unit, attempt, index, now)
            replica.load += 1
            peaks = self.report.peak_units
            peaks[index] = max(peaks[index], replica.load)

    def _ask_hunger(self, queue) -> dict[Any, int]:
        """Keep one hunger call in flight per replica that could grow, while units wait.

        Sent after this round's dispatch: a replica runs its calls in order, so
        it answers only once it holds every unit given to it so far.
        """
        if self.hunger is not None and queue:
            for replica in self.replicas:
                if replica.hunger is None and replica.state == "up":
                    if replica.capacity < replica.ceiling:
                        replica.hunger = self.hunger(replica.actor)
        return {r.hunger: i for i, r in enumerate(self.replicas) if r.hunger is not None}

    def _on_hunger(self, index: int, ref) -> None:
        import ray

        replica = self.replicas[index]
        replica.hunger = None
        try:
            hungry = ray.get(ref)
        except Exception:  # it died meanwhile: its units' results say so
            return
        if hungry and replica.state == "up" and replica.load >= replica.capacity:
            replica.capacity = min(replica.ceiling, replica.capacity + 1)
            log.debug("replica takes another unit %s", kv(replica=index, units=replica.capacity))

    def _pick(self, avoid: set[int]) -> int | None:
        """The least-loaded replica that is up and has room, preferring fresh ones."""
        candidates = [
            i for i, r in enumerate(self.replicas) if r.state == "up" and r.load < r.capacity
        ]
        if not candidates:
            return None
        fresh = [i for i in candidates if i not in avoid] or candidates
        return min(fresh, key=lambda i: (self.replicas[i].load, i))

    # ------------------------------------------------------------------ results and failures

    def _collect(self, ref, unit, attempt, index, queue, failed_on, on_done) -> None:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            result = ray.get(ref)
        except RayActorError as err:  # the replica died or restarted under the unit
            failed_on.setdefault(unit.unit_id, set()).add(index)
            self._start_probe(index)
            self._retry(unit, attempt, f"replica {index} lost ({type(err).__name__})", queue, 0.0)
            return
        except RayTaskError as err:
            failed_on.setdefault(unit.unit_id, set()).add(index)
            cause = err.cause if getattr(err, "cause", None) is not None else err
            if _transient(cause):
                delay = random.uniform(
                    0,
                    min(self.limits.retry_max_delay_s, self.limits.retry_base_delay_s * 2**attempt),
                )
                self._retry(
                    unit, attempt, f"transient {type(cause).__name__}: {cause}", queue, delay
                )
            else:
                why = f"{type(cause).__name__}: {cause}"
                log.error(
                    "unit failed (not retried: deterministic) %s", kv(unit=unit.unit_id, error=why)
                )
                self.report.failed[unit.unit_id] = why
            return
        on_done(unit, result)

    def _retry(self, unit, attempt, why, queue, delay) -> None:
        if attempt >= self.limits.max_unit_attempts:
            log.error("unit failed for good %s", kv(unit=unit.unit_id, attempts=attempt, why=why))
            self.report.failed[unit.unit_id] = f"{attempt} attempts; last: {why}"
            return
        log.warning("unit will be retried %s", kv(unit=unit.unit_id, attempt=attempt, why=why))
        self.report.retries += 1
        queue.append((time.monotonic() + delay, unit, attempt + 1))

    # ------------------------------------------------------------------ replica health

    def _start_probe(self, index: int) -> None:
        replica = self.replicas[index]
        if replica.state == "up":
            replica.state = "probing"
            replica.probe = replica.actor.ready.remote()  # answers once the restarted engine is up
            replica.probe_started = time.monotonic()

    def _check_replicas(self, in_flight, queue, failed_on) -> None:
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        now = time.monotonic()
        for index, replica in enumerate(self.replicas):
            if replica.state == "probing":
                if replica.probe is None and now >= replica.probe_after:
                    replica.probe = replica.actor.ready.remote()
                done = [] if replica.probe is None else ray.wait([replica.probe], timeout=0)[0]
                if not done and now - replica.probe_started > self.limits.replica_restart_timeout_s:
                    replica.state = "dead"
                    self.report.replicas_lost += 1
                    log.error("replica did not come back; it leaves the pool %s", kv(replica=index))
                elif done:
                    try:
                        info = ray.get(replica.probe)
                        replica.state, replica.probe = "up", None
                        replica.capacity = info["units_wanted"]
                        replica.ceiling = max(replica.capacity, info.get("max_units", 0))
                        replica.hunger = None  # a call to the dead process answers nothing
                        self.report.replicas_restarted += 1
                        log.info("replica back %s", kv(replica=index, pid=info["pid"]))
                    except ActorUnavailableError:
                        # Still restarting (a probe sent before Ray saw the death reaches
                        # the dead process): not dead, ask again shortly.
                        replica.probe, replica.probe_after = None, now + PROBE_RETRY_S
                    except (ActorDiedError, RayActorError) as err:
                        replica.state = "dead"
                        self.report.replicas_lost += 1
                        log.error(
                            "replica left the pool %s", kv(replica=index, error=type(err).__name__)
                        )
                continue
            if replica.state != "up":
                continue
            hung = [
                ref
                for ref, (_, _, i, started) in in_flight.items()
                if i == index and now - started > self.limits.unit_timeout_s
            ]
            if hung or self._stalled(replica, now):
                why = "unit past its deadline" if hung else "engine stalled"
                log.error("killing a hung replica %s", kv(replica=index, why=why))
                ray.kill(replica.actor, no_restart=False)  # Ray restarts it; its units fail over
                self._start_probe(index)

    def _stalled(self, replica: _Replica, now: float) -> bool:
        """True when the replica's engine has work but completed no step for too long."""
        import ray

        if replica.load == 0:
            replica.stats = None
            return False
        if replica.stats is None:
            if now - replica.stats_sent >= self.limits.poll_seconds:
                replica.stats, replica.stats_sent = replica.actor.stats.remote(), now
            return False
        done, _ = ray.wait([replica.stats], timeout=0)
        if not done:
            # No answer at all: the actor's own loop is stuck too.
            return now - replica.stats_sent > self.limits.replica_stall_timeout_s
        try:
            stats = ray.get(replica.stats)
        except Exception:  # it died meanwhile: the unit results will say so
            replica.stats = None
            return False
        replica.stats = None
        return (
            stats.get("in_flight", 0) > 0
            and stats.get("seconds_since_step", 0.0) > self.limits.replica_stall_timeout_s
        )


def _transient(err: BaseException) -> bool:
    """Storage and network errors worth a retry; anything else is deterministic."""
    from pipeline.storage import is_transient

    return is_transient(err) or isinstance(err, (TimeoutError, ConnectionError))
