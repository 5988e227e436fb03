"""Every export kind loads in the speculators library (0.9.0) with `from_pretrained`: no
missing or unexpected draft tensors, equal values, and the same RoPE (scaling included).

speculators pins packages this project's CPU stack pins otherwise (datasets, torchvision),
so it is installed without its dependencies (all of them are already here, from vLLM):

    pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
"""

from __future__ import annotations

import json

import pytest
import torch
from draft_specs import tiny_spec

from pipeline.drafts.export import TARGET_TENSORS, export_draft, read_export
from pipeline.drafts.registry import build_draft
from pipeline.drafts.target_head import load_target_head

speculators = pytest.importorskip(
    "speculators",
    reason="pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0 (see module docstring)",
)

# What speculators rebuilds from the verifier rather than reading from a block draft.
REBUILT = {
    "embed_tokens.weight",
    "lm_head.weight",
    "verifier_lm_head.weight",
    "verifier_norm.weight",
}
VERIFIER_ONLY = {"verifier_lm_head.weight", "verifier_norm.weight"}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
REDUCED = "every 5th token"  # replaced by the target's ids 0, 5, 10, ... in the test

EXPORTS = {
    # name: (spec overrides, speculators format)
    "dspark": (dict(kind="dspark", sample_from_anchor=True), "dspark"),
    "dspark fill-in as dflash": (dict(kind="dspark", sample_from_anchor=False), "dflash"),
    "dspark fill-in": (dict(kind="dspark", sample_from_anchor=False), "dspark"),
    "dflash": (dict(kind="dflash", sample_from_anchor=False), "dflash"),
    "eagle3": (dict(kind="eagle3"), "eagle3"),
    "dspark with YaRN": (dict(kind="dspark", rope_scaling=YARN), "dspark"),
    # A reduced draft vocabulary (every 5th token): d2t, t2d and the head's rows.
    "dspark, reduced vocabulary": (dict(kind="dspark", draft_vocab=REDUCED), "dspark"),
    "dflash, reduced vocabulary": (
        dict(kind="dflash", sample_from_anchor=False, draft_vocab=REDUCED),
        "dflash",
    ),
    "eagle3, reduced vocabulary": (dict(kind="eagle3", draft_vocab=REDUCED), "eagle3"),
}


@pytest.mark.parametrize("name", list(EXPORTS))
def test_speculators_loads_every_export(name, random_target_dir, tmp_path):
    from speculators import SpeculatorModel

    overrides, model_type = EXPORTS[name]
    embed, head = load_target_head(random_target_dir)
    if overrides.get("draft_vocab") == REDUCED:
        overrides = {**overrides, "draft_vocab": tuple(range(0, embed.shape[0], 5))}
    reduced = overrides.get("draft_vocab")
    target_config = json.loads((random_target_dir / "config.json").read_text())
    spec = tiny_spec(
        vocab_size=embed.shape[0],
        hidden_size=embed.shape[1],
        target_hidden_size=embed.shape[1],
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        **overrides,
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
        dtype="float32",  # exact comparison
        target_tensors=dict(zip(TARGET_TENSORS, (embed, head), strict=True)),
    )
    from safetensors.torch import load_file

    exported = load_file(str(out / "model.safetensors"))
    loaded = SpeculatorModel.from_pretrained(str(out))
    assert loaded.config.speculators_model_type == model_type
    theirs = loaded.state_dict()
    unexpected = set(exported) - set(theirs)
    missing = set(theirs) - set(exported) - (REBUILT if model_type != "eagle3" else VERIFIER_ONLY)
    assert not unexpected and not missing, (unexpected, missing)
    for key, tensor in exported.items():
        torch.testing.assert_close(theirs[key].to(tensor.dtype), tensor, rtol=0, atol=0, msg=key)
    torch.testing.assert_close(loaded.embed_tokens.weight.float(), embed, rtol=0, atol=0)
    rows = head if reduced is None else head[list(reduced)]
    torch.testing.assert_close(loaded.lm_head.weight.float(), rows, rtol=0, atol=0)
    if reduced is not None:  # speculators' own maps: target = draft + d2t[draft], t2d's tokens
        assert loaded.draft_vocab_size == len(reduced)
        assert (torch.arange(len(reduced)) + loaded.d2t).tolist() == list(reduced)
        assert torch.nonzero(loaded.t2d).flatten().tolist() == list(reduced)
    # The heads a fill-in DSpark draft keeps out of model.safetensors are exactly its heads
    # (they go to the heads file its config names, which speculators never reads).
    heads = set()
    if name == "dspark fill-in as dflash":
        heads = {k for k in draft.state_dict() if k not in exported}
        assert heads == {
            k for k in draft.state_dict() if k.startswith(("markov_head.", "confidence_head."))
        }
    # The rotary embedding speculators builds from transformer_layer_config is the draft's.
    attn = draft.layers[0].self_attn
    rotary = loaded.rotary_emb if hasattr(loaded, "rotary_emb") else loaded.layers[0].rotary_emb
    torch.testing.assert_close(rotary.inv_freq.float(), attn.inv_freq, rtol=1e-6, atol=0)
    assert rotary.attention_scaling == pytest.approx(attn.rope_scaling)
    # And this project reads the export back as the same spec and weights, heads included.
    back, tensors = read_export(out)
    assert back == spec
    assert set(tensors) == (set(exported) | heads) - set(TARGET_TENSORS) - {"d2t", "t2d"}


def test_a_speculators_trained_dspark_drafts_the_same_through_our_import(
    trained_target_dir, tmp_path, monkeypatch
):
    """speculators' own DSpark (eager path), saved with save_pretrained and loaded by
    `load_draft`, computes the same block logits as speculators does, on a packed row of
    two samples: positions, masks, RoPE and norms mean the same on both sides."""
    import sys
    from pathlib import Path

    import speculators.models.dflash.core as dflash_core

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from train_parity import speculators_dspark

    from pipeline.drafts.inputs import DraftInputs
    from pipeline.drafts.load import load_draft

    g = torch.Generator().manual_seed(0)
    spec = tiny_spec(
        vocab_size=1600,
        hidden_size=128,
        target_hidden_size=128,
        aux_layer_ids=(1, 2, 3),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=64,
        block_size=4,
        markov_rank=8,
        rope_theta=10000.0,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    theirs = speculators_dspark(trained_target_dir, spec, mask_token_id=3).eval()
    with torch.no_grad():  # not the init: trained-looking weights everywhere
        for p in theirs.parameters():
            if p.requires_grad:
                p.normal_(0, 0.05, generator=g)
    theirs.save_pretrained(str(tmp_path / "theirs"))
    ours = load_draft(tmp_path / "theirs", target_dir=trained_target_dir).model

    lengths = (9, 7)
    t = sum(lengths)
    ids = torch.randint(4, 1600, (1, t), generator=g)
    feats = torch.randn(1, t, 3 * 128, generator=g)
    doc = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    anchors = torch.tensor([2, 5, 10, 11])  # packed-row indices: two in each sample
    monkeypatch.setattr(
        dflash_core, "select_anchors", lambda *a, **k: (anchors, torch.ones(4, dtype=torch.bool))
    )
    with torch.no_grad():
        _, want, *_ = theirs._backbone_forward(
            feats, ids, torch.ones(1, t), torch.randn(1, t, 128), doc, pos, max_anchors=4
        )
        block_ids = torch.full((1, 4, 4), 3)
        block_ids[0, :, 0] = ids[0, anchors]
        got = ours(
            DraftInputs(
                ctx_features=feats,
                ctx_positions=pos,
                ctx_doc=doc,
                block_ids=block_ids,
                block_anchor=pos[0, anchors][None],
                block_doc=doc[0, anchors][None],
                prev_ids=torch.zeros(1, 4, 4, dtype=torch.long),
            )
        ).base_logits
    torch.testing.assert_close(got.view(1, 16, -1), want, atol=1e-4, rtol=1e-4)
