"""Export a trained draft in the speculators format that vLLM serves (docs/design.md#serving-drafts-in-vllm).

A directory with `config.json` (speculators_model_type, transformer_layer_config,
speculators_config with the verifier, aux_hidden_state_layer_ids, block_size,
mask_token_id, Markov/confidence fields) and `model.safetensors` whose tensor
names are the ones vLLM's `qwen3_dflash.py` / `qwen3_dspark.py` loaders read.
Embeddings and lm_head are not saved: vLLM shares the target's.

Layer ids: the config carries the capture convention's aux ids unchanged;
vLLM derives `target_layer_ids = aux_ids - 1` itself when it loads a
speculators config. DFlash drafts get `sliding_window_non_causal: true`, or
vLLM would run the bidirectional block causally (measured: tau 2.48 vs 3.18).

A `dspark` export is always in the anchor layout (`sample_from_anchor:
true`): vLLM's DSpark speculator assumes it. A DSpark draft trained in the
fill-in layout (`sample_from_anchor: false`) is exported as DFlash only: its
backbone, the same tensors minus the two heads. vLLM's CPU build serves
`dflash` but not `dspark` (Triton-only runner), so that export is how a DSpark
checkpoint is checked end to end on CPU. Every format's
`proposal_methods[0].proposal_type` is "greedy", the only type speculators
0.9 accepts (the vLLM method is `speculators_model_type`).

EAGLE-3 (`speculators_model_type: "eagle3"`, vLLM's `Eagle3Qwen3ForCausalLM`):
`eagle_aux_hidden_state_layer_ids` = the capture ids unchanged (vLLM's target
appends the stream after layer k for id k, no shift for eagle3),
`norm_before_residual: false` (what the trainer's layer does; vLLM's default
when the key is absent is true), tensors `fc.weight`, `layers.0.*` (q/k/v read
the 2H input), `layers.0.hidden_norm.weight`, `norm.weight`, and the target's
`embed_tokens.weight` and `lm_head.weight` (speculators' Eagle3 reads both from
the checkpoint and leaves them uninitialised otherwise; vLLM loads them as the
draft's own, the same values it would share); no d2t/t2d (full vocabulary).

Every format's `transformer_layer_config.rope_parameters` is the target's RoPE
with its scaling (YaRN, linear, llama3), so the served draft rotates as the
trained one did; what the format has no field for (Gemma's embedding scale
and final logit soft-cap) travels in the `dspark_targets` block.

Which format a draft kind exports as (and its backbone, if any) is the
registry's (pipeline/train/drafts/registry.py); this module writes and reads
each format (`speculators_model_type`). Reading is `read_export` /
`spec_from_export`: evaluation loads a served export exactly as it loads a
checkpoint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.train.checkpoint import load_checkpoint
from pipeline.train.drafts.family import rope_of
from pipeline.train.drafts.registry import draft_kind
from pipeline.train.drafts.spec import DraftSpec

log = logging.getLogger(__name__)

SPECULATORS_VERSION = "0.3.0"
_HEAD_PREFIXES = ("markov_head.", "confidence_head.")
CONFIG = "config.json"
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class ExportPaths:
    draft: Path  # the export directory
    dflash_backbone: Path | None  # the same, when it holds a DSpark draft's DFlash backbone


def _layer_config(spec: DraftSpec, target_config: dict) -> dict:
    """The Qwen3 decoder config of the draft layers (vLLM builds them from it)."""
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings,
        # The target's RoPE, scaling included: what the draft was trained with.
        "rope_parameters": {
            "rope_type": "default",
            **(spec.rope_scaling or {}),
            "rope_theta": spec.rope_theta,
        },
        "rope_theta": spec.rope_theta,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": target_config.get("dtype") or target_config.get("torch_dtype", "bfloat16"),
    }


def _verifier(verifier: str, target_config: dict) -> dict:
    return {
        "name_or_path": verifier,
        "architectures": target_config.get("architectures", ["Qwen3ForCausalLM"]),
    }


def _provenance(spec: DraftSpec) -> dict:
    """What this project adds to config.json (readers other than vLLM use it): the
    convention, the kind, and what the draft copies from the target's family
    (embedding scale, logit soft-cap) that the speculators format has no field for."""
    return {
        "aux_layer_convention": "aux id k = residual stream after k decoder layers",
        "trained_kind": spec.kind,
        "embed_scale": spec.embed_scale,
        "logit_softcap": spec.logit_softcap,
    }


# Tensors of the target an EAGLE-3 export carries (speculators' Eagle3 reads its
# embeddings and lm_head from the checkpoint; vLLM loads them as the draft's own).
TARGET_TENSORS = ("embed_tokens.weight", "lm_head.weight")


def eagle3_config(
    spec: DraftSpec, *, verifier: str, target_config: dict, model_type: str = "eagle3"
) -> dict:
    """config.json of a speculators-format EAGLE-3 draft (see the module docstring)."""
    return {
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": _layer_config(spec, target_config),
        "eagle_aux_hidden_state_layer_ids": list(spec.aux_layer_ids),
        "target_hidden_size": spec.target_hidden_size,
        "draft_vocab_size": spec.vocab_size,
        "norm_before_residual": False,
        "norm_before_fc": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": spec.num_draft_tokens}
            ],
            "default_proposal_method": "greedy",
            "verifier": _verifier(verifier, target_config),
        },
        "dspark_targets": {**_provenance(spec), "ttt_steps": spec.block_size},
    }


def block_config(spec: DraftSpec, *, model_type: str, verifier: str, target_config: dict) -> dict:
    """config.json of a speculators-format DFlash or DSpark draft (block drafting)."""
    if model_type == "dflash" and spec.sample_from_anchor:
        raise ValueError(
            "a draft trained with sample_from_anchor=true predicts token p+k+1 in slot k; vLLM's "
            "dflash method reads slot k as token p+k, so it would be served off by one: "
            "train with sample_from_anchor: false to export a DFlash draft"
        )
    if model_type == "dspark" and not spec.sample_from_anchor:
        raise ValueError(
            "a dspark export needs sample_from_anchor=true (vLLM's DSpark speculator assumes "
            "the anchor layout); a draft trained in the fill-in layout (sample_from_anchor: "
            "false) is exported as dflash, its backbone without the heads"
        )
    config = {
        "speculators_model_type": model_type,
        "speculators_version": SPECULATORS_VERSION,
        "architectures": ["DFlashDraftModel" if model_type == "dflash" else "Qwen3DSparkModel"],
        "transformer_layer_config": _layer_config(spec, target_config),
        "aux_hidden_state_layer_ids": list(spec.aux_layer_ids),
        "target_hidden_size": spec.target_hidden_size,
        "draft_vocab_size": spec.vocab_size,
        "mask_token_id": spec.mask_token_id,
        "block_size": spec.block_size,
        "sample_from_anchor": spec.sample_from_anchor,
        # The block attends to itself bidirectionally (vLLM: false -> causal).
        "sliding_window_non_causal": True,
        "speculators_config": {
            "algorithm": model_type,
            # speculators (0.9) accepts only "greedy" here; the method is the model type.
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": spec.num_draft_tokens}
            ],
            "default_proposal_method": "greedy",
            "verifier": _verifier(verifier, target_config),
        },
        "dspark_targets": _provenance(spec),
    }
    if model_type == "dspark":
        config.update(
            markov_rank=spec.markov_rank,
            markov_head_type="vanilla",
            enable_confidence_head=spec.confidence_head,
            confidence_head_with_markov=spec.confidence_with_markov,
        )
    return config


def speculators_config(
    spec: DraftSpec, *, model_type: str, verifier: str, target_config: dict
) -> dict:
    """config.json of `spec` exported as `model_type` ('dspark', 'dflash' or 'eagle3')."""
    kind = draft_kind(spec.kind)
    if model_type not in (kind.export_format, kind.fill_in_format):
        raise ValueError(
            f"a {spec.kind} draft exports as {kind.export_format}"
            + (f" (in the fill-in layout as {kind.fill_in_format})" if kind.fill_in_format else "")
            + f", not as {model_type}"
        )
    return _WRITERS[model_type](
        spec, model_type=model_type, verifier=verifier, target_config=target_config
    )


_WRITERS = {"dspark": block_config, "dflash": block_config, "eagle3": eagle3_config}


def export_draft(
    *,
    state: dict,
    spec: DraftSpec,
    out: Path,
    model_type: str,
    verifier: str,
    target_config: dict,
    dtype: str | None = None,
    target_tensors: dict | None = None,
) -> Path:
    """Write one speculators-format directory; returns it. `target_tensors` (the
    target's `embed_tokens.weight` and `lm_head.weight`) go into EAGLE-3 exports."""
    import torch
    from safetensors.torch import save_file

    config = speculators_config(
        spec, model_type=model_type, verifier=verifier, target_config=target_config
    )
    torch_dtype = getattr(torch, dtype or config["transformer_layer_config"]["torch_dtype"])
    keep_heads = model_type == draft_kind(spec.kind).export_format
    tensors = {}
    for name, tensor in state.items():
        if not keep_heads and name.startswith(_HEAD_PREFIXES):
            continue
        # The confidence head stays fp32 (vLLM builds it with params_dtype float32).
        want = torch.float32 if name.startswith("confidence_head.") else torch_dtype
        tensors[name] = tensor.detach().to("cpu", want).contiguous()
    if model_type == "eagle3":
        if not target_tensors:
            raise ValueError(
                "an eagle3 export carries the target's embed_tokens and lm_head "
                "(speculators' Eagle3 reads them from the checkpoint): pass target_tensors"
            )
        for name in TARGET_TENSORS:
            tensors[name] = target_tensors[name].detach().to("cpu", torch_dtype).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    log.info("exported %s draft to %s (%d tensors)", model_type, out, len(tensors))
    return out


def export_checkpoint(checkpoint: Path, out: Path, *, verifier: str | None = None) -> ExportPaths:
    """Export a trainer checkpoint (checkpoints/step-N) to `out`, in its kind's format for
    its layout (a DSpark draft in the fill-in layout: its DFlash backbone)."""
    from pipeline.targets.resolve import resolve_model

    ckpt = load_checkpoint(checkpoint)
    spec, kind = ckpt.spec, draft_kind(ckpt.spec.kind)
    target_dir = resolve_model(ckpt.target)
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    model_type = kind.format_for(spec)
    target_tensors = None
    if model_type == "eagle3":
        from pipeline.train.drafts.common import load_target_head

        embed, head = load_target_head(target_dir, dtype=None)
        target_tensors = dict(zip(TARGET_TENSORS, (embed, head), strict=True))
    draft = export_draft(
        state=ckpt.model_state(),
        spec=spec,
        out=out,
        model_type=model_type,
        verifier=verifier or str(Path(target_dir).resolve()),
        target_config=target_config,
        target_tensors=target_tensors,
    )
    return ExportPaths(draft, draft if model_type != kind.export_format else None)


# ---------------------------------------------------------------------- reading


def is_export(path: str | Path) -> bool:
    return (Path(path) / CONFIG).exists() and (Path(path) / WEIGHTS).exists()


def _block_fields(config: dict) -> dict:
    dspark = config["speculators_model_type"] == "dspark"
    return dict(
        kind="dspark" if dspark else "dflash",
        aux_layer_ids=tuple(config["aux_hidden_state_layer_ids"]),
        block_size=config["block_size"],
        mask_token_id=config["mask_token_id"],
        sample_from_anchor=bool(config.get("sample_from_anchor", False)),
        markov_rank=config.get("markov_rank", 0) if dspark else 0,
        confidence_head=dspark and bool(config.get("enable_confidence_head", False)),
        confidence_with_markov=bool(config.get("confidence_head_with_markov", True)),
    )


def _eagle3_fields(config: dict) -> dict:
    return dict(
        kind="eagle3",
        aux_layer_ids=tuple(config["eagle_aux_hidden_state_layer_ids"]),
        block_size=config["speculators_config"]["proposal_methods"][0]["speculative_tokens"],
        mask_token_id=0,  # EAGLE-3 embeds no mask
        sample_from_anchor=True,
        markov_rank=0,
        confidence_head=False,
        confidence_with_markov=True,
    )


_READERS = {"dspark": _block_fields, "dflash": _block_fields, "eagle3": _eagle3_fields}


def spec_from_export(config: dict, where: str) -> DraftSpec:
    """Rebuild the DraftSpec of a speculators-format export from its config.json."""
    try:
        model_type = config["speculators_model_type"]
        if model_type not in _READERS:
            raise ValueError(
                f"{where}: speculators_model_type {model_type!r} is none of {sorted(_READERS)}"
            )
        layer = config["transformer_layer_config"]
        rope_theta, rope_scaling = rope_of(layer)
        ours = config.get("dspark_targets") or {}
        heads = layer["num_attention_heads"]
        # Defaults where a writer left a field at its Qwen3 default (speculators'
        # save_pretrained writes a diff; its target_hidden_size may be null).
        return DraftSpec(
            vocab_size=layer["vocab_size"],
            hidden_size=layer["hidden_size"],
            target_hidden_size=config.get("target_hidden_size") or layer["hidden_size"],
            num_layers=layer["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=layer.get("num_key_value_heads") or heads,
            head_dim=layer.get("head_dim") or layer["hidden_size"] // heads,
            intermediate_size=layer["intermediate_size"],
            rms_norm_eps=layer.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            max_position_embeddings=layer.get("max_position_embeddings", 40960),
            rope_scaling=rope_scaling,
            embed_scale=float(ours.get("embed_scale", 1.0)),
            logit_softcap=ours.get("logit_softcap"),
            **_READERS[model_type](config),
        )
    except (KeyError, IndexError) as err:
        raise ValueError(
            f"{where}: speculators config lacks {err.args[0]!r}; is this a dspark-targets export?"
        ) from None


def read_export(path: str | Path, *, weights: bool = True) -> tuple[DraftSpec, dict | None]:
    """(spec, tensors) of the export in `path`; tensors None unless `weights`."""
    path = Path(path)
    spec = spec_from_export(json.loads((path / CONFIG).read_text()), str(path))
    if not weights:
        return spec, None
    from safetensors.torch import load_file

    tensors = load_file(str(path / WEIGHTS))
    # The target's own tables (EAGLE-3 exports carry them) are not draft weights.
    return spec, {k: v for k, v in tensors.items() if k not in TARGET_TENSORS}


def export_target(path: str | Path) -> str:
    """The verifier an export names (`speculators_config.verifier.name_or_path`)."""
    config = json.loads((Path(path) / CONFIG).read_text())
    return config["speculators_config"]["verifier"]["name_or_path"]
