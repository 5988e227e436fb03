"""Replica placement on a simulated cluster of 4 GPU nodes in 2 racks (conftest.py).

The actors are `PlacementProbe`s, placed by the production `start_replicas`
exactly as replica actors are (no engine is loaded); the assertions are about
where bundles and actors land, what waits, and what is released.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from placement_probe import PlacementProbe

from pipeline.regenerate.config import RegenerateConfig, ReplicaConfig
from pipeline.regenerate.driver import pool
from pipeline.targets.config import TargetConfig

ROOT = Path(__file__).resolve().parents[2]
TARGET = TargetConfig(model="toy:random")


def rack_replicas(domains: list[str], timeout_s: float = 20.0) -> ReplicaConfig:
    """One replica per rack: 8 one-GPU bundles (two 4-GPU nodes), PACK, pinned by label."""
    return ReplicaConfig.model_validate(
        {
            "num_replicas": len(domains),
            "num_cpus": 0.5,
            "placement": {
                "num_bundles": 8,
                "bundle": {"GPU": 1, "CPU": 0.5},
                "strategy": "PACK",
                "bundle_label_selector": {"gpu": "gb300"},
                "domains": domains,
                "timeout_s": timeout_s,
            },
        }
    )


def bundle_nodes(pg) -> list[str]:
    from ray.util.placement_group import placement_group_table

    table = placement_group_table(pg)["bundles_to_node_id"]
    return [table[i] for i in sorted(table)]


def free_gpus(node_rack: dict[str, str], rack: str) -> float:
    from ray._private.state import available_resources_per_node

    free = available_resources_per_node()
    return sum(free.get(n, {}).get("GPU", 0.0) for n, r in node_rack.items() if r == rack)


def wait_free(node_rack: dict[str, str], rack: str, gpus: float, timeout_s: float = 10.0) -> None:
    """Released resources reach the GCS's view a moment later."""
    deadline = time.monotonic() + timeout_s
    while free_gpus(node_rack, rack) < gpus and time.monotonic() < deadline:
        time.sleep(0.1)
    assert free_gpus(node_rack, rack) == gpus


def test_each_replica_on_its_own_rack_actor_beside_bundle_zero(racks):
    _, node_rack = racks
    actors, ready = pool.start_replicas(
        TARGET, rack_replicas(["rack-0", "rack-1"]), RegenerateConfig(), actor_class=PlacementProbe
    )
    try:
        for index, (actor, info) in enumerate(zip(actors, ready, strict=True)):
            pg = pool.replica_placement_group(actor)
            nodes = bundle_nodes(pg)
            # Every bundle on a node of the replica's own rack, the rack's two nodes used.
            assert {node_rack[n] for n in nodes} == {f"rack-{index}"}
            assert len(set(nodes)) == 2
            # The actor runs on bundle 0's node, inside its own placement group
            # (the one vLLM takes for its workers: rank 0 lands on this node).
            assert info["node_id"] == nodes[0]
            assert info["placement_group"] == pg.id.hex()
        assert free_gpus(node_rack, "rack-0") == free_gpus(node_rack, "rack-1") == 0
    finally:
        pool.close_replicas(actors)
    # Closing releases the racks.
    wait_free(node_rack, "rack-0", 8)
    wait_free(node_rack, "rack-1", 8)


def test_full_rack_waits_with_a_message_never_spills_then_times_out(racks, caplog, monkeypatch):
    from ray.util.placement_group import placement_group, remove_placement_group

    _, node_rack = racks
    # Someone else holds half of rack-1; rack-0 is entirely free.
    blocker = placement_group(
        [{"GPU": 1}] * 4, strategy="PACK", bundle_label_selector=[{"nvlink_domain": "rack-1"}] * 4
    )
    import ray

    ray.get(blocker.ready(), timeout=10)
    monkeypatch.setattr(pool, "PLACEMENT_FIRST_LOG_S", 0.5)
    caplog.set_level(logging.WARNING, logger=pool.__name__)
    started = time.monotonic()
    try:
        with pytest.raises(pool.PlacementTimeout) as err:
            pool.start_replicas(
                TARGET,
                rack_replicas(["rack-1"], timeout_s=2.0),
                RegenerateConfig(),
                actor_class=PlacementProbe,
            )
        assert 2.0 <= time.monotonic() - started < 10
        message = str(err.value)
        assert "1 of 1 replica(s) not placed after 2 s" in message
        assert "nvlink_domain=rack-1" in message and "free GPU 4 of 8" in message
        assert "replicas.placement.timeout_s" in message
        # While it waited it said why, and it never took anything in rack-0.
        assert any(
            "waiting for placement" in r.message and "rack-1" in r.message for r in caplog.records
        )
        assert free_gpus(node_rack, "rack-0") == 8
        wait_free(node_rack, "rack-1", 4)  # the timed-out group was removed
    finally:
        remove_placement_group(blocker)
    wait_free(node_rack, "rack-1", 8)


def test_waiting_replica_is_placed_in_its_rack_once_resources_free_up(racks):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    _, node_rack = racks
    blocker = placement_group(
        [{"GPU": 1}] * 2, strategy="PACK", bundle_label_selector=[{"nvlink_domain": "rack-0"}] * 2
    )
    ray.get(blocker.ready(), timeout=10)
    result: dict = {}

    def start() -> None:
        try:
            result["actors"], _ = pool.start_replicas(
                TARGET, rack_replicas(["rack-0"]), RegenerateConfig(), actor_class=PlacementProbe
            )
        except BaseException as err:  # reported by the assertion below
            result["error"] = err

    thread = threading.Thread(target=start)
    thread.start()
    time.sleep(2.0)
    # Still waiting, and rack-1 (entirely free) was not used instead.
    assert thread.is_alive() and free_gpus(node_rack, "rack-1") == 8
    remove_placement_group(blocker)
    thread.join(timeout=20)
    assert "error" not in result, result.get("error")
    (actor,) = result["actors"]
    try:
        assert {node_rack[n] for n in bundle_nodes(pool.replica_placement_group(actor))} == {
            "rack-0"
        }
    finally:
        pool.close_replicas(result["actors"])
    wait_free(node_rack, "rack-0", 8)


def test_second_run_on_the_same_cluster_does_not_collide(racks):
    """A refresh beside a regeneration: two drivers, each placing its replica 0."""
    cluster, node_rack = racks
    actors, _ = pool.start_replicas(
        TARGET, rack_replicas(["rack-0"]), RegenerateConfig(), actor_class=PlacementProbe
    )
    try:
        from ray.util.placement_group import placement_group_table

        first = placement_group_table(pool.replica_placement_group(actors[0]))["name"]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        out = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).parent / "second_driver.py"),
                cluster.address,
                "rack-1",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        second = json.loads(out.stdout.strip().splitlines()[-1])
        assert first.startswith("dspark-replica-0-pg-") and second["name"].startswith(
            "dspark-replica-0-pg-"
        )
        assert first != second["name"]
        assert {node_rack[n] for n in second["nodes"]} == {"rack-1"}
    finally:
        pool.close_replicas(actors)
    wait_free(node_rack, "rack-0", 8)
