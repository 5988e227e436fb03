"""The per-unit job without Ray (feeder + transformers backend): rows, loss masks, history, errors."""

import pytest
import torch
from transformers import AutoTokenizer

from pipeline.corpus.identity import conversation_hash, sample_id
from pipeline.corpus.records import Conversation
from pipeline.regenerate.config import parse_config
from pipeline.regenerate.driver.partition import plan_units
from pipeline.regenerate.driver.provenance import build_provenance
from pipeline.regenerate.replica.feeder import EngineFeeder, FeedLimits
from pipeline.regenerate.units import UnitSpec
from pipeline.table.dataset import Dataset
from pipeline.table.reader import ShardReader
from pipeline.targets.config import TargetConfig
from pipeline.targets.hf_backend import HFTarget


def _conv(messages, location):
    return Conversation(conversation_hash(messages), "test", "qa", tuple(messages), location)


@pytest.fixture(scope="module")
def backend(trained_target_dir):
    return HFTarget(
        TargetConfig(model=str(trained_target_dir), backend="hf"), str(trained_target_dir)
    )


def regenerate_unit(backend, tokenizer, unit, spec):
    """One unit through the same feeder a replica runs, in this process."""
    feeder = EngineFeeder(backend, tokenizer, FeedLimits(4, 1 << 30))
    try:
        return feeder.submit_unit(unit, spec).result(timeout=600)
    finally:
        feeder.close()


def _spec(tmp_path, backend, trained_target_dir, turns="all"):
    config = parse_config(
        {
            "target": {
                "model": str(trained_target_dir),
                "backend": "hf",
                "max_model_len": 256,
                "aux_layer_ids": list(backend.aux_layer_ids),
            },
            "corpus": {"sources": [{"path": "unused.jsonl"}]},
            "generation": {"max_new_tokens": 40},
            "output": {"uri": str(tmp_path / "ds")},
            "regenerate": {"turns": turns},
        },
        "test",
    )
    return UnitSpec.from_config(config, build_provenance(config, corpus_version="c"))


def test_multi_turn_rows_use_the_regenerated_history(tmp_path, backend, trained_target_dir):
    tok = AutoTokenizer.from_pretrained(trained_target_dir)
    two_turns = _conv(
        [
            {"role": "user", "content": "What is the capital of Velmora?"},
            {"role": "assistant", "content": "ORIGINAL ANSWER"},
            {"role": "user", "content": "How many people live in it?"},
        ],
        "t:0",
    )
    single = _conv([{"role": "user", "content": "Hi!"}], "t:1")
    too_long = _conv([{"role": "user", "content": "word " * 400}], "t:2")
    (unit,) = plan_units([two_turns, single, too_long], 1, "fp")
    spec = _spec(tmp_path, backend, trained_target_dir)
    result = regenerate_unit(backend, tok, unit, spec)

    assert result.num_samples == 3
    assert [e.reason for e in result.errors] == ["prompt_too_long"]
    assert result.errors[0].location == "t:2 answer 0"
    ds = Dataset.open(spec.dataset_uri)
    ds.commit([result.shard])
    rows = {s.sample_id: s for s in ShardReader(ds, prefetch=0)}
    cid = two_turns.conversation_id
    assert set(rows) == {sample_id(cid, 0), sample_id(cid, 1), sample_id(single.conversation_id, 0)}
    first, second = rows[sample_id(cid, 0)], rows[sample_id(cid, 1)]
    answer0 = tok.decode(first.input_ids[first.num_prompt_tokens :], skip_special_tokens=True)
    prompt1 = tok.decode(second.input_ids[: second.num_prompt_tokens])
    # Turn 1 is conditioned on the regenerated answer 0, not the corpus' original one.
    assert answer0 in prompt1 and "ORIGINAL ANSWER" not in prompt1
    for row in rows.values():
        T = len(row.input_ids)
        assert row.loss_mask.sum().item() == row.num_generated_tokens == T - row.num_prompt_tokens
        assert not row.loss_mask[: row.num_prompt_tokens].any()
        assert row.hidden_states.shape == (T, 3 * backend.hidden_size)
        assert torch.count_nonzero(row.hidden_states[-1]) == 0  # the final token is never fed
        assert torch.count_nonzero(row.hidden_states[-2]) > 0
    errors = ds.storage.read_bytes(f"errors/{unit.unit_id}.jsonl").decode()
    assert "prompt_too_long" in errors and "t:2" in errors


def test_last_turn_mode_keeps_the_original_history(tmp_path, backend, trained_target_dir):
    tok = AutoTokenizer.from_pretrained(trained_target_dir)
    conv = _conv(
        [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "ORIGINAL ANSWER"},
            {"role": "user", "content": "Thanks!"},
        ],
        "t:0",
    )
    (unit,) = plan_units([conv], 1, "fp")
    spec = _spec(tmp_path, backend, trained_target_dir, turns="last")
    result = regenerate_unit(backend, tok, unit, spec)
    ds = Dataset.open(spec.dataset_uri)
    ds.commit([result.shard])
    (row,) = list(ShardReader(ds, prefetch=0))
    assert row.sample_id == sample_id(conv.conversation_id, 1)
    assert "ORIGINAL ANSWER" in tok.decode(row.input_ids[: row.num_prompt_tokens])
