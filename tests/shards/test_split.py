"""A dataset version read as samples: its checks against a target and draft, and the
held-out split by sample-id hash that training and evaluation share."""

from __future__ import annotations

import json

import pytest

from pipeline.shards.split import DataMismatchError, DatasetSplit, is_heldout


@pytest.fixture(scope="module")
def split(toy_shards) -> DatasetSplit:
    return DatasetSplit(str(toy_shards), heldout_fraction=0.2)


def test_check_rejects_other_target_and_layers(split, trained_target_dir, random_target_dir):
    cfg = json.loads((trained_target_dir / "config.json").read_text())
    split.check(target="toy:trained", target_config=cfg, aux_layer_ids=None)
    with pytest.raises(DataMismatchError, match=r"captured from target 'toy:trained'.*toy:random"):
        split.check(target="toy:random", target_config=cfg, aux_layer_ids=None)
    other = json.loads((random_target_dir / "config.json").read_text())
    with pytest.raises(DataMismatchError, match=r"hidden_size 128 != the target's hidden_size 64"):
        split.check(target="toy:trained", target_config=other, aux_layer_ids=None)
    with pytest.raises(DataMismatchError, match=r"draft.aux_layer_ids \[2, 3\]") as err:
        split.check(target="toy:trained", target_config=cfg, aux_layer_ids=[2, 3])
    assert split.dataset.uri in str(err.value)


def test_heldout_rows_are_the_hashed_ids_and_disjoint_from_training(split, toy_shards):
    held = {r.sample_id for r in split.heldout_rows}
    train = {r.sample_id for r in split.train_rows}
    assert held and train and not held & train
    assert all(is_heldout(s, 0.2) for s in held) and not any(is_heldout(s, 0.2) for s in train)
    # The same split for another reader of the same version (what evaluation relies on).
    again = DatasetSplit(str(toy_shards), heldout_fraction=0.2)
    assert {r.sample_id for r in again.heldout_rows} == held
    assert {s.sample_id for s in split.decode(split.heldout_rows[:3])} == {
        r.sample_id for r in split.heldout_rows[:3]
    }
