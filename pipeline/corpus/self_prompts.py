"""Prompts the target writes itself (the Magpie method), for users with no prompt set.

An instruction-tuned target, given its chat template up to the start of a user
turn and nothing else, writes a plausible user turn: the template's
pre-query prefix conditions it on what users ask. Sampled many times, that is a
prompt set drawn from the target's own idea of its users. Each sample is
filtered (finished before the token limit, a sensible length, no template
markup), deduplicated exactly and as a near-duplicate (near_dup.py), and written
as a `prompt` row of a JSONL file, which the corpus then reads as any source.

Deterministic: request ids derive from the seed and the index, and the
backend seeds each request from its id, so the same target, seed and settings
write the same file. The sampling itself needs the target, so it lives above
it: pipeline/regenerate/driver/self_prompts.py (`synthesize`, `ensure_self_prompts`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import Field

from pipeline.config import ConfigModel

_SENTINEL = "\u2063SELF-PROMPT\u2063"  # a string no template emits, to find the user slot
# Requests per engine call. Small enough that one step prefills them all: vLLM 0.32's
# CPU runner fails a seeded request whose prefill is split over steps ("CPU Generator
# does not use offset"), and a seeded request is what makes the file reproducible.
SAMPLE_BATCH = 64


class SelfPromptsConfig(ConfigModel):
    """`corpus.self_prompts`: user turns sampled from the target, read as one more source."""

    path: str  # the JSONL file written once and read as a source
    num_prompts: int = Field(gt=0)
    seed: int = 0
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    max_new_tokens: int = Field(96, gt=0)
    min_words: int = Field(4, ge=1)
    max_words: int = Field(120, ge=1)
    # Requests per accepted prompt that the sampler may spend before it stops short.
    max_tries_per_prompt: float = Field(4.0, ge=1.0)
    name: str = "self-prompts"
    domain: str = "self"
    weight: float = Field(1.0, gt=0.0)


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user turn's text begins (the
    template's default system prompt included, as a real conversation would have it)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=False
    )
    head, found, _ = text.partition(_SENTINEL)
    if not found:
        raise ValueError("the chat template does not show the user's text: no user-turn prefix")
    return tokenizer.encode(head, add_special_tokens=False)


def accept(text: str, config: SelfPromptsConfig, markers: tuple[str, ...]) -> str | None:
    """The cleaned prompt, or None when the filter drops it."""
    text = text.strip()
    words = len(text.split())
    if not (config.min_words <= words <= config.max_words):
        return None
    if any(m in text for m in markers):
        return None  # the sample ran into the template (another turn, a role header)
    return text


def write_rows(path: str | Path, rows: list[dict], meta: dict) -> Path:
    """Write the JSONL (rows) and its sidecar (`<path>.meta.json`: what made it), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    meta_path = path.with_name(path.name + ".meta.json")
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def recipe(config: SelfPromptsConfig, target: str, revision: str) -> dict:
    """What determines the file's content: reused only while this is unchanged."""
    keep = config.model_dump(mode="json", exclude={"path", "name", "domain", "weight"})
    return {"target": target, "target_revision": revision, **keep}
