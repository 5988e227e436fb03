"""A run with `draft.draft_vocab_size`: the vocabulary counted from the training split's
answers, the loss over it (CE of tokens outside masked and counted), the maps recorded
with the checkpoint (resume reuses them), the export carrying them, drafting in target ids."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from pipeline.drafts.checkpoint import load_checkpoint
from pipeline.drafts.load import load_draft, make_drafter
from pipeline.targets.resolve import resolve_model
from pipeline.train.config import parse_train_config
from pipeline.train.data import TrainingData
from pipeline.train.trainer import train
from pipeline.train.vocab import VOCAB_FILE, answer_token_counts, eos_token_ids

SIZE = 96


def _config(shards, out_dir, **draft):
    return parse_train_config(
        dict(
            target="toy:trained",
            data=dict(uri=str(shards), num_anchors=16, heldout_fraction=0.1, prefetch=1),
            out_dir=str(out_dir),
            num_steps=4,
            global_batch_size=4,
            draft={
                **dict(num_layers=1, block_size=4, markov_rank=8, draft_vocab_size=SIZE),
                **draft,
            },
            optim=dict(lr=3e-3, warmup_fraction=0.1),
            checkpoint_every=2,
            log_every=100,
            num_threads=1,
        )
    )


def test_counts_are_the_loss_masked_tokens_of_the_training_rows(toy_shards):
    cfg = _config(toy_shards, "unused")
    data = TrainingData(cfg.data)
    counts = answer_token_counts(data, 5000)
    expected = np.zeros(5000, dtype=np.int64)
    for sample in data.decode(data.train_rows):
        ids = sample.input_ids[sample.loss_mask.bool()].numpy()
        expected += np.bincount(ids, minlength=5000)
    np.testing.assert_array_equal(counts, expected)
    assert counts.sum() > 0


def test_a_reduced_vocabulary_trains_records_its_maps_and_exports_them(toy_shards, tmp_path):
    cfg = _config(toy_shards, tmp_path / "run")
    result = train(cfg, stop_after=2, export=False)
    spec = load_checkpoint(result.checkpoint).spec
    vocab = spec.draft_vocab
    assert len(vocab) == SIZE and list(vocab) == sorted(vocab)
    target_dir = resolve_model("toy:trained")
    assert set(eos_token_ids(target_dir)) <= set(vocab)
    record = json.loads((tmp_path / "run" / VOCAB_FILE).read_text())
    assert record["draft_vocab_size"] == SIZE and 0 < record["coverage"] < 1
    assert record["answer_tokens_outside"] > 0
    # The CE of tokens outside the vocabulary is masked and counted; the loss stays finite.
    rows = result.metrics
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert sum(r["ce_outside"] for r in rows) > 0
    # The resumed run keeps the recorded maps (the same spec), even if the data grew.
    (tmp_path / "run" / VOCAB_FILE).unlink()
    result = train(cfg, export=True)
    assert result.steps == 4
    assert load_checkpoint(result.checkpoint).spec.draft_vocab == vocab
    assert not (tmp_path / "run" / VOCAB_FILE).exists()  # not recounted
    # The export carries the maps; the draft loaded from it drafts target ids of the vocab.
    config = json.loads((result.export_dir / "config.json").read_text())
    assert config["draft_vocab_size"] == SIZE
    for source in (result.export_dir, tmp_path / "run"):
        loaded = load_draft(source, target_dir=target_dir)
        assert loaded.spec.draft_vocab == vocab
    data = TrainingData(cfg.data)
    sample = data.decode(data.heldout_rows[:1])[0]
    drafter = make_drafter("reduced", loaded)
    anchors = torch.arange(sample.num_prompt_tokens, sample.input_ids.shape[0] - 4, 5)
    tokens = drafter.draft(sample, anchors).tokens
    assert set(tokens.flatten().tolist()) <= set(vocab)


def test_full_vocabulary_runs_report_no_outside_tokens(toy_shards, tmp_path):
    cfg = _config(toy_shards, tmp_path / "full", draft_vocab_size=None).model_copy(
        update={"num_steps": 1}
    )
    result = train(cfg, export=False)
    assert load_checkpoint(result.checkpoint).spec.draft_vocab is None
    assert result.metrics[0]["ce_outside"] == 0
    assert not (tmp_path / "full" / VOCAB_FILE).exists()


def test_a_size_above_the_targets_vocabulary_is_refused():
    import pytest

    from pipeline.train.config import DraftConfig

    target = json.loads((Path(resolve_model("toy:trained")) / "config.json").read_text())
    draft = DraftConfig(num_layers=1, draft_vocab_size=target["vocab_size"] + 1)
    with pytest.raises(ValueError, match="exceeds the target's vocabulary"):
        draft.resolve(target, aux_layer_ids=[1, 2, 3], mask_token_id=3)
