"""Fixtures of the training tests: a tiny draft spec and committed reference shards.

Torch runs single-threaded here: on a small shared machine OpenMP spin-waiting
made two threads ~40x slower than one (measured, see pipeline/train/toy_shards.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.train.model import DraftSpec

torch.set_num_threads(1)


def tiny_spec(**overrides) -> DraftSpec:
    base = dict(
        kind="dspark",
        vocab_size=50,
        hidden_size=32,
        target_hidden_size=32,
        aux_layer_ids=(1, 2),
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=512,
        block_size=4,
        mask_token_id=3,
        sample_from_anchor=True,
        markov_rank=8,
        confidence_head=True,
        confidence_with_markov=True,
    )
    base.update(overrides)
    return DraftSpec(**base)


@pytest.fixture(scope="session")
def toy_shards(tmp_path_factory, trained_target_dir) -> Path:
    """~90 first-turn samples of the trained toy target in two shards (~20 s once)."""
    from pipeline.train.toy_shards import write_reference_shards

    uri = tmp_path_factory.mktemp("train-shards") / "ds"
    write_reference_shards(uri, num_conversations=96, num_units=2)
    return uri
