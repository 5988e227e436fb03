"""Fixtures of the evaluation tests. Torch single-threaded (two shared cores: OpenMP
spin-waiting made 2 threads ~40x slower than 1, see pipeline/demo/reference_shards.py)."""

from __future__ import annotations

import torch

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def eval_shards(tmp_path_factory, trained_target_dir):
    """~60 first-turn samples of the trained toy target in two shards (~20 s once)."""
    from pipeline.demo.reference_shards import write_reference_shards

    uri = tmp_path_factory.mktemp("eval-shards") / "ds"
    write_reference_shards(uri, num_conversations=64, num_units=2)
    return uri


def _train_run(shards, out, draft: dict):
    """60 steps, a quarter of the samples held out, exported (~40 s)."""
    from draft_specs import train_small_draft

    return train_small_draft(shards, out, draft, heldout_fraction=0.25)


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


@pytest.fixture(scope="session")
def dflash_run(eval_shards, tmp_path_factory):
    """A one-layer DFlash draft, 20 steps on the same shards and split, reading two of the
    three captured layers (its export is what vLLM's dflash method serves; the serving
    tests need speed figures, not a good tau)."""
    from draft_specs import train_small_draft

    out = tmp_path_factory.mktemp("dflash-run")
    train_small_draft(
        eval_shards, out, dict(kind="dflash", num_layers=1, block_size=4, aux_layer_ids=[1, 3]),
        num_steps=20,
        heldout_fraction=0.25,
    )  # fmt: skip
    return out
