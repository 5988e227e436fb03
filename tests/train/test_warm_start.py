"""Warm start: a DSpark draft begins from a trained DFlash checkpoint's shared tensors."""

from __future__ import annotations

import pytest
import torch
from train_configs import toy_train_config as _config

from pipeline.drafts.checkpoint import load_checkpoint
from pipeline.train.trainer import Trainer, train


@pytest.fixture(scope="module")
def dflash_run(toy_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("dflash")
    cfg = _config(toy_shards, out, num_steps=4, draft=dict(kind="dflash"))
    train(cfg, export=False)
    return out


def test_dspark_starts_from_a_dflash_checkpoint(toy_shards, dflash_run, tmp_path):
    source = load_checkpoint(dflash_run).model_state()
    warm = Trainer(_config(toy_shards, tmp_path / "warm", init_from=str(dflash_run)))
    warm.resume()
    cold = Trainer(_config(toy_shards, tmp_path / "cold"))  # same seed, no warm start
    cold.resume()
    mine, fresh = warm.model.state_dict(), cold.model.state_dict()
    shared = set(source) & set(mine)
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight", "norm.weight"} <= shared
    for name in shared:
        assert torch.equal(mine[name], source[name]), name
        assert not torch.equal(mine[name], fresh[name]) or name.endswith("norm.weight"), name
    heads = [n for n in mine if n.startswith(("markov_head.", "confidence_head."))]
    assert heads and not set(heads) & set(source)
    for name in heads:  # new heads: initialised as a cold start initialises them
        assert torch.equal(mine[name], fresh[name]), name


def test_a_resumed_run_keeps_its_own_weights(toy_shards, dflash_run, tmp_path):
    cfg = _config(toy_shards, tmp_path, num_steps=4, init_from=str(dflash_run))
    train(cfg, stop_after=2, export=False)
    own = load_checkpoint(tmp_path).model_state()
    trainer = Trainer(cfg)
    trainer.resume()
    assert torch.equal(trainer.model.state_dict()["fc.weight"], own["fc.weight"])


def test_a_draft_reading_other_layers_is_refused_in_one_line(toy_shards, dflash_run, tmp_path):
    cfg = _config(toy_shards, tmp_path, init_from=str(dflash_run), draft=dict(aux_layer_ids=[1, 3]))
    trainer = Trainer(cfg)
    with pytest.raises(ValueError, match=r"init_from .*aux_layer_ids is \(1, 2, 3\)") as err:
        trainer.resume()
    assert "\n" not in str(err.value)
