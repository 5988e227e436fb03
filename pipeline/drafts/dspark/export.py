"""The speculators formats of block drafts: `dspark` and `dflash` (docs/design.md#serving-drafts-in-vllm).

Tensor names are the ones vLLM's `qwen3_dspark.py` / `qwen3_dflash.py`
loaders read (the model's own parameter names, so the weights are a plain
state-dict copy). Layer ids: the config carries the capture convention's aux
ids unchanged; vLLM derives `target_layer_ids = aux_ids - 1` itself when it
loads a speculators config. Both formats set `sliding_window_non_causal:
true`, or vLLM would run the bidirectional block causally (measured: tau
2.48 vs 3.18).

A `dflash` export is always in the fill-in layout: vLLM's dflash method
reads slot k as token p+k. A `dspark` export carries either layout
(`sample_from_anchor`; vLLM 0.32's dspark method reads both). A DSpark draft
trained in the fill-in layout exports as `dflash`, its backbone (the
registry's `fill_in_format`: what vLLM's CPU build serves, having no dspark
method), with its whole DSpark form in the folder `dspark/` (`DSPARK_DIR`,
named by config.json's `dspark_heads`): vLLM's dflash loader reads only the
top folder, a GPU user serves `dspark/` with vLLM's dspark method, and the
project's vLLM plugin (pipeline/drafts/vllm_plugin.py) reads the heads from
it where vLLM has no DSpark path of its own. No torch.
"""

from __future__ import annotations

from pipeline.drafts.spec import DraftSpec
from pipeline.drafts.speculators import (
    SPECULATORS_VERSION,
    layer_config,
    method_config,
    provenance,
)

# A fill-in DSpark draft's DSpark form, in a folder of its dflash export (vLLM loads
# every *.safetensors file at the top as draft weights, and would refuse the heads).
DSPARK_DIR = "dspark"
HEADS_FILE = f"{DSPARK_DIR}/model.safetensors"
HEADS_KEY = "dspark_heads"
HEAD_PREFIXES = ("markov_head.", "confidence_head.")


def heads_config(spec: DraftSpec) -> dict:
    """config.json's `dspark_heads`: the heads file and the fields vLLM's dspark config
    would carry."""
    return {
        "file": HEADS_FILE,
        "markov_rank": spec.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": spec.confidence_head,
        "confidence_head_with_markov": spec.confidence_with_markov,
    }


def _block_config(
    spec: DraftSpec, *, model_type: str, architecture: str, verifier: str, target_config: dict
) -> dict:
    """The fields both block formats write, in the order they have always been written."""
    return {
        "speculators_model_type": model_type,
        "speculators_version": SPECULATORS_VERSION,
        "architectures": [architecture],
        "transformer_layer_config": layer_config(spec, target_config),
        "aux_hidden_state_layer_ids": list(spec.aux_layer_ids),
        "target_hidden_size": spec.target_hidden_size,
        "draft_vocab_size": spec.draft_vocab_size,
        "mask_token_id": spec.mask_token_id,
        "block_size": spec.block_size,
        "sample_from_anchor": spec.sample_from_anchor,
        # The block attends to itself bidirectionally (vLLM: false -> causal).
        "sliding_window_non_causal": True,
        "speculators_config": method_config(
            spec, algorithm=model_type, verifier=verifier, target_config=target_config
        ),
        "dspark_targets": provenance(spec),
    }


def dflash_config(spec: DraftSpec, *, verifier: str, target_config: dict) -> dict:
    """config.json of a speculators-format DFlash draft (the fill-in layout only)."""
    if spec.sample_from_anchor:
        raise ValueError(
            "a draft trained with sample_from_anchor=true predicts token p+k+1 in slot k; vLLM's "
            "dflash method reads slot k as token p+k, so it would be served off by one: "
            "train with sample_from_anchor: false to export a DFlash draft"
        )
    config = _block_config(
        spec,
        model_type="dflash",
        architecture="DFlashDraftModel",
        verifier=verifier,
        target_config=target_config,
    )
    if spec.markov_rank or spec.confidence_head:  # a DSpark draft's backbone: its heads beside
        config[HEADS_KEY] = heads_config(spec)
    return config


def dspark_config(spec: DraftSpec, *, verifier: str, target_config: dict) -> dict:
    """config.json of a speculators-format DSpark draft (either layout, with the Markov
    and confidence heads' fields)."""
    config = _block_config(
        spec,
        model_type="dspark",
        architecture="Qwen3DSparkModel",
        verifier=verifier,
        target_config=target_config,
    )
    config.update(
        markov_rank=spec.markov_rank,
        markov_head_type="vanilla",
        enable_confidence_head=spec.confidence_head,
        confidence_head_with_markov=spec.confidence_with_markov,
    )
    return config


def _block_fields(config: dict) -> dict:
    return dict(
        aux_layer_ids=tuple(config["aux_hidden_state_layer_ids"]),
        block_size=config["block_size"],
        mask_token_id=config["mask_token_id"],
        sample_from_anchor=bool(config.get("sample_from_anchor", False)),
        confidence_with_markov=bool(config.get("confidence_head_with_markov", True)),
    )


def dflash_fields(config: dict) -> dict:
    """The DraftSpec fields a `dflash` config.json decides: no heads, or a DSpark draft's
    when `dspark_heads` names its heads file."""
    heads = config.get(HEADS_KEY)
    if heads:
        return dspark_fields({**config, **heads})
    return dict(kind="dflash", markov_rank=0, confidence_head=False, **_block_fields(config))


def dspark_fields(config: dict) -> dict:
    """The DraftSpec fields a `dspark` config.json decides (the heads included)."""
    return dict(
        kind="dspark",
        markov_rank=config.get("markov_rank", 0),
        confidence_head=bool(config.get("enable_confidence_head", False)),
        **_block_fields(config),
    )
