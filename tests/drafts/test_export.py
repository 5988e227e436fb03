"""Export: speculators config and tensor names as vLLM reads them, and real vLLM serving.

The serving tests train small drafts on toy shards, export them and decode
held-out prompts with vLLM's CPU build, plain and speculative, at
temperature 0: outputs must be identical and the acceptance counters are
read and printed. The DSpark method itself needs vLLM's Model Runner V2
(Triton), so its test runs only on a GPU machine.
"""

from __future__ import annotations

import json

import pytest
import torch
from draft_specs import train_small_draft
from safetensors import safe_open

from pipeline.drafts.checkpoint import latest_checkpoint
from pipeline.drafts.export import export_checkpoint

from .conftest import SERVE_MAX_TOKENS, toy_prompts


def _train(shards, out_dir, kind: str, num_steps: int, **draft):
    draft = dict(kind=kind, num_layers=2, block_size=5, markov_rank=32, **draft)
    return train_small_draft(shards, out_dir, draft, num_steps=num_steps)


@pytest.fixture(scope="module")
def drafts(toy_shards, tmp_path_factory):
    """A DFlash draft and a DSpark draft in the fill-in layout (trained, exported as DFlash),
    and a DSpark draft in the anchor layout (2 steps: only its export format matters)."""
    root = tmp_path_factory.mktemp("drafts")
    return {
        "dflash": _train(toy_shards, root / "dflash", "dflash", 60),
        "dspark": _train(toy_shards, root / "dspark", "dspark", 60, sample_from_anchor=False),
        "anchor": _train(toy_shards, root / "anchor", "dspark", 2),  # sample_from_anchor: true
    }


def _tensor_names(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


def _config(result):
    return json.loads((result.export_dir / "config.json").read_text())


def test_speculators_config_as_vllm_converts_it(drafts, toy_shards):
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    from pipeline.table.dataset import Dataset

    aux = list(Dataset.open(str(toy_shards)).manifest().provenance.aux_layer_ids)
    config = _config(drafts["dflash"])
    assert config["speculators_model_type"] == "dflash"
    assert config["aux_hidden_state_layer_ids"] == aux
    assert config["sliding_window_non_causal"] is True
    vllm_cfg = SpeculatorsConfig.extract_transformers_pre_trained_config(
        json.loads(json.dumps(config))
    )
    assert vllm_cfg["dflash_config"]["target_layer_ids"] == [k - 1 for k in aux]
    assert vllm_cfg["eagle_aux_hidden_state_layer_ids"] == aux
    assert vllm_cfg["dflash_config"]["causal"] is False
    assert vllm_cfg["dflash_config"]["mask_token_id"] == 3

    dspark_cfg = _config(drafts["anchor"])
    converted = SpeculatorsConfig.extract_transformers_pre_trained_config(dspark_cfg)
    assert converted["architectures"] == ["Qwen3DSparkModel"]
    assert converted["target_layer_ids"] == [k - 1 for k in aux]
    assert converted["markov_rank"] == 32 and converted["enable_confidence_head"] is True
    assert converted["sample_from_anchor"] is True and converted["dspark_bonus_anchor"] is False
    # speculators 0.9 accepts only the greedy proposal type; vLLM takes the method from the type.
    for name, method, n in (
        ("dflash", "dflash", 4),
        ("dspark", "dflash", 4),
        ("anchor", "dspark", 5),
    ):
        config = _config(drafts[name])
        proposal = config["speculators_config"]["proposal_methods"][0]
        assert proposal == {"proposal_type": "greedy", "speculative_tokens": n}, name
        assert config["speculators_config"]["default_proposal_method"] == "greedy"
        assert SpeculatorsConfig.extract_vllm_speculative_config(config) == {
            "method": method,
            "num_speculative_tokens": n,
        }


def test_tensor_names_are_vllms(drafts):
    names = _tensor_names(drafts["anchor"].export_dir)
    h, v = 128, 1600
    assert names["fc.weight"] == (h, 3 * h)
    assert {"hidden_norm.weight", "norm.weight"} <= set(names)
    for i in range(2):
        for part in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            assert f"layers.{i}.self_attn.{part}.weight" in names
        for part in ("gate_proj", "up_proj", "down_proj"):
            assert f"layers.{i}.mlp.{part}.weight" in names
    assert names["markov_head.markov_w1.weight"] == (v, 32)
    assert names["markov_head.markov_w2.weight"] == (v, 32)
    assert names["confidence_head.proj.weight"] == (1, h + 32)
    assert not any("embed_tokens" in n or "lm_head" in n for n in names)
    backbone = _tensor_names(drafts["dspark"].dflash_dir)
    assert set(backbone) == {n for n in names if not n.startswith(("markov_", "confidence_"))}
    assert set(backbone) == set(_tensor_names(drafts["dflash"].export_dir))


def test_each_layout_exports_as_vllm_reads_it(drafts, tmp_path):
    """The anchor layout exports as dspark (never as DFlash: off by one); the fill-in
    layout exports its DFlash backbone, with its whole DSpark form in dspark/."""
    from pipeline.drafts.dspark.export import DSPARK_DIR
    from pipeline.drafts.export import export_draft
    from pipeline.drafts.spec import DraftSpec

    anchor, fill_in = drafts["anchor"], drafts["dspark"]
    assert anchor.export_dir is not None and anchor.dflash_dir is None
    assert _config(anchor)["sample_from_anchor"] is True
    assert not (anchor.export_dir / DSPARK_DIR).exists()
    assert fill_in.dflash_dir == fill_in.export_dir
    assert _config(fill_in)["speculators_model_type"] == "dflash"
    assert _config(fill_in)["dspark_targets"]["trained_kind"] == "dspark"
    form = json.loads((fill_in.export_dir / DSPARK_DIR / "config.json").read_text())
    assert form["speculators_model_type"] == "dspark" and form["sample_from_anchor"] is False
    spec = DraftSpec.from_json((latest_checkpoint(anchor.out_dir) / "spec.json").read_text())
    with pytest.raises(ValueError, match="off by one"):
        export_draft(
            state={},
            spec=spec,
            out=tmp_path / "x",
            model_type="dflash",
            verifier="t",
            target_config={},
        )
    again = export_checkpoint(latest_checkpoint(anchor.out_dir), tmp_path / "again")
    assert _tensor_names(again.draft) == _tensor_names(anchor.export_dir)


def test_vllm_accepts_the_dspark_form_as_method_dspark(drafts):
    """vLLM's own conversion of a speculators config reads the fill-in DSpark form as its
    dspark method with the anchor as a bonus token (what its GPU runner serves)."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    from pipeline.drafts.dspark.export import DSPARK_DIR

    config = json.loads((drafts["dspark"].export_dir / DSPARK_DIR / "config.json").read_text())
    hf = SpeculatorsConfig.extract_transformers_pre_trained_config(config)
    assert hf["architectures"] == ["Qwen3DSparkModel"]
    assert hf["sample_from_anchor"] is False and hf["dspark_bonus_anchor"] is True
    assert hf["markov_rank"] == 32 and hf["markov_head_type"] == "vanilla"
    assert SpeculatorsConfig.extract_vllm_speculative_config(config)["method"] == "dspark"


@pytest.mark.slow
def test_vllm_serves_dflash_and_dspark_backbone_losslessly(
    drafts, trained_target_dir, plain_toy_decode
):
    from pipeline.drafts.vllm_check import decode

    prompts, plain = plain_toy_decode  # shared with the EAGLE-3 serving test
    assert all(plain.outputs) and plain.num_drafts == 0
    for name, draft_dir in (
        ("dflash", drafts["dflash"].export_dir),
        ("dspark backbone as dflash", drafts["dspark"].dflash_dir),
    ):
        spec = decode(
            trained_target_dir,
            prompts,
            max_tokens=SERVE_MAX_TOKENS,
            draft_dir=draft_dir,
            method="dflash",
            num_speculative_tokens=4,
        )
        print(
            f"{name}: drafts={spec.num_drafts} draft_tokens={spec.num_draft_tokens} "
            f"accepted={spec.num_accepted_tokens} per_pos={spec.accepted_per_pos} tau={spec.tau:.3f}"
        )
        assert spec.outputs == plain.outputs, f"{name}: speculative output differs from plain"
        assert spec.num_drafts > 0 and spec.num_draft_tokens == 4 * spec.num_drafts
        assert spec.num_accepted_tokens == sum(spec.accepted_per_pos)
        per_pos = spec.accepted_per_pos
        assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))  # prefix acceptance


def _dspark_runs_here() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(
    not _dspark_runs_here(),
    reason="vLLM's dspark method exists only in Model Runner V2, which needs a GPU and Triton; "
    "this machine has neither (the DSpark backbone is tested as DFlash above)",
)
def test_vllm_serves_dspark_on_gpu(drafts, trained_target_dir):
    from pipeline.drafts.vllm_check import decode

    prompts = toy_prompts(trained_target_dir)
    plain = decode(
        trained_target_dir, prompts, max_tokens=48, dtype="bfloat16", gpu_memory_utilization=0.3
    )
    spec = decode(
        trained_target_dir,
        prompts,
        max_tokens=48,
        draft_dir=drafts["anchor"].export_dir,  # dspark serves the anchor layout
        method="dspark",
        num_speculative_tokens=5,
        dtype="bfloat16",
        gpu_memory_utilization=0.3,
    )
    print(
        f"dspark: drafts={spec.num_drafts} accepted={spec.num_accepted_tokens} tau={spec.tau:.3f}"
    )
    assert spec.outputs == plain.outputs
    assert spec.num_drafts > 0


def test_a_fill_in_dspark_export_keeps_its_heads_beside_the_backbone(drafts):
    from pipeline.drafts.dspark.export import HEADS_FILE, HEADS_KEY
    from pipeline.drafts.export import read_export

    export = drafts["dspark"].export_dir
    config = _config(drafts["dspark"])
    assert config["speculators_model_type"] == "dflash"
    assert config[HEADS_KEY]["file"] == HEADS_FILE and config[HEADS_KEY]["markov_rank"] == 32
    backbone = _tensor_names(export)
    assert not any(n.startswith(("markov_head.", "confidence_head.")) for n in backbone)
    with safe_open(str(export / HEADS_FILE), framework="pt") as f:
        form = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    heads = {n: shape for n, shape in form.items() if n not in backbone}
    assert heads["markov_head.markov_w1.weight"][1] == 32
    assert {n: form[n] for n in backbone} == backbone  # the same backbone in both forms
    spec, tensors = read_export(export)
    assert spec.kind == "dspark" and spec.markov_rank == 32 and not spec.sample_from_anchor
    assert set(tensors) == set(backbone) | set(heads)
    assert HEADS_KEY not in _config(drafts["dflash"])  # a DFlash draft has none


def _logit_gaps(target_dir, draft, prompts, outputs, rounds: dict) -> list[float]:
    """Per drafted slot of every round vLLM drafted: how far (in logits) the project's
    draft, given the same context and the same previous token (the anchor, then vLLM's own
    drafted token), puts vLLM's token below its argmax; 0 where they agree."""
    from pipeline.drafts.dspark.drafter import run_blocks
    from pipeline.evaluate.vllm import capture_samples

    model = draft.model
    vocab = model.spec.draft_vocab
    index = {t: i for i, t in enumerate(vocab)} if vocab else None
    samples = capture_samples(str(target_dir), draft.spec.aux_layer_ids, prompts, outputs)
    gaps = []
    for i, sample in enumerate(samples):
        mine = sorted((pos, tokens) for (p, pos), tokens in rounds.items() if p == i)
        anchors = torch.tensor([pos for pos, _ in mine])
        drafted = torch.tensor([tokens for _, tokens in mine])  # (A, n) target ids
        with torch.no_grad():
            base, _ = run_blocks(model, sample.input_ids, sample.hidden_states, anchors)
            prev = torch.cat([sample.input_ids[anchors][:, None], drafted[:, :-1]], 1)
            head = model.markov_head
            logits = base.float() + head.markov_w2(head.markov_w1(prev)).float()
        ids = drafted if index is None else drafted.apply_(index.__getitem__)
        gaps += (
            (logits.max(-1).values - logits.gather(-1, ids[..., None])[..., 0]).flatten().tolist()
        )
    return gaps


@pytest.mark.slow
def test_vllm_plugin_serves_dspark_heads_as_the_project_drafts(
    drafts, trained_target_dir, plain_toy_decode, tmp_path, monkeypatch
):
    """The plugin (pipeline/drafts/vllm_plugin.py) loads the DSpark export in CPU vLLM: the
    output equals plain decoding token for token (fp32), and every block vLLM drafted equals
    the one the project's drafter drafts, heads included, on the same context."""
    from pipeline.drafts.load import load_draft
    from pipeline.drafts.vllm_check import decode
    from pipeline.drafts.vllm_plugin import DRAFT_LOG_ENV

    prompts, plain = plain_toy_decode
    log = tmp_path / "drafts.jsonl"
    monkeypatch.setenv(DRAFT_LOG_ENV, str(log))
    run = decode(
        trained_target_dir,
        prompts,
        max_tokens=SERVE_MAX_TOKENS,
        draft_dir=drafts["dspark"].export_dir,
        num_speculative_tokens=4,
    )
    assert run.outputs == plain.outputs
    index = {rid: i for i, rid in enumerate(run.request_ids)}
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    rounds = {}
    for row in logged:
        i = next(
            i for rid, i in index.items() if row["req"] == rid or row["req"].startswith(rid + "-")
        )
        full = prompts[i] + run.outputs[i]
        if row["pos"] >= len(full):  # past max_tokens: vLLM drafted from a token it cut
            continue
        assert full[row["pos"]] == row["anchor"]
        rounds[(i, row["pos"])] = row["tokens"]
    # vLLM counts a round when it verifies it; each request's last block is never verified
    assert run.num_drafts > 0 and len(logged) == run.num_drafts + len(prompts)
    assert len(rounds) >= run.num_drafts
    gaps = _logit_gaps(
        trained_target_dir,
        load_draft(drafts["dspark"].export_dir, target_dir=trained_target_dir),
        prompts,
        run.outputs,
        rounds,
    )
    differ = [g for g in gaps if g > 0]
    print(
        f"dspark with heads: tau={run.tau:.3f} rounds={len(rounds)} slots={len(gaps)} "
        f"argmax differs={len(differ)} largest gap={max(differ, default=0):.2e}"
    )
    # fp32 on both sides, but vLLM's target states are its kernels' and the offline ones
    # the HF reference's: a differing slot must be a near-tie (measured: 6 of 460 slots,
    # the first slot among them, whose previous token is the anchor on both sides, all
    # within 0.007 logits)
    assert len(differ) <= 0.05 * len(gaps) and max(differ, default=0) < 0.02


@pytest.mark.slow
def test_adaptive_drafting_sends_fewer_tokens_and_changes_no_output(
    drafts, trained_target_dir, plain_toy_decode, tmp_path, monkeypatch
):
    """DSpark with its confidence head: at a saturation of 40 the plugin asks the drafter
    for the tokens worth drafting at the live acceptance rates and the head trims what
    is sent (fewer than the 4 tokens a round), and at a saturation of 1 request it asks
    for none, so every round skips the drafter (the plugin's draft log stays empty) and
    nothing is sent; the output is plain decoding's either way (fp32). Drafts without a
    confidence head trim by the acceptance rate (tests/drafts/test_adaptive.py)."""
    from pipeline.drafts.adaptive import ADAPTIVE_ENV
    from pipeline.drafts.vllm_check import decode
    from pipeline.drafts.vllm_plugin import DRAFT_LOG_ENV

    prompts, plain = plain_toy_decode
    for saturation in ("40", "1"):
        log = tmp_path / f"drafts-{saturation}.jsonl"
        monkeypatch.setenv(ADAPTIVE_ENV, saturation)
        monkeypatch.setenv(DRAFT_LOG_ENV, str(log))
        run = decode(
            trained_target_dir,
            prompts,
            max_tokens=SERVE_MAX_TOKENS,
            draft_dir=drafts["dspark"].export_dir,
            num_speculative_tokens=4,
            round_times=True,
        )
        print(
            f"dspark adaptive at {saturation}: rounds={len(run.round_ms)} "
            f"skipped={run.rounds_skipped} drafts={run.num_drafts} "
            f"draft_tokens={run.num_draft_tokens} accepted={run.num_accepted_tokens}"
        )
        assert run.outputs == plain.outputs, saturation
        logged = log.read_text().splitlines() if log.exists() else []
        if saturation == "1":
            assert run.num_draft_tokens == 0 and logged == []
            assert run.round_ms and run.rounds_skipped == len(run.round_ms)
        else:
            assert 0 < run.num_draft_tokens < 4 * run.num_drafts and logged
            assert run.rounds_skipped < len(run.round_ms)
