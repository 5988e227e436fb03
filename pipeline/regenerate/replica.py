"""Ray actors that each hold one target replica, and how they are started, placed and stopped.

The actor is a thin wrapper around a capturing `TargetBackend` and the unit
job (`unit.py`): all logic lives there, so it is testable without Ray.
Resources come from `ReplicaConfig`; a replica that spans many GPUs gets a placement group whose bundles can be
pinned to one NVLink domain with a node-label selector.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from pipeline.regenerate.config import RayConfig, RegenerateConfig, ReplicaConfig
from pipeline.regenerate.feeder import EngineFeeder, FeedLimits
from pipeline.regenerate.unit import UnitResult, UnitSpec
from pipeline.regenerate.units import WorkUnit
from pipeline.targets.base import StreamingBackend
from pipeline.targets.config import TargetConfig

log = logging.getLogger(__name__)

RAY_NAMESPACE = "dspark-targets"


class RegenerateReplica:
    """The replica actor's body: one capturing backend, fed continuously by an `EngineFeeder`.

    An async actor: every in-flight unit is one awaiting `regenerate` call
    (Ray runs up to 1000 at once), while the feeder's thread keeps the
    engine stepping. If the engine fails the process exits, so Ray restarts
    the actor with a fresh engine and the driver retries its units.
    """

    def __init__(self, target: TargetConfig, regenerate: RegenerateConfig) -> None:
        from transformers import AutoTokenizer

        from pipeline.logs import quiet_engine_output, setup_logging
        from pipeline.targets.loader import load_target
        from pipeline.targets.resolve import resolve_model

        setup_logging()
        quiet_engine_output()
        started = time.monotonic()
        self.backend = load_target(target, capture=True)
        self.start_seconds = time.monotonic() - started
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model(target.model), revision=target.revision
        )
        self.limits = feed_limits(regenerate, self.backend)
        self.units_wanted = regenerate.units_in_flight(self.limits.max_requests_in_flight)
        self.feeder = EngineFeeder(self.backend, tokenizer, self.limits, on_fatal=_exit_process)

    def ready(self) -> dict[str, Any]:
        """Process id, engine start seconds and how many units to keep in flight here."""
        return {
            "pid": os.getpid(),
            "start_seconds": self.start_seconds,
            "units_wanted": self.units_wanted,
            "max_requests_in_flight": self.limits.max_requests_in_flight,
        }

    async def regenerate(self, unit: WorkUnit, spec: UnitSpec) -> UnitResult:
        import asyncio

        return await asyncio.wrap_future(self.feeder.submit_unit(unit, spec))

    def stats(self) -> dict[str, Any]:
        """The feeder's counters (steps, peak captured bytes, ...) and the write-back's."""
        wb = self.feeder.writeback
        return {
            **self.feeder.stats.__dict__,
            "encode_seconds": wb.encode_seconds,
            "encoded_bytes": wb.encoded_bytes,
            "writeback_peak_bytes": wb.peak_nbytes,
            "max_capture_bytes": self.limits.max_capture_bytes,
        }

    def close(self) -> None:
        """Stop the feeder and the engine, remove the capture spool (ray.kill runs no finalizer)."""
        self.feeder.close()
        self.backend.close()


def feed_limits(regenerate: RegenerateConfig, backend: StreamingBackend) -> FeedLimits:
    """The feeder's limits for a backend under a regeneration config."""
    return FeedLimits(
        max_requests_in_flight=regenerate.requests_in_flight(backend.max_concurrency),
        max_capture_bytes=regenerate.max_capture_memory_mb << 20,
        num_encode_workers=regenerate.num_encode_workers,
        num_write_workers=regenerate.num_write_workers,
    )


def _exit_process(error: BaseException) -> None:
    """A dead engine leaves the actor useless: exit, so Ray restarts it with a fresh one."""
    log.error("replica exits after an engine failure: %r", error)
    os._exit(1)


def init_ray(config: RayConfig) -> None:
    """Join the configured cluster, or start a local one (idempotent)."""
    import ray

    if ray.is_initialized():
        return
    # One namespace, so named replicas are visible across drivers (an operator's
    # `ray.get_actor`, a second run under the same name failing fast).
    kwargs: dict[str, Any] = {
        "log_to_driver": True,
        "logging_level": logging.WARNING,
        "namespace": RAY_NAMESPACE,
    }
    if config.address:
        kwargs["address"] = config.address
    elif os.environ.get("RAY_ADDRESS"):
        # Under `ray job submit` the driver joins the job's cluster (RAY_ADDRESS);
        # a local-cluster size would be an error there, so it is ignored.
        if config.num_cpus:
            log.info("ray.num_cpus is ignored: joining the cluster at RAY_ADDRESS")
    elif config.num_cpus:
        kwargs["num_cpus"] = config.num_cpus
    if config.runtime_env:
        kwargs["runtime_env"] = config.runtime_env
    ray.init(**kwargs)


def placement_group_args(replicas: ReplicaConfig, index: int) -> dict[str, Any] | None:
    """`ray.util.placement_group` arguments for replica `index`, or None for a single device."""
    spec = replicas.placement
    if spec is None:
        return None
    selector = dict(spec.bundle_label_selector)
    if spec.domains:
        selector[spec.domain_label] = spec.domains[index]
    kwargs: dict[str, Any] = {
        "bundles": [dict(spec.bundle) for _ in range(spec.num_bundles)],
        "strategy": spec.strategy,
        "name": f"dspark-replica-{index}",
    }
    if selector:
        kwargs["bundle_label_selector"] = [dict(selector) for _ in range(spec.num_bundles)]
    return kwargs


def start_replicas(
    target: TargetConfig,
    replicas: ReplicaConfig,
    regenerate: RegenerateConfig,
    name_prefix: str | None = None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Start `num_replicas` `RegenerateReplica` actors; wait until each engine is loaded.

    Returns the actors and what each `ready()` reported (pid, engine start
    seconds, units to keep in flight).

    Ray restarts a dead actor up to `max_restarts` times (its engine reloads in
    `__init__`); calls in flight on it fail, and the caller decides what to retry.
    With `name_prefix`, actor i is named `<prefix>-<i>` (operators find it with
    `ray.get_actor`; a second run under the same name fails fast instead of
    racing the first).
    """
    import ray

    actors = []
    for index in range(replicas.num_replicas):
        options: dict[str, Any] = {
            "num_cpus": replicas.num_cpus,
            "num_gpus": replicas.num_gpus,
            "max_restarts": replicas.max_restarts,
            "max_task_retries": 0,
        }
        if name_prefix:
            options["name"] = f"{name_prefix}-{index}"
        pg_args = placement_group_args(replicas, index)
        if pg_args is not None:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            pg = placement_group(**pg_args)
            ray.get(pg.ready())
            # The actor itself takes no GPU: vLLM's workers claim the bundles.
            options.update(num_gpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(pg))
        actors.append(ray.remote(RegenerateReplica).options(**options).remote(target, regenerate))
    return actors, ray.get([a.ready.remote() for a in actors])


def close_replicas(actors: Sequence[Any], timeout_s: float = 60.0) -> None:
    """Close each replica's engine (its spool directory goes with it), then kill the actor.

    A replica that is dead or does not answer within `timeout_s` is killed anyway."""
    import ray

    pending = [actor.close.remote() for actor in actors]
    try:
        ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
    finally:
        for actor in actors:
            ray.kill(actor)
