"""What a draft copies from its target's config.json, whatever the target's family.

The draft's layers are Qwen3-style in every case (that is what vLLM's DFlash,
DSpark and EAGLE-3 speculators build), but three things belong to the target
and must be the target's for the draft to compute the function it is served
with:

* **RoPE**: theta and the scaling (YaRN for DeepSeek-V3 and long-context
  Qwen3, linear for Gemma-3's global layers, ...). Draft positions are the
  target's positions, so a target with YaRN needs a draft with the same YaRN.
  Gemma-3 keeps one parameter set per layer type; the draft's layers attend
  globally, so they take the `full_attention` set.
* **Embedding scale**: Gemma multiplies embeddings by sqrt(hidden_size) in
  its embedding module (the weights are stored unscaled); a draft that embeds
  block tokens with the target's table must do the same.
* **Final logit soft-capping**: `c * tanh(logits / c)` (Gemma's
  `final_logit_softcapping`); the teacher distribution rebuilt from the
  stored hidden state must be the capped one, and the draft's base logits
  pass through the same cap. Read from the top-level config: transformers'
  multimodal Gemma-3 class applies no cap even when its `text_config` names
  one, and the target's function is what the draft must match.

Multimodal checkpoints (Gemma-3 `Gemma3ForConditionalGeneration`, ...) keep
the language model's config under `text_config`. No torch here: the training
config resolves specs with it.
"""

from __future__ import annotations

from typing import Any

# Families whose embedding module multiplies by sqrt(hidden_size).
SCALED_EMBEDDING_TYPES = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text")
# RoPE types the draft's rotary embedding computes (transformers' init functions).
# `dynamic` rescales with the running sequence length and `longrope` switches
# tables at a length: neither is a fixed function of the position, so neither is copied.
SUPPORTED_ROPE_TYPES = ("default", "linear", "yarn", "llama3", "proportional")


def language_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` of a multimodal checkpoint, else itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) and "hidden_size" in text else config


def rope_of(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling or None) of a language-model config (transformers 4 or 5 keys)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if "full_attention" in rope:  # per layer type (Gemma-3): the draft attends globally
        rope = rope["full_attention"] or {}
    theta = float(rope.get("rope_theta", config.get("rope_theta", 1e6)))
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    if "type" in scaling and "rope_type" not in scaling:  # transformers 4 spelling
        scaling["rope_type"] = scaling.pop("type")
    rope_type = scaling.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"target RoPE type {rope_type!r} is not a fixed function of the position; the draft "
            f"supports {list(SUPPORTED_ROPE_TYPES)}: set the target's rope_parameters or train "
            "against a checkpoint with one of these"
        )
    return theta, (scaling if rope_type != "default" else None)


def embed_scale_of(config: dict[str, Any]) -> float:
    """sqrt(hidden_size) for families with scaled embeddings (Gemma), else 1."""
    if config.get("model_type") in SCALED_EMBEDDING_TYPES:
        return float(config["hidden_size"]) ** 0.5
    return 1.0


def logit_softcap_of(config: dict[str, Any]) -> float | None:
    """The target's final logit soft-cap (Gemma's final_logit_softcapping), else None.
    `config` is the whole checkpoint config (module docstring), not its text_config."""
    cap = config.get("final_logit_softcapping")
    return float(cap) if cap else None
