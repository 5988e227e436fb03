"""End to end on a real local Ray: corpus -> committed version; rerun; SIGKILLed replica; bad rows."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from ray.exceptions import GetTimeoutError

from pipeline.corpus.ingest import load_corpus
from pipeline.regenerate.config import parse_config
from pipeline.regenerate.run import run_regenerate
from pipeline.table.dataset import Dataset
from pipeline.table.reader import ShardReader

pytestmark = pytest.mark.slow

# The production backend. ("hf" runs the same stage with the reference backend.)
BACKEND = os.environ.get("DSPARK_TEST_BACKEND", "vllm")

BAD_ROWS = [
    "this line is not JSON",
    json.dumps({"foo": "no conversation here"}),
    json.dumps({"messages": [{"role": "assistant", "content": "answer without a question"}]}),
    json.dumps({"messages": [{"role": "user", "content": "   "}]}),
]


def _config(tmp_path, num_replicas=1, **regenerate):
    extra = tmp_path / "extra.jsonl"
    good = [
        json.dumps({"prompt": f"What is the capital of Land{i}?", "domain": "qa"}) for i in range(3)
    ]
    extra.write_text("\n".join(good + BAD_ROWS) + "\n")
    return parse_config(
        {
            "target": {
                "model": "toy:trained",
                "backend": BACKEND,
                "max_model_len": 512,
                "gpu_memory_utilization": 0.1,
            },
            "corpus": {
                "synthetic": {"num_conversations": 10, "seed": 5, "multi_turn_fraction": 0.5},
                "sources": [{"path": str(extra)}],
            },
            "generation": {"max_new_tokens": 48},
            "replicas": {"num_replicas": num_replicas, "num_cpus": 1},
            "output": {"uri": str(tmp_path / "dataset")},
            "regenerate": {"conversations_per_unit": 2, **regenerate},
        },
        "test",
    )


def _expected_ids(config):
    corpus = load_corpus(config.corpus)
    return {sid for conv in corpus.conversations for sid in conv.sample_ids()}


def _committed_ids(uri):
    ids = [s.sample_id for s in ShardReader(uri, prefetch=0)]
    assert len(ids) == len(set(ids)), "a sample is committed twice"
    return set(ids)


def test_corpus_to_committed_version_then_rerun_commits_nothing(tmp_path, ray_local):
    config = _config(tmp_path)
    summary = run_regenerate(config, show_progress=False)
    assert summary.version is not None and summary.units_done == summary.units_total
    assert _committed_ids(config.output.uri) == _expected_ids(config)
    # vLLM's CPU worker binds its threads to a core of its own; the replica's
    # host work runs on the others (pipeline/regenerate/replica/cpu_host.py).
    allowed = sorted(os.sched_getaffinity(0))
    host = summary.replica_stats[0]["host_cpus"]
    if len(allowed) > 1:
        assert host and set(host) < set(allowed), host
        # The engine core takes turns with the model worker on the worker's CPUs
        # (cpu_host.py: where it always goes).
        core = summary.replica_stats[0]["engine_core_cpus"]
        assert core and set(core) == set(allowed) - set(host), (core, host)
    # The shards were built and written by the replica's write-back process, whose CPU
    # the replica accounts apart from its own (regenerate/replica/writeback_process.py).
    stats = summary.replica_stats[0]
    assert stats["writeback"] == "process" and stats["cpu_seconds"]["writeback"] > 0, stats
    # The malformed rows are reported by reason; the run did not stop for them.
    assert summary.errors_by_reason == {
        "unparsable_row": 1,
        "unknown_format": 1,
        "roles_do_not_alternate": 1,
        "empty_content": 1,
    }
    errors = Dataset.open(config.output.uri).storage.list("errors/")
    assert (
        len(errors) == 1
        and "extra.jsonl"
        in Dataset.open(config.output.uri).storage.read_bytes(errors[0].key).decode()
    )

    again = run_regenerate(config, show_progress=False)
    assert again.version == summary.version
    assert again.units_done == 0 and again.units_skipped == summary.units_total
    assert Dataset.open(config.output.uri).latest_version() == summary.version


def _replica(ray, config, index):
    from pipeline.regenerate.run import replica_name_prefix

    return ray.get_actor(f"{replica_name_prefix(config)}-{index}")


def test_sigkilled_replica_with_units_in_flight_every_sample_exactly_once(tmp_path, ray_local):
    config = _config(tmp_path, num_replicas=2, commit_every_units=1)
    outcome = {}
    runner = threading.Thread(
        target=lambda: outcome.update(summary=run_regenerate(config, show_progress=False))
    )
    runner.start()
    deadline = time.monotonic() + 600
    # Kill replica 0 the moment its engine has requests in flight: every unit
    # it was given is then under way (a replica works on all of them at once).
    stats = {}
    while time.monotonic() < deadline and runner.is_alive():
        try:
            actor = _replica(ray_local, config, 0)
            stats = ray_local.get(actor.stats.remote(), timeout=30)
        except (ValueError, GetTimeoutError):  # not created yet, or still loading its engine
            stats = {}
        if stats.get("requests"):
            break
        time.sleep(0.05)
    assert runner.is_alive(), "the run finished before a replica could be killed"
    pid = ray_local.get(actor.ready.remote())["pid"]
    os.kill(pid, signal.SIGKILL)
    runner.join(timeout=900)
    assert not runner.is_alive()
    summary = outcome["summary"]
    assert summary.retries >= 1 and not summary.units_failed
    assert _committed_ids(config.output.uri) == _expected_ids(config)
    _killed_engine_leftovers_removed(pid)


def _killed_engine_leftovers_removed(pid: int) -> None:
    """The SIGKILLed replica's spool lists its engine's shared memory (vLLM's rings, left in
    /dev/shm by the kill); removing the orphaned spool removes that too."""
    from pipeline.targets.spool_dirs import (
        SEGMENTS_FILE,
        SHM_DIR,
        SPOOL_DIR_PREFIX,
        remove_orphaned_spools,
    )

    spools = list(Path(SHM_DIR).glob(f"{SPOOL_DIR_PREFIX}{pid}-*"))
    assert len(spools) == 1, spools
    names = (spools[0] / SEGMENTS_FILE).read_text().split()
    assert any(n.startswith("psm_") for n in names), names
    left = [n for n in names if os.path.exists(os.path.join(SHM_DIR, n))]
    assert any(n.startswith("psm_") for n in left), "nothing was left to remove"
    assert str(spools[0]) in remove_orphaned_spools(SHM_DIR, idle_s=0)
    assert not [n for n in names if os.path.exists(os.path.join(SHM_DIR, n))]
