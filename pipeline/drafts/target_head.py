"""The target's frozen embeddings and lm_head, and the token mask slots embed by default."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

EMBED_NAMES = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",  # multimodal (Gemma-3, transformers 5)
    "language_model.model.embed_tokens.weight",  # multimodal (transformers 4)
)
LM_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight")


def load_target_head(
    target_dir: str | Path, dtype: torch.dtype | None = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens (V, H), lm_head (V, H)) from a HF checkpoint's safetensors, in
    `dtype` (None: as stored). A tied lm_head is the embedding tensor itself."""
    from safetensors import safe_open

    target_dir = Path(target_dir)
    files = sorted(target_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{target_dir}: no *.safetensors files (need embeddings and lm_head)"
        )
    found: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name in EMBED_NAMES or name in LM_HEAD_NAMES:
                    tensor = f.get_tensor(name)
                    found[name] = tensor if dtype is None else tensor.to(dtype)
    embed = next((found[n] for n in EMBED_NAMES if n in found), None)
    if embed is None:
        raise ValueError(f"{target_dir}: none of {list(EMBED_NAMES)} found in {files}")
    head = next((found[n] for n in LM_HEAD_NAMES if n in found), embed)  # tied embeddings
    return embed, head


def tokenizer_mask_token_id(target_dir: str | Path) -> int:
    """The token mask slots embed by default: the tokenizer's mask token, else a fallback.

    Many real targets (Llama, Qwen, SmolLM) have no mask token. Then, as the
    field's trainers do (docs/train.md): the first embedding row no tokenizer
    token uses (the table is often padded past the tokenizer), else the pad,
    EOS or unknown token. The draft only needs a fixed row it learns to read
    as "not drafted yet"; the id goes into the checkpoint and the export, so
    vLLM feeds the same one.
    """
    from transformers import AutoTokenizer

    from pipeline.targets.resolve import text_config

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    vocab_size = int(text_config(str(target_dir)).vocab_size)
    candidates = [("mask token", tokenizer.mask_token_id)]
    if len(tokenizer) < vocab_size:
        candidates.append(("first unused embedding row", len(tokenizer)))
    candidates += [
        ("pad token", tokenizer.pad_token_id),
        ("EOS token", tokenizer.eos_token_id),
        ("unknown token", tokenizer.unk_token_id),
    ]
    for source, token_id in candidates:
        if token_id is not None and 0 <= int(token_id) < vocab_size:
            if source != "mask token":
                logging.getLogger(__name__).info(
                    "no mask token in %s: mask slots embed the %s, id %d",
                    target_dir,
                    source,
                    token_id,
                )
            return int(token_id)
    raise ValueError(
        f"{target_dir}: the tokenizer has no mask, pad, EOS or unknown token and the "
        "embedding table no unused row; set draft.mask_token_id"
    )
