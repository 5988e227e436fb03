"""Shared fixtures: built toy targets (cached across runs) and a local Ray cluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def trained_target_dir() -> Path:
    """The trained toy target (built once per cache; ~4 min on two cores the first time)."""
    from pipeline.toy.target import build_toy_target

    return build_toy_target("trained")


@pytest.fixture(scope="session")
def toy_shards(tmp_path_factory, trained_target_dir) -> Path:
    """~90 first-turn samples of the trained toy target in two shards (~20 s once), for
    the training and draft tests."""
    from pipeline.demo.reference_shards import write_reference_shards

    uri = tmp_path_factory.mktemp("train-shards") / "ds"
    write_reference_shards(uri, num_conversations=96, num_units=2)
    return uri


@pytest.fixture(scope="session")
def random_target_dir(tmp_path_factory) -> Path:
    from pipeline.toy.target import build_toy_target

    return build_toy_target("random", tmp_path_factory.mktemp("toycache"))


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray cluster for the session (two CPUs, no dashboard)."""
    import ray

    if ray.is_initialized():  # a driver another test package left connected
        ray.shutdown()
    # address="local": a new local cluster, never one another test left discoverable.
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()
