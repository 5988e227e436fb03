"""Real CPU vLLM inside a Ray replica answers exactly as transformers does (greedy, float32)."""

import pytest
from transformers import AutoTokenizer

from pipeline.corpus.identity import sample_id
from pipeline.corpus.records import Conversation
from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
from pipeline.regenerate.config import parse_config
from pipeline.regenerate.driver.partition import plan_units
from pipeline.regenerate.driver.provenance import build_provenance
from pipeline.regenerate.units import UnitSpec
from pipeline.render import first_prompt, render_prompt
from pipeline.table.dataset import Dataset
from pipeline.table.reader import ShardReader
from pipeline.targets.base import GenerationRequest
from pipeline.targets.hf_backend import HFTarget

pytestmark = pytest.mark.slow

MIN_TOKENS = 16


def test_vllm_replica_in_ray_matches_transformers_greedy(trained_target_dir, ray_local, tmp_path):
    from pipeline.regenerate.driver.pool import close_replicas, start_replicas

    tok = AutoTokenizer.from_pretrained(trained_target_dir)
    # Math and code answers are long enough to compare well past 16 tokens.
    rows = list(
        generate(
            SyntheticCorpusConfig(
                num_conversations=8, seed=11, domains=("math", "code"), multi_turn_fraction=0.0
            )
        )
    )
    convs = [
        Conversation(r["id"], "syn", r["domain"], tuple(r["messages"]), f"syn:{i}")
        for i, r in enumerate(rows)
    ]
    # float32 on both sides: greedy decoding is then a pure function of the
    # weights, so any mismatch is a real difference (template, ids, positions,
    # stop handling), not bf16 rounding flipping a near-tie.
    config = parse_config(
        {
            "target": {
                "model": str(trained_target_dir),
                "dtype": "float32",
                "max_model_len": 512,
                "gpu_memory_utilization": 0.2,
            },
            "corpus": {"sources": [{"path": "unused.jsonl"}]},
            "generation": {"temperature": 0.0, "max_new_tokens": 48},
            "replicas": {"num_cpus": 1},
            "output": {"uri": str(tmp_path / "ds")},
            "regenerate": {"turns": "last"},
        },
        "test",
    )
    spec = UnitSpec.from_config(config, build_provenance(config, "c"))
    (unit,) = plan_units(convs, 1, "fp")
    actors, _ = start_replicas(config.target, config.replicas, config.regenerate)
    try:
        result = ray_local.get(actors[0].regenerate.remote(unit, spec))
    finally:
        close_replicas(actors)
    ds = Dataset.open(spec.dataset_uri)
    ds.commit([result.shard])
    vllm_out = {s.sample_id: s for s in ShardReader(ds, prefetch=0)}

    hf = HFTarget(config.target.model_copy(update={"backend": "hf"}), str(trained_target_dir))
    requests = [
        GenerationRequest(
            sample_id(c.conversation_id, 0), render_prompt(tok, first_prompt(list(c.messages)))
        )
        for c in convs
    ]
    compared = 0
    for h in hf.generate(requests, config.generation):
        v = vllm_out[h.request_id]
        answer = v.input_ids[v.num_prompt_tokens :].tolist()
        assert v.input_ids[: v.num_prompt_tokens].tolist() == h.prompt_ids
        assert answer == h.output_ids, (tok.decode(answer), tok.decode(h.output_ids))
        assert v.finish_reason == h.finish_reason
        compared += len(answer) >= MIN_TOKENS
    assert compared >= 6, "too few answers reached 16 tokens to make the comparison meaningful"
