"""The replica pool on a Ray cluster: joining Ray, placing replicas, starting and stopping them.

Resources come from `ReplicaConfig`; a replica that spans many GPUs gets a
placement group whose bundles can be pinned to one NVLink domain with a
node-label selector (docs/design.md#ray-kuberay-and-placement). Placement rules, tested on a simulated
multi-node cluster in `tests/cluster/` (docs/cluster.md):

* A replica's bundles all carry its domain's label selector, so they land on
  nodes of that domain only; a domain with too few free resources makes the
  replica wait, never spill into another rack. Every placement group of a run
  is asked for at once and waited for up to `placement.timeout_s`; then the
  run stops with `PlacementTimeout`, naming each unplaced replica, its domain
  and what is free there, and releasing whatever was placed.
* Placement-group names carry the Ray job id, so a second run on the same
  cluster (a refresh beside a regeneration) never collides with the first.
* The replica actor runs in bundle 0 of its own placement group. vLLM, started
  inside that actor, takes the actor's placement group
  (`ray.util.get_current_placement_group()` in `EngineArgs`), puts worker
  rank r on the r-th GPU bundle and then moves the workers on the engine
  process's node to the front (`RayDistributedExecutor._init_workers_ray`,
  vLLM 0.32), so TP rank 0 runs on the actor's node. Rank 0 is the worker
  that writes the capture spool under that node's /dev/shm
  (`capture_connector.py`), which the actor reads.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from pipeline.errors import PipelineError
from pipeline.regenerate.config import CpuHostConfig, RayConfig, RegenerateConfig, ReplicaConfig
from pipeline.targets.config import TargetConfig

log = logging.getLogger(__name__)

REPLICA_NICE = 0  # a replica's nice value (start_replicas)

RAY_NAMESPACE = "dspark-targets"
# While placement groups are pending, say which ones and why: first after
# this many seconds, then every PLACEMENT_LOG_EVERY_S.
PLACEMENT_FIRST_LOG_S = 10.0
PLACEMENT_LOG_EVERY_S = 60.0

# Placement group of each started actor, removed by close_replicas.
_PLACEMENT_GROUPS: dict[Any, Any] = {}


class PlacementTimeout(PipelineError):
    """Some replica's placement group could not be placed in time; nothing was started."""


def init_ray(config: RayConfig) -> None:
    """Join the configured cluster (`ray.address`, else RAY_ADDRESS), or start a local one (idempotent)."""
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
    else:
        # Neither given: start a cluster of our own. Ray would otherwise join whatever
        # /tmp/ray/ray_current_cluster names, which a crashed run can leave stale.
        kwargs["address"] = "local"
        if config.num_cpus:
            kwargs["num_cpus"] = config.num_cpus
    if config.runtime_env:
        kwargs["runtime_env"] = config.runtime_env
    ray.init(**kwargs)


def placement_group_name(prefix: str | None, index: int, run_token: str) -> str:
    """`<prefix>-<index>-pg-<run token>`: unique per run (the token is the Ray job id)."""
    return f"{prefix or 'dspark-replica'}-{index}-pg-{run_token}"


def placement_group_args(
    replicas: ReplicaConfig, index: int, name: str | None = None
) -> dict[str, Any] | None:
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
        "name": name or placement_group_name(None, index, "local"),
    }
    if selector:
        kwargs["bundle_label_selector"] = [dict(selector) for _ in range(spec.num_bundles)]
    return kwargs


def check_placement(target: TargetConfig, replicas: ReplicaConfig) -> None:
    """Reject placements that could never start, before anything is asked of Ray."""
    spec = replicas.placement
    if spec is None:
        return
    bundle_cpus = spec.bundle.get("CPU", 0.0)
    if replicas.num_cpus > bundle_cpus:
        raise ValueError(
            f"replicas.num_cpus is {replicas.num_cpus:g} but a bundle has CPU {bundle_cpus:g}: "
            "the replica actor runs in bundle 0 of its placement group (beside vLLM's rank-0 "
            "worker), so raise replicas.placement.bundle.CPU or lower replicas.num_cpus"
        )
    gpu_bundles = spec.num_bundles if spec.bundle.get("GPU", 0.0) else 0
    if gpu_bundles and target.tensor_parallel_size > gpu_bundles:
        raise ValueError(
            f"target.tensor_parallel_size is {target.tensor_parallel_size} but a replica's "
            f"placement group has {gpu_bundles} GPU bundles: vLLM puts one worker on each; "
            "raise replicas.placement.num_bundles"
        )
    if replicas.num_gpus:
        log.warning(
            "replicas.num_gpus=%g is ignored with a placement group: vLLM's workers take the "
            "bundles' GPUs, the replica actor takes none",
            replicas.num_gpus,
        )


def place_replicas(replicas: ReplicaConfig, name_prefix: str | None = None) -> list[Any]:
    """One placement group per replica, all asked for at once; wait until every one is placed.

    Raises `PlacementTimeout` after `placement.timeout_s` (every placement group
    of this call removed). Returns [] for replicas without a placement.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    spec = replicas.placement
    if spec is None:
        return []
    token = ray.get_runtime_context().get_job_id()
    names = [placement_group_name(name_prefix, i, token) for i in range(replicas.num_replicas)]
    pgs = []
    try:
        for index, name in enumerate(names):
            pgs.append(placement_group(**placement_group_args(replicas, index, name)))
        _wait_placed(replicas, pgs, names, spec.timeout_s)
    except BaseException:
        for pg in pgs:
            remove_placement_group(pg)
        raise
    return pgs


def _wait_placed(
    replicas: ReplicaConfig, pgs: list[Any], names: list[str], timeout_s: float
) -> None:
    import ray

    started = time.monotonic()
    pending = {pg.ready(): index for index, pg in enumerate(pgs)}
    next_log = PLACEMENT_FIRST_LOG_S
    while pending:
        waited = time.monotonic() - started
        if waited >= timeout_s:
            lines = [_pending_line(replicas, i, names[i]) for i in sorted(pending.values())]
            raise PlacementTimeout(
                f"{len(pending)} of {len(pgs)} replica(s) not placed after {timeout_s:g} s "
                "(a replica waits for free resources in its own domain, never spills into "
                "another): " + "; ".join(lines) + ". Free those resources, add nodes with "
                "those labels, or raise replicas.placement.timeout_s; nothing was started"
            )
        budget = max(0.0, min(timeout_s, next_log) - waited)
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=budget)
        for ref in done:
            pending.pop(ref)
        waited = time.monotonic() - started
        if pending and next_log <= waited < timeout_s:
            for index in sorted(pending.values()):
                log.warning(
                    "waiting for placement (%.0f of %g s): %s",
                    waited,
                    timeout_s,
                    _pending_line(replicas, index, names[index]),
                )
            next_log = waited + PLACEMENT_LOG_EVERY_S


def _pending_line(replicas: ReplicaConfig, index: int, name: str) -> str:
    """What replica `index` asks for and what nodes of its domain have free."""
    spec = replicas.placement
    assert spec is not None
    want = ", ".join(f"{k} {v:g}" for k, v in spec.bundle.items())
    selector = dict(spec.bundle_label_selector)
    if spec.domains:
        selector[spec.domain_label] = spec.domains[index]
    where = ", ".join(f"{k}={v}" for k, v in selector.items()) or "any node"
    return (
        f"replica {index} (placement group {name}): {spec.num_bundles} bundles of "
        f"{{{want}}} {spec.strategy} on nodes labelled {where}; {_free_in(selector, spec.bundle)}"
    )


def _free_in(selector: dict[str, str], bundle: dict[str, float]) -> str:
    """`2 alive nodes with those labels, free GPU 3 of 8, CPU 6 of 8` (best effort)."""
    import ray

    try:
        from ray._private.state import available_resources_per_node

        free = available_resources_per_node()
        nodes = [
            n
            for n in ray.nodes()
            if n.get("Alive") and all(n.get("Labels", {}).get(k) == v for k, v in selector.items())
        ]
    except Exception as err:  # the message is still useful without the figures
        return f"free resources unknown ({type(err).__name__})"
    if not nodes:
        return "no alive node has those labels"
    parts = []
    for resource in bundle:
        total = sum(n["Resources"].get(resource, 0.0) for n in nodes)
        avail = sum(free.get(n["NodeID"], {}).get(resource, 0.0) for n in nodes)
        parts.append(f"{resource} {avail:g} of {total:g}")
    return f"{len(nodes)} alive node(s) with those labels, free " + ", ".join(parts)


def start_replicas(
    target: TargetConfig,
    replicas: ReplicaConfig,
    regenerate: RegenerateConfig,
    name_prefix: str | None = None,
    *,
    actor_class: type | None = None,
    cpu_host: CpuHostConfig | None = None,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Start `num_replicas` replica actors; wait until each engine is loaded.

    Returns the actors and what each `ready()` reported (pid, engine start
    seconds, units to keep in flight). `actor_class` defaults to
    `RegenerateReplica`; it is built as `actor_class(target, regenerate)` (plus
    `cpu_host=` when given) and must have `ready()` (the placement tests use
    one without an engine).

    Ray restarts a dead actor up to `max_restarts` times (its engine reloads in
    `__init__`); calls in flight on it fail, and the caller decides what to retry.
    With `name_prefix`, actor i is named `<prefix>-<i>` (operators find it with
    `ray.get_actor`; a second run under the same name fails fast instead of
    racing the first). If placement or any engine fails, everything started
    here is stopped and released before the error propagates.
    """
    import ray
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if actor_class is None:
        from pipeline.regenerate.replica.actor import RegenerateReplica

        actor_class = RegenerateReplica
    check_placement(target, replicas)
    pgs = place_replicas(replicas, name_prefix)
    remote_class = ray.remote(actor_class)
    actors: list[Any] = []
    try:
        for index in range(replicas.num_replicas):
            options: dict[str, Any] = {
                "num_cpus": replicas.num_cpus,
                "num_gpus": replicas.num_gpus,
                "max_restarts": replicas.max_restarts,
                "max_task_retries": 0,
                # Ray starts actors at nice 15, below its own daemons and the driver,
                # which would put the run's critical path last on the host's CPUs; the
                # replica (and its engine) runs at the driver's 0 instead (docs/capture.md,
                # "Priority"). Merged per variable with the job's runtime_env by Ray.
                "runtime_env": {"env_vars": {"RAY_worker_niceness": str(REPLICA_NICE)}},
            }
            if name_prefix:
                options["name"] = f"{name_prefix}-{index}"
            if pgs:
                # Bundle 0, beside vLLM's rank-0 worker (module docstring); the
                # actor takes no GPU: vLLM's workers claim the bundles' GPUs.
                options.update(
                    num_gpus=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pgs[index], placement_group_bundle_index=0
                    ),
                )
            extra = {"cpu_host": cpu_host} if cpu_host is not None else {}
            actor = remote_class.options(**options).remote(target, regenerate, **extra)
            actors.append(actor)
            if pgs:
                _PLACEMENT_GROUPS[actor] = pgs[index]
        return actors, _wait_ready(actors, replicas.start_timeout_s)
    except BaseException:
        for actor in actors:
            _PLACEMENT_GROUPS.pop(actor, None)
            ray.kill(actor)
        for pg in pgs:
            remove_placement_group(pg)
        raise


class ReplicaStartTimeout(PipelineError):
    """A replica was not up (scheduled and its engine loaded) within its start timeout."""


def _wait_ready(actors: list[Any], timeout_s: float) -> list[dict[str, Any]]:
    """Every actor's `ready()` answer, or ReplicaStartTimeout naming the ones not up."""
    import ray

    refs = [a.ready.remote() for a in actors]
    done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        late = [i for i, ref in enumerate(refs) if ref in set(pending)]
        free = ray.available_resources()
        raise ReplicaStartTimeout(
            f"replica(s) {late} not up after {timeout_s:g} s (not scheduled, or the engine did "
            f"not finish loading); free cluster resources: "
            + ", ".join(f"{k} {v:g}" for k, v in sorted(free.items()) if not k.startswith("node:"))
            + "; check the replica's Ray log, free resources, or raise replicas.start_timeout_s"
        )
    return ray.get(refs)


def replica_placement_group(actor: Any) -> Any | None:
    """The placement group `start_replicas` placed `actor` in (None without one)."""
    return _PLACEMENT_GROUPS.get(actor)


def close_replicas(actors: Sequence[Any], timeout_s: float = 60.0) -> None:
    """Close each replica's engine (its spool directory goes with it), kill the actor,
    and release its placement group.

    A replica that is dead or does not answer within `timeout_s` is killed anyway."""
    import ray
    from ray.util.placement_group import remove_placement_group

    pending = [actor.close.remote() for actor in actors]
    try:
        ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
    finally:
        for actor in actors:
            ray.kill(actor)
            pg = _PLACEMENT_GROUPS.pop(actor, None)
            if pg is not None:
                remove_placement_group(pg)
