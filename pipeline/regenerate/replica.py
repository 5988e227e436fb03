"""Ray actors that each hold one target replica, and how they are started, placed and stopped.

The actor is a thin wrapper around a capturing `TargetBackend` and the unit
job (`unit.py`): all logic lives there, so it is testable without Ray.
Resources come from `ReplicaConfig`; a replica that spans many GPUs gets a placement group whose bundles can be
pinned to one NVLink domain with a node-label selector.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from pipeline.regenerate.config import RayConfig, ReplicaConfig
from pipeline.regenerate.unit import UnitResult, UnitSpec, regenerate_unit
from pipeline.regenerate.units import WorkUnit
from pipeline.targets.base import Generation, GenerationRequest
from pipeline.targets.config import GenerationConfig, TargetConfig

log = logging.getLogger(__name__)

RAY_NAMESPACE = "dspark-targets"


class RegenerateReplica:
    """The replica actor's body: one capturing backend and its tokenizer.

    A thin wrapper (STYLE.md): `regenerate` calls the unit job, `generate`
    serves plain requests on the same engine (requests without capture
    parameters are not captured).
    """

    def __init__(self, target: TargetConfig) -> None:
        from transformers import AutoTokenizer

        from pipeline.logs import setup_logging
        from pipeline.targets.loader import load_target
        from pipeline.targets.resolve import resolve_model

        setup_logging()
        self.backend = load_target(target, capture=True)
        self.tokenizer = AutoTokenizer.from_pretrained(
            resolve_model(target.model), revision=target.revision
        )

    def ready(self) -> int:
        """The actor's process id (tests and operators signal it)."""
        return os.getpid()

    def regenerate(self, unit: WorkUnit, spec: UnitSpec) -> UnitResult:
        return regenerate_unit(self.backend, self.tokenizer, unit, spec)

    def generate(
        self, requests: Sequence[GenerationRequest], params: GenerationConfig
    ) -> list[Generation]:
        return self.backend.generate(requests, params)

    def close(self) -> None:
        """Stop the engine and remove its capture spool (ray.kill alone runs no finalizer)."""
        self.backend.close()


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
    target: TargetConfig, replicas: ReplicaConfig, name_prefix: str | None = None
) -> list[Any]:
    """Start `num_replicas` `RegenerateReplica` actors; wait until each engine is loaded.

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
        actors.append(ray.remote(RegenerateReplica).options(**options).remote(target))
    ray.get([a.ready.remote() for a in actors])
    return actors


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
