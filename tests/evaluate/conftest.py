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


@pytest.fixture(scope="session")
def dspark_run(eval_shards, tmp_path_factory):
    """A DSpark draft in the fill-in layout (so vLLM's CPU build serves its backbone),
    60 steps (~40 s), a quarter of the samples held out, exported."""
    from pipeline.train.config import parse_train_config
    from pipeline.train.trainer import train

    out = tmp_path_factory.mktemp("dspark-run")
    config = parse_train_config(
        dict(
            target="toy:trained",
            data=dict(uri=str(eval_shards), num_anchors=64, heldout_fraction=0.25, prefetch=1),
            out_dir=str(out),
            num_steps=60,
            global_batch_size=8,
            draft=dict(
                kind="dspark", num_layers=2, block_size=5, markov_rank=32, sample_from_anchor=False
            ),
            optim=dict(lr=3e-3),
            checkpoint_every=60,
            log_every=1000,
            num_threads=1,
        )
    )
    result = train(config)
    assert result.dflash_dir is not None
    return out


@pytest.fixture(scope="session")
def eagle3_run(eval_shards, tmp_path_factory):
    """An EAGLE-3 draft (one layer, 5 unrolled steps) on the same shards and held-out
    split as `dspark_run`, 60 steps, exported (vLLM's CPU build serves eagle3)."""
    from pipeline.train.config import parse_train_config
    from pipeline.train.trainer import train

    out = tmp_path_factory.mktemp("eagle3-run")
    config = parse_train_config(
        dict(
            target="toy:trained",
            data=dict(uri=str(eval_shards), num_anchors=64, heldout_fraction=0.25, prefetch=1),
            out_dir=str(out),
            num_steps=60,
            global_batch_size=8,
            draft=dict(kind="eagle3", num_layers=1, block_size=5),
            optim=dict(lr=3e-3),
            checkpoint_every=60,
            log_every=1000,
            num_threads=1,
        )
    )
    train(config)
    return out
