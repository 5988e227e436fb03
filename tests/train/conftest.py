"""Fixtures of the training tests: a tiny draft spec and committed reference shards.

Torch runs single-threaded here: on a small shared machine OpenMP spin-waiting
made two threads ~40x slower than one (measured, see pipeline/demo/reference_shards.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from draft_specs import tiny_spec  # noqa: F401  (re-exported to the training tests)

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def toy_shards(tmp_path_factory, trained_target_dir) -> Path:
    """~90 first-turn samples of the trained toy target in two shards (~20 s once)."""
    from pipeline.demo.reference_shards import write_reference_shards

    uri = tmp_path_factory.mktemp("train-shards") / "ds"
    write_reference_shards(uri, num_conversations=96, num_units=2)
    return uri


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
    from pipeline.train.vllm_check import decode

    prompts = toy_prompts(trained_target_dir)
    return prompts, decode(trained_target_dir, prompts, max_tokens=SERVE_MAX_TOKENS)
