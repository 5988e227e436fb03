"""Fixtures of the evaluation tests. Torch single-threaded (two shared cores: OpenMP
spin-waiting made 2 threads ~40x slower than 1, see pipeline/train/toy_shards.py)."""

from __future__ import annotations

import torch

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def eval_shards(tmp_path_factory, trained_target_dir):
    """~60 first-turn samples of the trained toy target in two shards (~20 s once)."""
    from pipeline.train.toy_shards import write_reference_shards

    uri = tmp_path_factory.mktemp("eval-shards") / "ds"
    write_reference_shards(uri, num_conversations=64, num_units=2)
    return uri


def _train_run(shards, out, draft: dict):
    """60 steps of 8 sequences on `shards`, a quarter held out, exported (~40 s)."""
    from pipeline.train.config import parse_train_config
    from pipeline.train.trainer import train

    config = parse_train_config(
        dict(
            target="toy:trained",
            data=dict(uri=str(shards), num_anchors=64, heldout_fraction=0.25, prefetch=1),
            out_dir=str(out),
            num_steps=60,
            global_batch_size=8,
            draft=draft,
            optim=dict(lr=3e-3),
            checkpoint_every=60,
            log_every=1000,
            num_threads=1,
        )
    )
    return train(config)


@pytest.fixture(scope="session")
def dspark_run(eval_shards, tmp_path_factory):
    """A DSpark draft in the fill-in layout (so vLLM's CPU build serves its backbone)."""
    out = tmp_path_factory.mktemp("dspark-run")
    draft = dict(
        kind="dspark", num_layers=2, block_size=5, markov_rank=32, sample_from_anchor=False
    )
    assert _train_run(eval_shards, out, draft).dflash_dir is not None
    return out


@pytest.fixture(scope="session")
def eagle3_run(eval_shards, tmp_path_factory):
    """An EAGLE-3 draft (one layer, 5 unrolled steps) on the same shards and split as
    `dspark_run` (vLLM's CPU build serves eagle3)."""
    out = tmp_path_factory.mktemp("eagle3-run")
    _train_run(eval_shards, out, dict(kind="eagle3", num_layers=1, block_size=5))
    return out
