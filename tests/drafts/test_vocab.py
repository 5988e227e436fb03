"""A reduced draft vocabulary: the selection, the d2t/t2d maps, the draft's head over it,
drafting mapped back to target ids, and exports that carry the maps (read back by us)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from draft_specs import SMALL, random_sample, tiny_spec

from pipeline.drafts.export import TARGET_TENSORS, export_draft, read_export
from pipeline.drafts.load import load_draft, make_drafter
from pipeline.drafts.registry import build_draft
from pipeline.drafts.target_head import load_target_head
from pipeline.drafts.vocab import (
    coverage,
    d2t_of,
    select_draft_vocab,
    t2d_of,
    vocab_from_maps,
)

V, H = SMALL["vocab_size"], SMALL["hidden_size"]


# ------------------------------------------------------------------ selection and maps


def test_selection_takes_the_most_frequent_tokens_ties_by_smaller_id():
    counts = np.zeros(10, dtype=np.int64)
    counts[[7, 2, 5, 9]] = [50, 30, 30, 1]
    # 7 (50), then the tie 2 and 5 (30) in id order: size 2 keeps 7 and 2, not 5.
    assert select_draft_vocab(counts, 2) == (2, 7)
    assert select_draft_vocab(counts, 3) == (2, 5, 7)
    # EOS kept whatever its count; the most frequent rest fill up.
    assert select_draft_vocab(counts, 3, always=[4]) == (2, 4, 7)
    # Larger than the tokens seen: the smallest unseen ids fill it (as speculators does).
    assert select_draft_vocab(counts, 6) == (0, 1, 2, 5, 7, 9)
    # Deterministic: the same counts give the same vocabulary, shuffled input order or not.
    assert select_draft_vocab(counts.copy(), 3) == select_draft_vocab(counts, 3)


def test_selection_refuses_impossible_sizes():
    counts = np.ones(10, dtype=np.int64)
    with pytest.raises(ValueError, match="must be in 1..10"):
        select_draft_vocab(counts, 11)
    with pytest.raises(ValueError, match="cannot hold"):
        select_draft_vocab(counts, 1, always=[3, 4])


def test_d2t_offsets_and_t2d_round_trip():
    vocab = (0, 3, 4, 9, 17)
    d2t, t2d = d2t_of(vocab), t2d_of(vocab, 20)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert (torch.arange(5) + d2t).tolist() == list(vocab)  # target = draft + d2t[draft]
    assert torch.nonzero(t2d).flatten().tolist() == list(vocab)
    assert vocab_from_maps(d2t, t2d) == vocab
    other = t2d.clone()
    other[5] = True
    with pytest.raises(ValueError, match="different draft vocabularies"):
        vocab_from_maps(d2t, other)
    assert coverage(np.array([1, 0, 0, 3, 0, 6]), (0, 3)) == pytest.approx(0.4)


# ------------------------------------------------------------------ the draft's head


def _pair(kind: str, vocab: tuple[int, ...], **extra):
    """(full draft, the same draft restricted to `vocab`): same weights, the Markov
    output W2 cut to the vocabulary's rows."""
    spec = tiny_spec(**SMALL, kind=kind, max_position_embeddings=256, **extra)
    torch.manual_seed(0)
    embed, head = torch.randn(V, H), torch.randn(V, H) * 0.3
    full = build_draft(spec, embed, head).eval()
    if full.spec.markov_rank:
        torch.nn.init.normal_(full.markov_head.markov_w2.weight, std=1.0)
    reduced = build_draft(dataclasses.replace(spec, draft_vocab=vocab), embed, head).eval()
    state = full.state_dict()
    if "markov_head.markov_w2.weight" in state:
        state["markov_head.markov_w2.weight"] = state["markov_head.markov_w2.weight"][list(vocab)]
    reduced.load_state_dict(state)
    return full, reduced


def test_reduced_head_is_the_target_heads_rows():
    vocab = (1, 4, 5, 11, 30)
    full, reduced = _pair("dflash", vocab, sample_from_anchor=False)
    h = torch.randn(3, H)
    assert reduced.head_logits(h).shape == (3, 5)
    torch.testing.assert_close(reduced.head_logits(h), full.head_logits(h)[:, list(vocab)])
    torch.testing.assert_close(reduced.teacher_logits(h), full.target_logits(h)[:, list(vocab)])
    torch.testing.assert_close(reduced.target_logits(h), full.target_logits(h))  # whole target
    ids = torch.tensor([30, 2, 4])
    assert reduced.to_draft_ids(ids).tolist() == [4, -1, 1]
    assert reduced.to_target_ids(torch.tensor([4, 1])).tolist() == [30, 4]
    assert reduced.draft_head.requires_grad is False  # frozen, as the target head is
    assert not any("draft" in n for n, _ in reduced.named_parameters())


@pytest.mark.parametrize(
    "kind, extra",
    [
        ("dspark", dict(sample_from_anchor=True, markov_rank=6)),
        ("dflash", dict(sample_from_anchor=False)),
        ("eagle3", dict()),
    ],
)
def test_drafted_ids_are_target_ids_of_the_vocabulary(kind, extra):
    """A reduced draft whose vocabulary holds every token the full draft drafts drafts
    exactly those target ids (the draft ids are mapped back through d2t, and the Markov
    head reads them as target ids); with a small vocabulary every token is in it."""
    sample = random_sample(vocab=V, hidden=H, t=24, prompt=6)
    anchors = torch.tensor([6, 10, 15])
    full, _ = _pair(kind, (0,), **extra)
    drafted = make_drafter_of(full).draft(sample, anchors).tokens
    vocab = tuple(sorted(set(drafted.flatten().tolist()) | {0, 1, V - 1}))
    assert len(vocab) < V
    _, reduced = _pair(kind, vocab, **extra)
    torch.testing.assert_close(make_drafter_of(reduced).draft(sample, anchors).tokens, drafted)
    small = (2, 5, 8, 13)
    _, tiny = _pair(kind, small, **extra)
    blocks = make_drafter_of(tiny).draft(sample, anchors)
    assert set(blocks.tokens.flatten().tolist()) <= set(small)


def test_sampled_blocks_carry_probabilities_over_the_target_vocabulary():
    vocab = (2, 5, 8, 13)
    _, reduced = _pair("dspark", vocab, sample_from_anchor=True, markov_rank=6)
    sample = random_sample(vocab=V, hidden=H, t=24, prompt=6)
    blocks = make_drafter_of(reduced).propose(
        sample.input_ids[:12],
        sample.hidden_states[:12],
        temperature=1.0,
        generator=torch.Generator().manual_seed(0),
    )
    assert blocks.probs.shape[-1] == V
    outside = torch.ones(V, dtype=torch.bool)
    outside[list(vocab)] = False
    assert float(blocks.probs[..., outside].abs().sum()) == 0.0
    torch.testing.assert_close(blocks.probs.sum(-1), torch.ones(blocks.probs.shape[:-1]))
    assert set(blocks.tokens.flatten().tolist()) <= set(vocab)


def make_drafter_of(model):
    from pipeline.drafts.registry import draft_kind

    return draft_kind(model.spec.kind).drafter("d", model, True)


# ------------------------------------------------------------------ export


@pytest.mark.parametrize(
    "kind, extra, model_type",
    [
        ("dspark", dict(sample_from_anchor=True), "dspark"),
        ("dspark", dict(sample_from_anchor=False), "dflash"),
        ("dflash", dict(sample_from_anchor=False), "dflash"),
        ("eagle3", dict(), "eagle3"),
    ],
)
def test_export_carries_the_maps_and_reads_back(
    kind, extra, model_type, random_target_dir, tmp_path
):
    embed, head = load_target_head(random_target_dir)
    target_config = json.loads((random_target_dir / "config.json").read_text())
    vocab = tuple(range(3, embed.shape[0], 7))
    spec = tiny_spec(
        kind=kind,
        vocab_size=embed.shape[0],
        hidden_size=embed.shape[1],
        target_hidden_size=embed.shape[1],
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        draft_vocab=vocab,
        **extra,
    )
    torch.manual_seed(0)
    draft = build_draft(spec, embed, head)
    out = export_draft(
        state=draft.state_dict(),
        spec=spec,
        out=tmp_path / "export",
        model_type=model_type,
        verifier=str(random_target_dir),
        target_config=target_config,
        dtype="float32",
        target_tensors=dict(zip(TARGET_TENSORS, (embed, head), strict=True)),
    )
    from safetensors.torch import load_file

    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == len(vocab)
    assert config["transformer_layer_config"]["vocab_size"] == embed.shape[0]  # the target's
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["d2t"].dtype == torch.int64 and tensors["d2t"].shape == (len(vocab),)
    assert tensors["t2d"].dtype == torch.bool and tensors["t2d"].shape == (embed.shape[0],)
    assert (torch.arange(len(vocab)) + tensors["d2t"]).tolist() == list(vocab)
    torch.testing.assert_close(tensors["lm_head.weight"], head[list(vocab)])
    if "markov_head.markov_w2.weight" in tensors:
        assert tensors["markov_head.markov_w2.weight"].shape[0] == len(vocab)
    back, weights = read_export(out)
    assert back == spec  # draft_vocab included, from d2t/t2d (a fill-in DSpark: heads too)
    if kind == "dspark":  # the Markov output over the draft vocabulary, wherever it is stored
        assert weights["markov_head.markov_w2.weight"].shape[0] == len(vocab)
    assert not {"d2t", "t2d", "lm_head.weight"} & set(weights)
    loaded = load_draft(out, target_dir=random_target_dir)
    assert loaded.spec.draft_vocab == vocab
    h = torch.randn(2, embed.shape[1])
    torch.testing.assert_close(loaded.model.head_logits(h), draft.head_logits(h))
    assert make_drafter(kind, loaded).num_draft_tokens == spec.num_draft_tokens


def test_an_export_without_maps_for_a_reduced_size_is_refused(random_target_dir, tmp_path):
    embed, head = load_target_head(random_target_dir)
    target_config = json.loads((random_target_dir / "config.json").read_text())
    spec = tiny_spec(
        kind="dflash",
        sample_from_anchor=False,
        vocab_size=embed.shape[0],
        hidden_size=embed.shape[1],
        target_hidden_size=embed.shape[1],
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
    )
    draft = build_draft(spec, embed, head)
    out = export_draft(
        state=draft.state_dict(),
        spec=spec,
        out=tmp_path / "export",
        model_type="dflash",
        verifier=str(random_target_dir),
        target_config=target_config,
    )
    config = json.loads((out / "config.json").read_text())
    config["draft_vocab_size"] = 10
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no d2t and t2d"):
        read_export(out)


def test_the_spec_records_the_vocabulary_and_full_specs_keep_their_layout():
    from pipeline.drafts.spec import DraftSpec

    reduced = tiny_spec(draft_vocab=(1, 2, 5))
    assert DraftSpec.from_json(reduced.to_json()) == reduced
    assert reduced.draft_vocab_size == 3 and reduced.to_json().count("\n") < 40
    full = tiny_spec()
    assert "draft_vocab" not in full.to_json() and full.draft_vocab_size == full.vocab_size
    assert DraftSpec.from_json(full.to_json()) == full
