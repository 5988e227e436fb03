"""A simulated multi-node Ray cluster: several raylets on this machine, two labelled racks.

`ray.cluster_utils.Cluster` starts one raylet per node, each with its own
resources and node labels; GPUs are declared (`num_gpus`), which is all the
scheduler looks at. Layout (`RACKS`): 2 racks x 2 nodes x 4 GPUs, labelled
`nvlink_domain=rack-<r>` like GB300 trays of one NVLink domain, plus a head
node without GPUs. The cluster keeps its files in its own temp dir, so no
other driver on this machine (`ray.init("auto")`) finds it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

NODES_PER_RACK = 2
GPUS_PER_NODE = 4
CPUS_PER_NODE = 2
RACKS = ("rack-0", "rack-1")


@pytest.fixture(scope="package")
def racks():
    """(cluster, {node id: rack}) with this process connected as a driver."""
    import placement_probe  # tests/cluster is on sys.path (pytest's rootdir insertion)
    import ray
    from ray.cluster_utils import Cluster

    # Workers import the probe by value (a test module is not on their path).
    ray.cloudpickle.register_pickle_by_value(placement_probe)
    if ray.is_initialized():  # a session-wide local Ray from another test package
        ray.shutdown()
    saved_address = os.environ.get("RAY_ADDRESS")  # Cluster points RAY_ADDRESS at itself
    temp_dir = tempfile.mkdtemp(prefix="rc-", dir="/tmp")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "temp_dir": temp_dir, "include_dashboard": False},
    )
    for rack in RACKS:
        for _ in range(NODES_PER_RACK):
            cluster.add_node(
                wait=False,
                num_cpus=CPUS_PER_NODE,
                num_gpus=GPUS_PER_NODE,
                labels={"nvlink_domain": rack, "gpu": "gb300"},
            )
    cluster.wait_for_nodes()
    ray.init(
        address=cluster.address,
        namespace="dspark-targets",
        log_to_driver=False,
        logging_level="WARNING",
    )
    node_rack = {
        n["NodeID"]: n["Labels"]["nvlink_domain"]
        for n in ray.nodes()
        if n["Alive"] and "nvlink_domain" in n.get("Labels", {})
    }
    assert len(node_rack) == len(RACKS) * NODES_PER_RACK, node_rack
    try:
        yield cluster, node_rack
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if saved_address is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = saved_address
