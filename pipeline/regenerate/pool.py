"""The replica pool on a Ray cluster: joining Ray, placing replicas, starting and stopping them.

Resources come from `ReplicaConfig`; a replica that spans many GPUs gets a
placement group whose bundles can be pinned to one NVLink domain with a
node-label selector (DESIGN.md §9).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from pipeline.regenerate.config import RayConfig, RegenerateConfig, ReplicaConfig
from pipeline.targets.config import TargetConfig

log = logging.getLogger(__name__)

RAY_NAMESPACE = "dspark-targets"


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

    from pipeline.regenerate.replica import RegenerateReplica

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
