"""The shard-streaming data path: epochs without the held-out split, anchors, packing,
resume position (validation and the split itself: tests/table/test_split.py)."""

from __future__ import annotations

import pytest
import torch

from pipeline.table.split import is_heldout, truncate
from pipeline.train.config import DraftConfig, TrainDataConfig, resolve_spec
from pipeline.train.data import DataPosition, TrainingData, iter_batches
from pipeline.train.packing import sample_anchors


@pytest.fixture(scope="module")
def data(toy_shards) -> TrainingData:
    return TrainingData(TrainDataConfig(uri=str(toy_shards), num_anchors=16, heldout_fraction=0.2))


@pytest.fixture(scope="module")
def spec(data, trained_target_dir):
    return resolve_spec(
        trained_target_dir,
        DraftConfig(num_layers=1, block_size=4, sample_from_anchor=False),
        data.provenance.aux_layer_ids,
        mask_token_id=3,
    )


def test_heldout_split_is_stable_and_never_trained(data):
    held = {r.sample_id for r in data.heldout_rows}
    train = {r.sample_id for r in data.train_rows}
    assert held and train and not held & train
    assert all(is_heldout(s, 0.2) for s in held)
    for epoch in range(2):
        assert not {r.sample_id for r in data.epoch_order(epoch, seed=0)} & held
    # Reshuffled per epoch, same rows.
    e0, e1 = data.epoch_order(0, seed=0), data.epoch_order(1, seed=0)
    assert e0 != e1 and sorted(map(str, e0)) == sorted(map(str, e1))


def test_batch_targets_are_the_next_tokens_of_each_packed_sample(data, spec):
    (batch,), pos = next(iter_batches(data, spec, seed=0, global_batch_size=4))
    assert pos == DataPosition(0, 4) and batch.num_samples == 4
    samples = data.decode(data.epoch_order(0, seed=0)[:4])
    inp = batch.inputs
    # Replay the packing: samples fill rows in order; doc = index within the row.
    where, row, used = {}, 0, 0
    for i, s in enumerate(samples):
        t = len(s.input_ids)
        if i and used + t <= data.cfg.max_row_tokens:
            used += t
        elif i:
            row, used = row + 1, t
        else:
            used = t
        where[(row, sum(1 for v in where.values() if v[0] == row))] = (row, i)
    checked = 0
    for (r, d), (_, i) in where.items():
        s = samples[i]
        start = int((inp.ctx_doc[r] == d).nonzero()[0])
        assert int((inp.ctx_doc[r] == d).sum()) == len(s.input_ids)
        for n in (inp.block_doc[r] == d).nonzero().squeeze(-1).tolist():
            a = int(inp.block_anchor[r, n])
            assert s.loss_mask[a] and s.loss_mask[a + 1]
            assert int(inp.block_ids[r, n, 0]) == int(s.input_ids[a])
            assert (inp.block_ids[r, n, 1:] == spec.mask_token_id).all()
            assert not batch.valid[r, n, 0]  # fill-in layout: the anchor slot drafts nothing
            for k in range(1, spec.block_size):
                if batch.valid[r, n, k]:
                    assert int(batch.target_ids[r, n, k]) == int(s.input_ids[a + k])
                    assert int(batch.teacher_index[r, n, k]) == start + a + k - 1
                    assert int(inp.prev_ids[r, n, k]) == int(s.input_ids[a + k - 1])
                    checked += 1
                else:
                    assert a + k >= len(s.input_ids) or not s.loss_mask[a + k]
    assert checked > 20


def test_anchors_only_on_answer_tokens_and_redrawn_per_epoch(data):
    samples = data.decode(data.epoch_order(0, seed=0)[:8])
    draws = {}
    for epoch in (0, 0, 1):
        anchors = sample_anchors(samples, num_anchors=3, seed=0, epoch=epoch)
        for s, a in zip(samples, anchors, strict=True):
            assert len(a) <= 3 and (a[1:] > a[:-1]).all()
            assert s.loss_mask[a].all() and s.loss_mask[a + 1].all()
        draws.setdefault(epoch, []).append([a.tolist() for a in anchors])
    assert draws[0][0] == draws[0][1]  # deterministic
    assert draws[0][0] != draws[1][0]  # reseeded each epoch


def test_resume_position_skips_exactly_what_was_consumed(data, spec):
    it = iter_batches(data, spec, seed=3, global_batch_size=4)
    seq = [next(it) for _ in range(5)]
    resumed = iter_batches(data, spec, seed=3, global_batch_size=4, start=seq[2][1])
    for ((want,), wpos), ((got,), gpos) in zip(
        seq[3:], [next(resumed) for _ in range(2)], strict=True
    ):
        assert wpos == gpos
        torch.testing.assert_close(got.inputs.block_ids, want.inputs.block_ids)
        torch.testing.assert_close(got.inputs.ctx_features, want.inputs.ctx_features)


def test_two_ranks_split_the_same_global_batch(data, spec):
    (whole,), _ = next(iter_batches(data, spec, seed=1, global_batch_size=4))
    parts = [
        next(iter_batches(data, spec, seed=1, global_batch_size=4, rank=r, world_size=2))[0][0]
        for r in (0, 1)
    ]
    assert sum(p.num_samples for p in parts) == whole.num_samples == 4
    assert sum(int(p.valid.sum()) for p in parts) == int(whole.valid.sum())


def test_micro_batches_split_the_step_into_the_same_blocks(data, spec):
    """k micro-batches hold exactly the samples and blocks of the one batch they replace."""
    (whole,), pos = next(iter_batches(data, spec, seed=2, global_batch_size=4))
    micro, mpos = next(iter_batches(data, spec, seed=2, global_batch_size=4, micro_batch_size=1))
    assert mpos == pos and len(micro) == 4 and [m.num_samples for m in micro] == [1] * 4
    assert sum(int(m.valid.sum()) for m in micro) == int(whole.valid.sum())
    got = sorted(
        (int(m.inputs.block_anchor[0, n]), tuple(m.target_ids[0, n].tolist()))
        for m in micro
        for n in (m.inputs.block_doc[0] >= 0).nonzero().squeeze(-1).tolist()
    )
    want = sorted(
        (int(whole.inputs.block_anchor[r, n]), tuple(whole.target_ids[r, n].tolist()))
        for r, n in (whole.inputs.block_doc >= 0).nonzero().tolist()
    )
    assert got == want


def test_long_samples_are_truncated_before_anchors_are_drawn(toy_shards, spec):
    cfg = TrainDataConfig(uri=str(toy_shards), num_anchors=8, heldout_fraction=0.1, max_seq_len=40)
    short = TrainingData(cfg)
    refs = short.epoch_order(0, seed=0)[:6]
    full = TrainingData(TrainDataConfig(uri=str(toy_shards), max_seq_len=None)).decode(refs)
    cut = short.decode(refs)
    assert max(len(s.input_ids) for s in full) > 40  # the data has longer samples
    for f, c in zip(full, cut, strict=True):
        n = min(len(f.input_ids), 40)
        assert len(c.input_ids) == n and c.hidden_states.shape[0] == n
        torch.testing.assert_close(c.input_ids, f.input_ids[:n])
        torch.testing.assert_close(c.last_hidden_state, f.last_hidden_state[:n])
        assert c.loss_mask.tolist() == f.loss_mask[:n].tolist()
        assert (c.finish_reason == "truncated") == (len(f.input_ids) > 40)
    assert truncate(full[0], None) is full[0]
    (batch,), _ = next(iter_batches(short, spec, seed=0, global_batch_size=4))
    assert int(batch.inputs.ctx_positions.max()) < 40
    assert (
        int(
            (batch.inputs.block_anchor[..., None] + torch.arange(spec.block_size))
            .masked_select(batch.valid)
            .max()
        )
        < 40
    )


def test_a_follower_pins_each_version_it_follows(toy_shards, tmp_path):
    import shutil

    from pipeline.table.dataset import Dataset
    from pipeline.table.pins import pinned_versions

    uri = tmp_path / "ds"
    shutil.copytree(toy_shards, uri)
    ds = Dataset.open(uri)
    ds.commit([], remove=[ds.manifest().shards[0].path])  # version 2 (no writer holds the lease)
    cfg = TrainDataConfig(uri=str(uri), version=1, follow=True, follow_poll_s=0.01)
    follower = TrainingData(cfg, pin_prefix="train-run-7.")
    assert sum(len(refs) for refs in follower.follow_order(seed=0)) > 0
    assert follower.manifest.version == 2
    assert pinned_versions(ds) == {"train-run-7.v000002": 2}
