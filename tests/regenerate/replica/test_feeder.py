"""One capture engine fed continuously (real CPU vLLM): interleaved units, turns, memory bound.

One engine for the module. A unit regenerated alone and the same unit
regenerated while three others share the engine hold the same samples, each
once, in sample-id order; every row's hidden states match a transformers
forward of its own stored tokens (bf16 results depend on batch composition,
so equality is within the capture parity tolerance, not bit for bit); a
turn's prompt carries the regenerated previous answer; captured memory stays
under the configured bound by the feeder's own accounting.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.corpus.records import Conversation
from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
from pipeline.regenerate.config import parse_config
from pipeline.regenerate.driver.partition import plan_units
from pipeline.regenerate.driver.provenance import build_provenance
from pipeline.regenerate.replica.feeder import EngineFeeder, FeedLimits
from pipeline.regenerate.units import UnitSpec
from pipeline.table.dataset import Dataset
from pipeline.table.reader import ShardReader

pytestmark = pytest.mark.slow

AUX_IDS = [1, 2, 3]
# Wider than tests/targets/test_capture_parity.py's 1.5: here rows come from a busy
# engine whose batch compositions vary, and bf16 results depend on them. On a host
# without bf16 arithmetic (AVX2: vLLM's kernels emulate it) the worst row of this test
# reached 2.06x HF's own bf16-vs-fp32 error (1.5 held on the AVX-512 hosts before). A
# wrong or shifted row is off by the activations' scale, far past either factor.
TOLERANCE_FACTOR = 2.5


@pytest.fixture(scope="module")
def setup(trained_target_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    from pipeline.targets.loader import load_target

    root = tmp_path_factory.mktemp("feeder")
    config = parse_config(
        {
            "target": {
                "model": str(trained_target_dir),
                "max_model_len": 1024,
                "gpu_memory_utilization": 0.15,
                "aux_layer_ids": AUX_IDS,
            },
            "corpus": {"sources": [{"path": "unused.jsonl"}]},
            "generation": {"max_new_tokens": 96},
            "output": {"uri": str(root / "ds")},
        },
        "test",
    )
    spec = UnitSpec.from_config(config, build_provenance(config, "c"))
    rows = generate(SyntheticCorpusConfig(num_conversations=48, seed=31, multi_turn_fraction=0.5))
    convs = [
        Conversation(r["id"], "syn", r["domain"], tuple(r["messages"]), f"syn:{i}")
        for i, r in enumerate(rows)
    ]
    units = plan_units(convs, 4, "fp")
    backend = load_target(config.target, capture=True)
    tok = AutoTokenizer.from_pretrained(trained_target_dir)
    yield backend, tok, spec, units
    backend.close()


def _run(backend, tok, spec, units, limits):
    feeder = EngineFeeder(backend, tok, limits)
    try:
        futures = [feeder.submit_unit(u, spec) for u in units]
        results = [f.result(timeout=900) for f in futures]
    finally:
        feeder.close()
    return results, feeder


def test_interleaved_unit_equals_the_unit_alone(setup, trained_target_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    backend, tok, spec, units = setup
    first = units[0]
    alone_spec = UnitSpec(**{**spec.__dict__, "dataset_uri": str(tmp_path / "alone")})
    busy_spec = UnitSpec(**{**spec.__dict__, "dataset_uri": str(tmp_path / "busy")})
    (alone,), _ = _run(backend, tok, alone_spec, [first], FeedLimits(64, 1 << 30))
    busy, feeder = _run(backend, tok, busy_spec, units, FeedLimits(64, 1 << 30))
    assert feeder.stats.peak_in_flight > first.num_answers  # other units shared the engine

    a = list(ShardReader(_commit(alone_spec, alone), prefetch=0))
    b = list(ShardReader(_commit(busy_spec, busy[0]), prefetch=0))
    expected = sorted(sid for c in first.conversations for sid in c.sample_ids())
    assert [s.sample_id for s in a] == expected  # each once, in sample-id order
    assert [s.sample_id for s in b] == expected

    models = {
        dtype: AutoModelForCausalLM.from_pretrained(trained_target_dir, dtype=dtype).eval()
        for dtype in (torch.float32, torch.bfloat16)
    }
    hidden = backend.hidden_size
    for row in a + b:
        ids = row.input_ids.long()[None, :-1]
        with torch.no_grad():
            ref32 = models[torch.float32](ids, output_hidden_states=True).hidden_states
            ref16 = models[torch.bfloat16](ids, output_hidden_states=True).hidden_states
        fed = ids.shape[1]
        got = row.hidden_states[:fed].float().view(fed, len(AUX_IDS), hidden)
        for j, aux in enumerate(AUX_IDS):
            err = (got[:, j] - ref32[aux][0]).abs().max().item()
            tol = TOLERANCE_FACTOR * (ref16[aux][0].float() - ref32[aux][0]).abs().max().item()
            assert err <= tol, (row.sample_id, aux, err, tol)
        assert not row.hidden_states[-1].any()

    # Turn j is conditioned on the regenerated turn j-1, whatever else ran.
    for rows in (a, b):
        by_id = {s.sample_id: s for s in rows}
        checked = 0
        for s in rows:
            stem, turn = s.sample_id.rsplit("-", 1)
            prev = by_id.get(f"{stem}-{int(turn) - 1:03d}")
            if prev is None:
                continue
            answer = tok.decode(prev.input_ids[prev.num_prompt_tokens :], skip_special_tokens=True)
            assert answer.strip() in tok.decode(s.input_ids[: s.num_prompt_tokens])
            checked += 1
        assert checked >= 2


def _commit(spec, result):
    ds = Dataset.open(spec.dataset_uri)
    ds.commit([result.shard])
    return ds


def test_captured_memory_stays_under_the_bound(setup, tmp_path):
    backend, tok, spec, units = setup
    spec = UnitSpec(**{**spec.__dict__, "dataset_uri": str(tmp_path / "bounded")})
    # Room for a couple dozen requests' rows at a time (prompt + 96-token budget each).
    bound = 24 * (400 + 96) * backend.capture_bytes_per_token
    results, feeder = _run(backend, tok, spec, units, FeedLimits(64, bound))
    assert sum(r.num_samples for r in results) == sum(u.num_answers for u in units) - sum(
        len(r.errors) for r in results
    )
    assert 0 < feeder.stats.peak_capture_bytes <= bound
    assert feeder.stats.over_bound_admissions == 0
    assert 1 < feeder.stats.peak_in_flight < 64  # the bound, not the request cap, limited it
    assert feeder.capture_bytes == 0  # everything released once the shards were written


def test_hungry_answers_once_every_request_is_in_the_engine(setup, tmp_path):
    backend, tok, spec, units = setup
    spec = UnitSpec(**{**spec.__dict__, "dataset_uri": str(tmp_path / "hunger")})
    unit = units[0]
    first_turns = len(unit.conversations)
    for cap in (64, 2):  # room for every first turn at once; room for two at a time
        feeder = EngineFeeder(backend, tok, FeedLimits(cap, 1 << 30))
        try:
            future = feeder.submit_unit(unit, spec)
            seen = {}
            hunger = feeder.hungry()
            hunger.add_done_callback(
                lambda f, seen=seen, feeder=feeder, future=future: seen.update(
                    requests=feeder.stats.requests, unit_done=future.done()
                )
            )
            assert hunger.result(timeout=900) is True
            # Every first turn was in the engine before it said so...
            assert seen["requests"] >= first_turns
            if cap == 64:  # ...and the unit's longest answers were still running.
                assert not seen["unit_done"]
            future.result(timeout=900)
        finally:
            feeder.close()
    stopped = feeder.hungry()
    assert stopped.result(timeout=5) is False  # a closed feeder never asks for more
