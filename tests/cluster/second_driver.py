"""A second driver on the same cluster (another `ray job`): place one replica, report, stop.

    python tests/cluster/second_driver.py ADDRESS DOMAIN

Prints one JSON line: the placement group's name and the nodes of its bundles.
"""

from __future__ import annotations

import json
import sys


def main(address: str, domain: str) -> None:
    import ray
    from placement_probe import PlacementProbe  # this script's directory is on sys.path
    from ray.util.placement_group import placement_group_table

    from pipeline.regenerate.config import RegenerateConfig, ReplicaConfig
    from pipeline.regenerate.driver import pool
    from pipeline.targets.config import TargetConfig

    ray.init(address=address, namespace=pool.RAY_NAMESPACE, log_to_driver=False)
    replicas = ReplicaConfig.model_validate(
        {
            "num_replicas": 1,
            "num_cpus": 0.5,
            "placement": {
                "num_bundles": 8,
                "bundle": {"GPU": 1, "CPU": 0.5},
                "domains": [domain],
                "timeout_s": 20,
            },
        }
    )
    actors, _ = pool.start_replicas(
        TargetConfig(model="toy:random"), replicas, RegenerateConfig(), actor_class=PlacementProbe
    )
    pg = pool.replica_placement_group(actors[0])
    table = placement_group_table(pg)
    print(json.dumps({"name": table["name"], "nodes": list(table["bundles_to_node_id"].values())}))
    pool.close_replicas(actors)
    ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
