"""Targets beyond dense Qwen3 (pipeline/toy/families.py: tiny random Qwen3-MoE, DeepSeek-V3
with MLA and YaRN, Gemma-3 multimodal (text_config) and text-only with scaled embeddings
and soft-capped logits) go
the whole way: config resolution, capture with the transformers backend, shard writing,
and training steps of a draft whose layers honour the family; the teacher distribution
the trainer rebuilds from the shards is the target's own."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pipeline.drafts.family import language_config
from pipeline.toy.families import FAMILIES, build_family_target

AUX = (1, 2)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(name, target dir, shards uri) of one family, captured once (~10 s each)."""
    from pipeline.demo.reference_shards import write_reference_shards

    root = tmp_path_factory.mktemp(request.param)
    target = build_family_target(request.param, root / "target")
    uri = root / "shards"
    write_reference_shards(
        uri,
        target=str(target),
        num_conversations=4,
        num_units=1,
        max_new_tokens=10,
        aux_layer_ids=AUX,
    )
    return request.param, target, uri


def test_config_resolution_and_capture_follow_the_family(family):
    from transformers import AutoModelForCausalLM

    from pipeline.drafts.common import softcap
    from pipeline.drafts.target_head import load_target_head
    from pipeline.table.dataset import Dataset
    from pipeline.table.reader import ShardReader
    from pipeline.targets.resolve import target_shape

    name, target, uri = family
    config = json.loads((target / "config.json").read_text())
    text = language_config(config)
    assert ("text_config" in config) == (name == "gemma3")
    shape = target_shape(str(target), None, AUX)
    assert (
        (shape.num_layers, shape.hidden_size)
        == (3, 64)
        == (
            text["num_hidden_layers"],
            text["hidden_size"],
        )
    )
    prov = Dataset.open(uri).manifest().provenance
    assert prov.aux_layer_ids == AUX and prov.hidden_size == 64
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    embed, head = load_target_head(target)
    cap = config.get("final_logit_softcapping")  # top level: what transformers applies
    rows = list(ShardReader(str(uri), prefetch=0))
    assert rows
    for row in rows[:2]:
        ids = row.input_ids.long()
        with torch.no_grad():
            out = model(input_ids=ids[None, :-1], output_hidden_states=True)
        hs = out.hidden_states
        want = torch.cat([hs[a][0] for a in AUX], -1).to(torch.bfloat16)
        assert torch.equal(row.hidden_states[:-1], want)  # aux id k = after k layers
        assert torch.equal(row.last_hidden_state[:-1], hs[-1][0].to(torch.bfloat16))
        # The trainer's teacher: the stored post-norm state through lm_head (and the cap).
        teacher = softcap(row.last_hidden_state[:-1].float() @ head.T, cap)
        # (bf16 storage of the state; random weights give near-tied logits, so no argmax test)
        torch.testing.assert_close(teacher, out.logits[0].float(), atol=0.02, rtol=0.02)
        if cap is not None:  # the cap matters here: without it the teacher would be wrong
            uncapped = row.last_hidden_state[:-1].float() @ head.T
            assert (uncapped - out.logits[0]).abs().max() > 0.05


def test_a_draft_of_the_family_trains_and_exports(family, tmp_path):
    from pipeline.train.config import parse_train_config
    from pipeline.train.trainer import train

    name, target, uri = family
    config = parse_train_config(
        dict(
            target=str(target),
            data=dict(uri=str(uri), num_anchors=8, heldout_fraction=0.0, prefetch=0),
            out_dir=str(tmp_path),
            num_steps=2,
            global_batch_size=2,
            micro_batch_size=1,
            draft=dict(num_layers=1, block_size=3, markov_rank=8, intermediate_size=32),
            checkpoint_every=2,
            num_threads=1,
        )
    )
    result = train(config)
    assert result.steps == 2 and all(math.isfinite(m["loss"]) for m in result.metrics)
    from pipeline.drafts.checkpoint import load_checkpoint

    spec = load_checkpoint(result.checkpoint).spec
    exported = json.loads((result.export_dir / "config.json").read_text())
    rope = exported["transformer_layer_config"]["rope_parameters"]
    if name == "deepseek_v3":  # YaRN copied, MLA's rope head dim as the draft's head dim
        assert spec.rope_scaling["rope_type"] == "yarn" and spec.rope_scaling["factor"] == 4.0
        assert rope["rope_type"] == "yarn" and rope["original_max_position_embeddings"] == 256
        assert spec.head_dim == 16 and spec.rope_theta == 10000.0
    elif name.startswith("gemma3"):  # global layers' RoPE, sqrt(d) embeddings, the cap
        assert spec.rope_scaling == {"rope_type": "linear", "factor": 8.0}
        assert spec.rope_theta == 1e6 and rope["rope_type"] == "linear"
        assert spec.embed_scale == pytest.approx(8.0)
        cap = 0.25 if name == "gemma3_text" else None
        assert spec.logit_softcap == cap and exported["dspark_targets"]["logit_softcap"] == cap
    else:
        assert spec.rope_scaling is None and rope["rope_type"] == "default"
        assert spec.embed_scale == 1.0 and spec.logit_softcap is None
