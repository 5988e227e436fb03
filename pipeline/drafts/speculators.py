"""What every speculators-format config.json shares, whatever the draft kind.

The Qwen3 decoder config vLLM builds the draft layers from
(`transformer_layer_config`, the target's RoPE with its scaling included),
the verifier block, the greedy proposal method (the only `proposal_type`
speculators 0.9 accepts; the vLLM method is `speculators_model_type`), and
this project's `dspark_targets` block (what the format has no field for:
Gemma's embedding scale and final logit soft-cap). Each kind's own fields
are written and read by its `export` module (dspark/export.py,
eagle3/export.py); pipeline/drafts/export.py writes the directory. No torch.
"""

from __future__ import annotations

from typing import Any

from pipeline.drafts.family import rope_of
from pipeline.drafts.spec import DraftSpec

SPECULATORS_VERSION = "0.3.0"


def layer_config(spec: DraftSpec, target_config: dict) -> dict:
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


def method_config(spec: DraftSpec, *, algorithm: str, verifier: str, target_config: dict) -> dict:
    """`speculators_config`: the algorithm, the greedy proposal of `num_draft_tokens`
    and the verifier (the target, by path or hub name, and its architectures)."""
    return {
        "algorithm": algorithm,
        # speculators (0.9) accepts only "greedy" here; the method is the model type.
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": spec.num_draft_tokens}
        ],
        "default_proposal_method": "greedy",
        "verifier": {
            "name_or_path": verifier,
            "architectures": target_config.get("architectures", ["Qwen3ForCausalLM"]),
        },
    }


def provenance(spec: DraftSpec) -> dict:
    """What this project adds to config.json (readers other than vLLM use it): the
    convention, the kind, and what the draft copies from the target's family
    (embedding scale, logit soft-cap) that the speculators format has no field for."""
    return {
        "aux_layer_convention": "aux id k = residual stream after k decoder layers",
        "trained_kind": spec.kind,
        "embed_scale": spec.embed_scale,
        "logit_softcap": spec.logit_softcap,
    }


def common_spec_fields(config: dict) -> dict[str, Any]:
    """The DraftSpec fields every format stores alike (the layer config, the
    `dspark_targets` block). Defaults where a writer left a field at its Qwen3
    default (speculators' save_pretrained writes a diff; its target_hidden_size
    may be null)."""
    layer = config["transformer_layer_config"]
    rope_theta, rope_scaling = rope_of(layer)
    ours = config.get("dspark_targets") or {}
    heads = layer["num_attention_heads"]
    return dict(
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
    )
