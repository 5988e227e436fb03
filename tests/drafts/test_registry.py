"""The table of draft kinds: each kind builds its model with vLLM's tensor names, drafts
with its drafter and writes and reads its own speculators format; its config defaults
and fixed fields reach DraftConfig, and an unknown kind is named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from draft_specs import tiny_spec

from pipeline.config import ConfigError
from pipeline.drafts.export import spec_from_export, speculators_config
from pipeline.drafts.load import LoadedDraft, make_drafter
from pipeline.drafts.registry import (
    DEFAULT_KIND,
    KINDS,
    build_draft,
    draft_kind,
    drafts_with_heads,
    served_method,
    serving_kind,
    vllm_env,
)
from pipeline.train.config import parse_train_config

BASE = dict(target="t", data=dict(uri="x"), out_dir="o", num_steps=1, global_batch_size=1)


def _draft(**draft):
    return parse_train_config({**BASE, "draft": draft}).draft


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_builds_a_draft_with_its_heads(kind):
    spec = tiny_spec(kind=kind)
    model = build_draft(spec, torch.randn(spec.vocab_size, 32), torch.randn(spec.vocab_size, 32))
    names = set(model.state_dict())
    assert "fc.weight" in names and "norm.weight" in names
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)  # frozen buffers
    has_heads = any(n.startswith(("markov_head.", "confidence_head.")) for n in names)
    assert has_heads == draft_kind(kind).heads
    weights = draft_kind(kind).step_weights(spec, gamma=4.0, ttt_step_decay=0.8)
    assert weights.shape == (spec.block_size,) and float(weights.max()) == 1.0


def test_kind_defaults_and_fixed_fields_reach_the_config():
    assert (_draft(kind="dspark").anchor_predicts, _draft(kind="dflash").anchor_predicts) == (
        True,
        False,
    )
    eagle3 = _draft(kind="eagle3")
    assert (eagle3.num_layers, eagle3.block_size, eagle3.anchor_predicts) == (1, 7, True)
    assert _draft(kind="eagle3", block_size=5).block_size == 5
    with pytest.raises(ConfigError, match="only the fill-in layout"):
        _draft(kind="dflash", sample_from_anchor=True)
    with pytest.raises(ConfigError, match="leave sample_from_anchor unset"):
        _draft(kind="eagle3", sample_from_anchor=False)
    with pytest.raises(ConfigError, match=r"draft.kind: .*unknown draft kind 'medusa'"):
        _draft(kind="medusa")
    loss = parse_train_config(BASE).loss
    # (ce, weight on TV, bce): the paper's 0.9 x L1 = 1.8 x TV.
    assert loss.weights("dspark") == (0.1, 1.8, 1.0) and loss.weights("dflash") == (1.0, 0.0, 0.0)
    old_style = parse_train_config({**BASE, "loss": {"tv_weight": 0.9}}).loss
    assert old_style.weights("dspark") == (0.1, 0.9, 1.0)
    assert (
        parse_train_config({**BASE, "loss": {"l1_weight": 0.45}}).loss.weights("dspark")[1] == 0.9
    )
    with pytest.raises(ConfigError, match="set l1_weight or tv_weight, not both"):
        parse_train_config({**BASE, "loss": {"l1_weight": 0.9, "tv_weight": 0.9}})


def test_eagle3_reads_its_low_middle_high_layers_when_the_dataset_captured_them():
    """The kind default (vLLM's 2, L//2, L-3) where captured; else every captured layer;
    an explicit subset always wins; ids must ascend."""
    union = (2, 9, 15, 21, 27, 28)  # DFlash's 30-layer spacing plus EAGLE-3's
    assert _draft(kind="eagle3").layers_to_read(union, 30) == ((2, 15, 27), "the eagle3 default")
    dflash_only = (2, 9, 15, 21, 28)
    assert _draft(kind="eagle3").layers_to_read(dflash_only, 30)[0] == dflash_only
    assert _draft(kind="eagle3").layers_to_read((1, 2, 3), 4)[0] == (1, 2, 3)  # (2, 2, 1): none
    assert _draft(kind="dflash").layers_to_read(union, 30)[0] == union
    assert _draft(kind="dspark", aux_layer_ids=[2, 9, 15, 21, 28]).layers_to_read(union, 30) == (
        dflash_only,
        "draft.aux_layer_ids",
    )
    with pytest.raises(ConfigError, match=r"draft.aux_layer_ids: .*ascending order"):
        _draft(aux_layer_ids=[15, 2])


def test_resolved_specs_carry_heads_only_for_dspark():
    target = dict(
        vocab_size=50, hidden_size=32, num_attention_heads=4, intermediate_size=48, head_dim=8
    )
    for kind in KINDS:
        spec = _draft(kind=kind).resolve(target, aux_layer_ids=[1, 2], mask_token_id=3)
        assert (spec.markov_rank > 0, spec.confidence_head) == (draft_kind(kind).heads,) * 2
        assert spec.aux_layer_ids == (1, 2) and spec.kind == kind


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_drafts_and_round_trips_its_format(kind):
    spec = tiny_spec(kind=kind, sample_from_anchor=draft_kind(kind).sample_from_anchor)
    model = build_draft(spec, torch.randn(spec.vocab_size, 32), torch.randn(spec.vocab_size, 32))
    drafter = make_drafter("d", LoadedDraft(model, spec, Path("p"), None, None))
    assert drafter.model is model and drafter.num_draft_tokens == spec.num_draft_tokens
    fmt = draft_kind(kind).format_for(spec)
    config = speculators_config(spec, model_type=fmt, verifier="v", target_config={})
    assert config["speculators_model_type"] == fmt == kind
    assert spec_from_export(config, "here") == spec


def test_an_unknown_kind_has_no_drafter():
    draft = LoadedDraft(None, tiny_spec(kind="medusa"), Path("somewhere"), None, None)
    with pytest.raises(ValueError, match="somewhere: no drafter for draft kind 'medusa'"):
        make_drafter("m", draft)
    with pytest.raises(ValueError, match="speculators_model_type 'medusa' is none of"):
        spec_from_export({"speculators_model_type": "medusa"}, "there")


def _kind_comparisons() -> re.Pattern:
    """A line that compares something with a kind's name: `== "dspark"`, `"dflash" !=`,
    `is "eagle3"`, `in ("x", "dflash")`, `case "dspark":`, `.startswith("eagle")`
    (`for ... in` iterates, it does not compare: `_compares_a_kind` drops it)."""
    names = "|".join(map(re.escape, KINDS))
    stems = "|".join(sorted({re.escape(k.rstrip("0123456789")) for k in KINDS}))
    literal = rf"[\"'](?:{names})[\"']"
    return re.compile(
        rf"(?:[!=]=|\bis(?: not)?)\s*{literal}|{literal}\s*[!=]="
        rf"|\b(?:not )?in\s*[(\[{{][^)\]}}]*{literal}|\bcase\s+{literal}"
        rf"|\.(?:starts|ends)with\(\s*\(?\s*[\"'](?:{stems})"
    )


def _compares_a_kind(line: str) -> bool:
    return bool(_kind_comparisons().search(re.sub(r"\bfor\b.*?\bin\b", "for", line)))


def test_no_draft_kind_is_compared_as_a_string_outside_the_registry():
    """Per-kind facts live in drafts/registry.py: nothing else asks `kind == "dspark"`."""
    pipeline = Path(__file__).resolve().parents[2] / "pipeline"
    registry = pipeline / "drafts" / "registry.py"
    found = [
        f"{path.relative_to(pipeline)}:{n}: {line.strip()}"
        for path in sorted(pipeline.rglob("*.py"))
        if path != registry
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _compares_a_kind(line)
    ]
    assert len(list(pipeline.rglob("*.py"))) > 100 and found == []


@pytest.mark.parametrize(
    "line,compares",
    [
        ('if method == "dspark":', True),
        ("if 'dflash' != served:", True),
        ("x in ('dflash', 'y')", True),
        ('use_heads = kind not in ["x", "eagle3"]', True),
        ('    case "dspark":', True),
        ('if name.startswith("eagle"):', True),
        ('engine.method is "dflash"', True),
        ("served = draft_kind(kind).fill_in_format", False),
        ('DEMO = {"dspark": (CONFIG, "train")}', False),
        ("# a dspark draft == its backbone plus heads", False),
    ],
)
def test_the_kind_comparison_grep_sees_every_form(line, compares):
    assert _compares_a_kind(line) == compares


def test_serving_facts_come_from_the_registry():
    assert vllm_env("dspark") == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert vllm_env("dflash") == {} and vllm_env(None) == {}
    assert drafts_with_heads({"speculators_model_type": "dspark"}, "x")
    assert not drafts_with_heads({"speculators_model_type": "dflash"}, "x")
    # a DSpark draft's dflash export: its heads where the project's vLLM plugin serves them
    with_heads = {"speculators_model_type": "dflash", "dspark_heads": {"file": "h"}}
    assert drafts_with_heads(with_heads, "x")  # vLLM 0.32.0, the version the plugin serves
    assert KINDS["dspark"].vllm_needs_gpu and KINDS["eagle3"].vllm_needs_gpu is None
    for name, kind in KINDS.items():
        assert serving_kind(kind.vllm_method) is kind
        assert served_method({"speculators_model_type": kind.export_format}, "x") == name
    with pytest.raises(ValueError, match=r"unknown vLLM speculative method 'medusa'; one of"):
        serving_kind("medusa")
    with pytest.raises(ValueError, match="here: no speculators_model_type; is this a"):
        served_method({}, "here")
    with pytest.raises(ValueError, match="there: speculators_model_type 'medusa' is none of"):
        served_method({"speculators_model_type": "medusa"}, "there")


def test_the_default_kind_is_the_registrys():
    assert DEFAULT_KIND in KINDS
    assert parse_train_config(BASE).draft.kind == DEFAULT_KIND


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_vllm_check_serves_each_kind_with_its_method_and_environment(
    kind, tmp_path, monkeypatch
):
    """decode() without a method serves the export's (its format's kind's) method, in the
    environment the registry gives that method, drafting the export's token count."""
    from pipeline.drafts import vllm_check

    config = {
        "speculators_model_type": kind,
        "speculators_config": {"proposal_methods": [{"speculative_tokens": 3}]},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    seen = {}

    def fake_run(args, *, input, env, **kwargs):
        seen.update(request=json.loads(input), env=env)
        raise KeyboardInterrupt  # stop before any engine starts

    monkeypatch.setattr(vllm_check.subprocess, "run", fake_run)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    with pytest.raises(KeyboardInterrupt):
        vllm_check.decode("target", [[1, 2]], max_tokens=4, draft_dir=tmp_path)
    assert seen["request"]["method"] == KINDS[kind].vllm_method
    assert seen["request"]["num_speculative_tokens"] == 3  # the export's, when not told
    assert {k: seen["env"].get(k) for k in KINDS[kind].vllm_env} == dict(KINDS[kind].vllm_env)
    assert ("VLLM_USE_V2_MODEL_RUNNER" in seen["env"]) == bool(KINDS[kind].vllm_env)
