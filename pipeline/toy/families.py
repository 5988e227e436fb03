"""Tiny random-weight targets of the families beyond dense Qwen3, built on the spot.

The headline target is a DeepSeek-V3-style MoE (MLA attention, routed and
shared experts, YaRN RoPE scaling); Gemma-3 (multimodal checkpoint: the
language model's config under `text_config`, scaled embeddings, final logit
soft-capping, per-layer-type RoPE) and Qwen3-MoE are the others a user
names. Each builder writes an ordinary Hugging Face directory (config.json,
model.safetensors, the toy tokenizer with its chat template) that the
transformers backend loads, so the whole path runs on it: config resolution,
capture, shard writing, training a draft. Weights are random (seeded): these
targets test plumbing and conventions, not acceptance.

    build_family_target("deepseek_v3", out_dir)  # -> out_dir (idempotent)

vLLM's CPU build on this kind of machine dies with SIGILL (worker exit code
-4) for Qwen3-MoE and Gemma-3 models, so their vLLM path is not exercised
here (docs/train.md, "Target families").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# gemma3: the multimodal checkpoint (Gemma3ForConditionalGeneration, text_config);
# gemma3_text: the text-only class (Gemma3ForCausalLM), here with a final logit cap.
FAMILIES = ("qwen3_moe", "deepseek_v3", "gemma3", "gemma3_text")
# Shared tiny sizes: hidden 64, 3 layers (aux ids 1, 2 capture the first two).
HIDDEN, LAYERS, HEADS = 64, 3, 2
MAX_POSITIONS = 1024


def _config(family: str, vocab_size: int, special: dict):
    """The transformers config of `family`'s tiny target."""
    if family == "qwen3_moe":
        return _qwen3_moe_config(vocab_size, special)
    if family == "deepseek_v3":
        return _deepseek_v3_config(vocab_size, special)
    if family in ("gemma3", "gemma3_text"):
        return _gemma3_config(family, vocab_size, special)
    raise ValueError(f"unknown family {family!r}; known: {list(FAMILIES)}")


def _qwen3_moe_config(vocab_size: int, special: dict):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=1,
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        **special,
    )


def _deepseek_v3_config(vocab_size: int, special: dict):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=LAYERS,
        first_k_dense_replace=1,  # layer 0 dense, the rest routed + shared experts
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        q_lora_rank=32,  # MLA: low-rank queries and a compressed KV
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": MAX_POSITIONS // 4,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        tie_word_embeddings=False,
        **special,
    )


def _gemma3_config(family: str, vocab_size: int, special: dict):
    """gemma3_text: the text model alone; gemma3: it inside the multimodal checkpoint."""
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    text = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=16,
        max_position_embeddings=MAX_POSITIONS,
        # Gemma-2 caps at 30, Gemma-3 not at all; random logits are ~0.3, so a cap
        # that bends them lets the tests tell capped from uncapped distributions.
        # (transformers' multimodal class reads the cap from the top-level config,
        # which has none: it applies no cap, and neither does the draft.)
        final_logit_softcapping=0.25 if family == "gemma3_text" else None,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        **special,
    )
    if family == "gemma3_text":
        return text
    vision = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    return Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=4,
        image_token_index=vocab_size - 1,
        boi_token_index=vocab_size - 2,
        eoi_token_index=vocab_size - 3,
        **special,
    )


def build_family_target(family: str, out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write `family`'s tiny random target to `out_dir` (kept if already built)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.toy.target import build_toy_target

    out = Path(out_dir)
    if (out / "dspark_family.json").exists():
        return out
    tokenizer_dir = build_toy_target("random")  # the toy tokenizer and chat template
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    special = dict(
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = _config(family, vocab, special)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    report = {"family": family, "model_class": type(model).__name__, "seed": seed}
    (tmp / "dspark_family.json").write_text(json.dumps(report, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
