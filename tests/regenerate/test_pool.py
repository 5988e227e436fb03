from pipeline.regenerate.config import ReplicaConfig
from pipeline.regenerate.pool import placement_group_args


def test_single_device_replica_needs_no_placement_group():
    assert placement_group_args(ReplicaConfig(num_gpus=1), 0) is None


def test_rack_replica_pins_every_bundle_to_its_own_domain():
    replicas = ReplicaConfig.model_validate(
        {
            "num_replicas": 2,
            "placement": {
                "num_bundles": 72,
                "bundle": {"GPU": 1, "CPU": 8},
                "bundle_label_selector": {"gpu": "gb300"},
                "domains": ["rack-a", "rack-b"],
            },
        }
    )
    first, second = (placement_group_args(replicas, i) for i in range(2))
    assert len(first["bundles"]) == 72 and first["strategy"] == "PACK"
    assert first["bundle_label_selector"][0] == {"gpu": "gb300", "nvlink_domain": "rack-a"}
    assert {s["nvlink_domain"] for s in second["bundle_label_selector"]} == {"rack-b"}
    assert first["name"] != second["name"]
