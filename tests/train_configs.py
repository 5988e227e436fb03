"""The training tests' config on the toy shards: small, fast, every key overridable."""

from __future__ import annotations

from pipeline.train.config import TrainConfig, parse_train_config


def toy_train_config(shards, out_dir, **overrides) -> TrainConfig:
    """A DSpark run of 8 steps of 4 sequences; a dict override merges into its section."""
    base = dict(
        target="toy:trained",
        data=dict(uri=str(shards), num_anchors=32, heldout_fraction=0.1, prefetch=1),
        out_dir=str(out_dir),
        num_steps=8,
        global_batch_size=4,
        draft=dict(num_layers=1, block_size=4, sample_from_anchor=False, markov_rank=16),
        optim=dict(lr=3e-3, warmup_fraction=0.1),
        checkpoint_every=4,
        log_every=100,
        num_threads=1,
    )
    for key, value in overrides.items():
        if isinstance(value, dict):
            base[key] = {**base.get(key, {}), **value}
        else:
            base[key] = value
    return parse_train_config(base)
