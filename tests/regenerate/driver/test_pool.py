from pipeline.regenerate.config import ReplicaConfig
from pipeline.regenerate.driver.pool import placement_group_args


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


def test_placement_group_names_differ_between_runs_and_replicas():
    from pipeline.regenerate.driver.pool import placement_group_name

    names = {placement_group_name("toy-regenerate", i, job) for i in (0, 1) for job in ("01", "02")}
    assert len(names) == 4
    assert placement_group_name(None, 0, "03000000") == "dspark-replica-0-pg-03000000"


def _rack(**replica_keys) -> ReplicaConfig:
    return ReplicaConfig.model_validate(
        {"placement": {"num_bundles": 72, "bundle": {"GPU": 1, "CPU": 8}}, **replica_keys}
    )


def test_replica_actor_must_fit_in_bundle_zero():
    import pytest

    from pipeline.regenerate.driver.pool import check_placement
    from pipeline.targets.config import TargetConfig

    target = TargetConfig(model="toy:random", tensor_parallel_size=72)
    check_placement(target, _rack(num_cpus=8))
    with pytest.raises(ValueError, match="replicas.num_cpus is 16 but a bundle has CPU 8"):
        check_placement(target, _rack(num_cpus=16))


def test_tensor_parallel_needs_a_gpu_bundle_per_worker():
    import pytest

    from pipeline.regenerate.driver.pool import check_placement
    from pipeline.targets.config import TargetConfig

    with pytest.raises(ValueError, match="tensor_parallel_size is 144 but .* 72 GPU bundles"):
        check_placement(TargetConfig(model="toy:random", tensor_parallel_size=144), _rack())


class _SlowEngine:
    """A replica stand-in whose engine never finishes loading (a fault injected on purpose)."""

    def __init__(self, target, regenerate) -> None:
        import time

        time.sleep(3600)

    def ready(self) -> dict:
        return {}


def test_a_replica_that_never_comes_up_stops_the_run_with_a_named_error(ray_local):
    import sys
    import time

    import pytest
    from ray import cloudpickle

    from pipeline.regenerate.config import RegenerateConfig
    from pipeline.regenerate.driver.pool import ReplicaStartTimeout, start_replicas
    from pipeline.targets.config import TargetConfig

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not on Ray's path
    started = time.monotonic()
    with pytest.raises(ReplicaStartTimeout, match=r"replica\(s\) \[0\] not up after 3 s"):
        start_replicas(
            TargetConfig(model="toy:random"),
            ReplicaConfig(num_cpus=0.5, start_timeout_s=3),
            RegenerateConfig(),
            actor_class=_SlowEngine,
        )
    assert time.monotonic() - started < 60


class _NiceProbe:
    """A replica stand-in that reports its process's nice value."""

    def __init__(self, target=None, regenerate=None) -> None:
        pass

    def ready(self) -> dict:
        import os

        return {"nice": os.getpriority(os.PRIO_PROCESS, 0)}

    def close(self) -> None:
        pass


def test_replicas_run_at_the_drivers_nice_value_not_rays_worker_default(ray_local):
    import os
    import sys

    from ray import cloudpickle

    from pipeline.regenerate.config import RegenerateConfig
    from pipeline.regenerate.driver.pool import close_replicas, start_replicas
    from pipeline.targets.config import TargetConfig

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    base = os.getpriority(os.PRIO_PROCESS, 0)  # Ray's processes start from the driver's
    plain = ray_local.remote(_NiceProbe).options(num_cpus=0.1).remote()
    # The control: a plain actor runs at Ray's default (15), so the check below can fail.
    assert ray_local.get(plain.ready.remote(), timeout=120)["nice"] == min(19, base + 15)
    ray_local.kill(plain)
    actors, ready = start_replicas(
        TargetConfig(model="toy:random"),
        ReplicaConfig(num_cpus=0.1),
        RegenerateConfig(),
        actor_class=_NiceProbe,
    )
    try:
        assert [r["nice"] for r in ready] == [base]
    finally:
        close_replicas(actors)
