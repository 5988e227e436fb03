"""A dataset version read as samples: its checks against a target and draft, and the
held-out split by sample-id hash that training and evaluation share."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.table.split import DataMismatchError, DatasetSplit, is_heldout


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
    split.check(target="toy:trained", target_config=cfg, aux_layer_ids=[1, 3])  # a subset
    with pytest.raises(
        DataMismatchError, match=r"draft.aux_layer_ids \[2, 4\]: \[4\] not captured"
    ) as err:
        split.check(target="toy:trained", target_config=cfg, aux_layer_ids=[2, 4])
    assert split.dataset.uri in str(err.value)


def test_a_subset_of_layers_decodes_to_those_columns_of_the_frame(toy_shards):
    """Captured (1, 2, 3): reading (1, 3) gives columns [0, H) and [2H, 3H) of the stored
    (T, 3H) frame, for training and held-out rows alike; the other fields unchanged."""
    full = DatasetSplit(str(toy_shards), heldout_fraction=0.2)
    sub = DatasetSplit(str(toy_shards), heldout_fraction=0.2)
    assert full.provenance.aux_layer_ids == (1, 2, 3)
    sub.read_layers([1, 3])
    h = full.provenance.hidden_size
    for refs in (full.train_rows[:3], full.heldout_rows[:3]):
        for whole, part in zip(full.decode(refs), sub.decode(refs), strict=True):
            assert whole.hidden_states.shape[1] == 3 * h and part.hidden_states.shape[1] == 2 * h
            want = torch.cat([whole.hidden_states[:, :h], whole.hidden_states[:, 2 * h :]], -1)
            assert torch.equal(part.hidden_states, want)
            assert torch.equal(part.input_ids, whole.input_ids)
            assert torch.equal(part.last_hidden_state, whole.last_hidden_state)
    sub.read_layers([3, 2])  # any order of captured ids: the draft's order
    (part,) = sub.decode(full.train_rows[:1])
    (whole,) = full.decode(full.train_rows[:1])
    assert torch.equal(part.hidden_states[:, :h], whole.hidden_states[:, 2 * h :])
    sub.read_layers(None)  # every captured layer again
    assert torch.equal(sub.decode(full.train_rows[:1])[0].hidden_states, whole.hidden_states)


def test_a_layer_the_dataset_did_not_capture_is_one_line_naming_it(toy_shards):
    split = DatasetSplit(str(toy_shards))
    with pytest.raises(DataMismatchError) as err:
        split.read_layers([2, 15, 27])
    msg = str(err.value)
    assert "\n" not in msg and split.dataset.uri in msg
    assert "[15, 27] not captured" in msg and "captured [1, 2, 3]" in msg
    assert split.layers is None  # unchanged


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


def test_sources_keep_and_exclude_rows_by_their_source_column(toy_shards):
    """A leave-one-source-out split: `exclude_sources` drops a source's rows, `sources`
    keeps only them (training reads the first, the left-out evaluation the second)."""
    every = DatasetSplit(str(toy_shards), heldout_fraction=0.2)
    (source,) = {s.source for s in every.decode(every.train_rows[:4] + every.heldout_rows[:4])}
    kept = DatasetSplit(str(toy_shards), heldout_fraction=0.2, sources=[source])
    assert kept.train_rows == every.train_rows and kept.heldout_rows == every.heldout_rows
    left_out = DatasetSplit(str(toy_shards), heldout_fraction=0.2, exclude_sources=[source])
    assert left_out.train_rows == [] and left_out.heldout_rows == []
    other = DatasetSplit(str(toy_shards), heldout_fraction=0.2, sources=["no-such-source"])
    assert other.train_rows == [] and other.heldout_rows == []
