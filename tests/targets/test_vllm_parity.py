"""Real CPU vLLM inside a Ray actor answers exactly as transformers does (greedy)."""

import pytest
from transformers import AutoTokenizer

from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
from pipeline.regenerate.config import ReplicaConfig
from pipeline.render import first_prompt, render_prompt
from pipeline.targets.base import GenerationRequest
from pipeline.targets.config import GenerationConfig, TargetConfig
from pipeline.targets.hf_backend import HFTarget

pytestmark = pytest.mark.slow

MIN_TOKENS = 16


def test_vllm_in_ray_actor_matches_transformers_greedy(trained_target_dir, ray_local):
    from pipeline.regenerate.replica import start_replicas

    tok = AutoTokenizer.from_pretrained(trained_target_dir)
    # Math and code answers are long enough to compare well past 16 tokens.
    convs = list(
        generate(SyntheticCorpusConfig(num_conversations=8, seed=11, domains=("math", "code")))
    )
    requests = [
        GenerationRequest(c["id"], render_prompt(tok, first_prompt(c["messages"]))) for c in convs
    ]
    params = GenerationConfig(temperature=0.0, max_new_tokens=48)
    # float32 on both sides: greedy decoding is then a pure function of the
    # weights, so any mismatch is a real difference (template, ids, positions,
    # stop handling), not bf16 rounding flipping a near-tie.
    target = TargetConfig(
        model=str(trained_target_dir),
        dtype="float32",
        max_model_len=512,
        gpu_memory_utilization=0.2,
    )
    (actor,) = start_replicas(target, ReplicaConfig(num_cpus=1))
    vllm_out = ray_local.get(actor.generate.remote(requests, params))
    ray_local.kill(actor)

    hf = HFTarget(target.model_copy(update={"backend": "hf"}), str(trained_target_dir))
    hf_out = hf.generate(requests, params)

    compared = 0
    for v, h in zip(vllm_out, hf_out, strict=True):
        assert v.request_id == h.request_id
        assert v.output_ids == h.output_ids, (tok.decode(v.output_ids), tok.decode(h.output_ids))
        assert v.finish_reason == h.finish_reason
        compared += len(v.output_ids) >= MIN_TOKENS
    assert compared >= 6, "too few answers reached 16 tokens to make the comparison meaningful"
