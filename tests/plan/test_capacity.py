"""The planner's arithmetic on inputs small enough to check by hand."""

from __future__ import annotations

import pytest

from pipeline.plan.capacity import RunShape, expected_nonempty, plan_capacity
from pipeline.plan.figures import (
    CODEC_RATIO,
    ENCODE_MBPS,
    REPLICA_TOK_S,
    Figure,
    codec_ratio,
    encode_mbps_per_core,
    replica_tok_s,
)
from pipeline.plan.inputs import Assumptions, CorpusStats, TargetStats

CORPUS = CorpusStats(num_conversations=1000, num_samples=2000, prompt_tokens=300, answer_tokens=100)
TARGET = TargetStats(hidden_size=1000, num_layers=40, params=1e9, vocab_size=1000)


def shape(**changes) -> RunShape:
    fields = dict(
        num_aux_layers=5,
        codec="bf16",
        num_units=10,
        commit_every_units=4,
        commit_every_seconds=1e9,
        num_replicas=2,
        gpus_per_replica=8,
        weight_bytes_per_param=2.0,
        max_capture_bytes=1 << 40,
        max_new_tokens=100,
        max_model_len=4096,
        requests_in_flight=64,
        units_in_flight=2,
        num_encode_workers=8,
    )
    return RunShape(**{**fields, **changes})


def plan(**kwargs):
    return plan_capacity(
        CORPUS,
        TARGET,
        kwargs.pop("shape", shape()),
        kwargs.pop("assume", Assumptions(shard_footer_bytes=0, token_bytes=5)),
        codec_ratio=Figure(0.5, "test"),
        encode_mbps=Figure(100.0, "test"),
        replica_tok_s=kwargs.pop("tok_s", Figure(1000.0, "test")),
        gpu_memory_gb=kwargs.pop("memory", Figure(288.0, "test")),
        train_gpu_tflops=Figure(1000.0, "test"),
    )


def test_storage_objects_rates_and_time_by_hand():
    p = plan()
    assert p.num_tokens == 2000 * 400 == 800_000
    assert p.raw_bytes_per_token == 6 * 1000 * 2  # 5 aux + final, bf16
    assert p.hidden_state_bytes == 800_000 * 12_000 * 0.5
    assert p.token_bytes == 800_000 * 5
    assert p.stored_bytes == p.hidden_state_bytes + p.token_bytes
    assert p.num_shards == 10 and p.num_versions == 3  # ceil(10 / 4)
    # shards + sidecars, 3 roots + 3 delta segments + 1 merge, _latest + lease + card
    assert p.num_objects == 2 * 10 + 3 + (3 + 1) + 3
    assert p.num_segments == 3 + 1
    # 1000 generated tok/s; 4 tokens captured per generated one (400 / 100).
    assert p.captured_tok_s == 4000
    assert p.raw_hidden_bytes_per_s == 4000 * 12_000  # 48 MB/s
    assert p.encode_cores == pytest.approx(0.48)  # at 100 MB/s per core
    assert p.stored_bytes_per_s == 48e6 * 0.5 + 4000 * 5
    assert p.replica_hours == pytest.approx(2000 * 100 / 1000 / 3600)
    assert p.wall_days == pytest.approx(p.replica_hours / 2 / 24)
    assert p.regen_gpu_hours == pytest.approx(p.replica_hours * 8)  # 8 GPUs per replica
    assert p.weight_bytes == 2e9 and p.replica_hbm_bytes == 8 * 288e9  # as given
    assert p.train_tokens == 800_000
    assert p.train_positions == 2000 * 100 * 8  # min(512 anchors, 100) x block 8
    assert p.warnings == []


def test_no_throughput_means_no_rates_or_time():
    p = plan(tok_s=None)
    assert p.captured_tok_s is None and p.wall_days is None and p.encode_cores is None
    assert p.stored_bytes > 0 and p.train_gpu_hours is not None


def test_warns_when_memory_bound_codec_or_units_limit_a_replica():
    p = plan(shape=shape(max_capture_bytes=64 << 20, num_encode_workers=0, requests_in_flight=64))
    text = "\n".join(p.warnings)
    assert "admits" in text and "fewer than the 64" in text
    assert "num_encode_workers=0" in text
    assert "a unit's encoded rows" in text


def test_shards_are_the_buckets_a_corpus_fills():
    assert expected_nonempty(12, 600) == pytest.approx(12, abs=1e-6)
    assert expected_nonempty(1000, 10) == pytest.approx(10, abs=0.1)  # sparse: one each
    assert plan(shape=shape(num_units=5000)).num_shards == round(expected_nonempty(5000, 1000))


def test_default_figures_name_their_benchmark_and_date():
    assert codec_ratio("fp8", False) == Figure(
        0.4149, "measured by bench/storage.py, 2026-11-30: P3_fp8_shard"
    )
    assert "regen_codec_encode_1t_MBps_per_cpu_s" in encode_mbps_per_core("bf16").source
    assert replica_tok_s("toy:large", "vllm").value == REPLICA_TOK_S[("toy:large", "vllm")].value
    assert replica_tok_s("Qwen/Qwen3-8B", "vllm") is None  # no measured setup


def test_default_figures_still_agree_with_the_benchmarks():
    # The planner reads no file at run time; a rerun benchmark that moves a figure
    # by more than a fifth is a default to update in pipeline/plan/figures.py.
    import json
    from pathlib import Path

    results = json.loads((Path(__file__).parents[2] / "bench/results.json").read_text())
    for measured in [*CODEC_RATIO.values(), *ENCODE_MBPS.values(), *REPLICA_TOK_S.values()]:
        assert measured.key in results, measured
        assert measured.value == pytest.approx(results[measured.key], rel=0.2), measured


def test_gpu_memory_comes_from_the_configured_gpu():
    p = plan(memory=Figure(80.0, "H100"))
    assert p.replica_hbm_bytes == 8 * 80e9
    assert plan(memory=None).replica_hbm_bytes is None  # no GPU named: no memory check


@pytest.mark.parametrize("units", [2, 400])  # few units in flight; so many they would spill
def test_the_suggested_memory_bound_admits_every_request(units):
    import re

    small = shape(max_capture_bytes=64 << 20, units_in_flight=units)
    warning = next(w for w in plan(shape=small).warnings if "admits" in w)
    suggested = int(re.search(r"set it to (\d+)", warning).group(1))
    # Rows of unfinished units past half the bound go to spill files, so the
    # suggestion never needs more than twice the requests' reservations.
    assert not [
        w
        for w in plan(
            shape=shape(max_capture_bytes=suggested << 20, units_in_flight=units)
        ).warnings
        if "admits" in w
    ]
    reserved_mb = 64 * 400 * 12_000 / 2**20  # requests x (300 prompt + 100 answer) x row bytes
    assert suggested <= 2 * reserved_mb + 1
