"""`make demo` trains DSpark and DFlash on equal terms: same shards, budget and backbone."""

from __future__ import annotations

import pytest

from pipeline.demo.train import DEMO_STEPS, demo_train_config


def test_demo_trains_dspark_and_dflash_with_the_same_budget(tmp_path):
    dspark = demo_train_config(tmp_path, "shards", kind="dspark")
    dflash = demo_train_config(tmp_path, "shards", kind="dflash")
    assert (dspark.draft.kind, dflash.draft.kind) == ("dspark", "dflash")
    assert dspark.out_dir != dflash.out_dir
    same = lambda c: (  # noqa: E731
        c.data,
        c.num_steps,
        c.global_batch_size,
        c.optim,
        c.seed,
        c.draft.num_layers,
        c.draft.block_size,
        c.draft.anchor_predicts,  # both in the fill-in layout: vLLM's CPU build serves them
    )
    assert same(dspark) == same(dflash) and dspark.num_steps == DEMO_STEPS
    # DSpark: 1.0 CE + 0.9 L1 + BCE (the config's loss.ce_weight); DFlash stays CE alone.
    assert dspark.loss.weights("dspark") == (1.0, 1.8, 1.0)
    assert dflash.loss.weights("dflash") == (1.0, 0.0, 0.0)
    # bench/demo_budget.py varies the seed and budget of exactly these configs.
    seeded = demo_train_config(
        tmp_path, "shards", kind="dflash", num_steps=7, overrides={"seed": 3}
    )
    assert (seeded.seed, seeded.num_steps, seeded.draft.kind) == (3, 7, "dflash")
    with pytest.raises(ValueError, match="the demo trains one of"):
        from pipeline.demo.train import train_demo_draft

        train_demo_draft(tmp_path, kind="medusa")
