"""Fixtures of the draft tests: torch single-threaded (two shared cores: OpenMP
spin-waiting made 2 threads ~40x slower than 1, see pipeline/demo/reference_shards.py),
and plain vLLM decoding of the toy target that the serving tests compare against."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)

# Generated tokens per prompt in the vLLM serving tests.
SERVE_MAX_TOKENS = 48


def toy_prompts(target_dir, n: int = 6) -> list[list[int]]:
    """Rendered first prompts of conversations the toy shards never contain."""
    from transformers import AutoTokenizer

    from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
    from pipeline.render import first_prompt, render_prompt

    tok = AutoTokenizer.from_pretrained(target_dir)
    convs = list(generate(SyntheticCorpusConfig(num_conversations=n, seed=12345)))  # not trained on
    return [render_prompt(tok, first_prompt(c["messages"])) for c in convs]


@pytest.fixture(scope="session")
def plain_toy_decode(trained_target_dir):
    """(prompts, plain greedy vLLM decoding of them): one engine start shared by every
    serving test, which then compares its speculative run against it (same batch)."""
    from pipeline.drafts.vllm_check import decode

    prompts = toy_prompts(trained_target_dir)
    return prompts, decode(trained_target_dir, prompts, max_tokens=SERVE_MAX_TOKENS)
