"""Sampling the prompt file of `corpus.self_prompts` with the target (the Magpie method).

What the file holds and why: pipeline/corpus/self_prompts.py and docs/corpus.md.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.corpus.near_dup import NearDuplicateConfig, NearDuplicateIndex
from pipeline.corpus.self_prompts import (
    SAMPLE_BATCH,
    SelfPromptsConfig,
    accept,
    recipe,
    user_turn_prefix,
    write_rows,
)
from pipeline.logs import kv

log = logging.getLogger(__name__)


def synthesize(
    tokenizer, backend, config: SelfPromptsConfig, *, show_progress: bool = False
) -> list[dict]:
    """Rows `{"prompt", "id"}` sampled from `backend` (a TargetBackend), filtered,
    deduplicated; `show_progress`: a bar of prompts kept (sampling takes minutes)."""
    from tqdm import tqdm

    from pipeline.targets.base import GenerationRequest
    from pipeline.targets.config import GenerationConfig

    prefix = user_turn_prefix(tokenizer)
    params = GenerationConfig(
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
    )
    markers = tuple(t for t in (tokenizer.all_special_tokens or []) if t and len(t) > 1) + (
        "<|im_start|>",
        "<|im_end|>",
    )
    index = NearDuplicateIndex(NearDuplicateConfig())
    budget = int(config.num_prompts * config.max_tries_per_prompt)
    rows: list[dict] = []
    tried = 0
    with tqdm(
        total=config.num_prompts,
        desc="self prompts",
        unit="prompt",
        disable=not show_progress,
        dynamic_ncols=True,
    ) as bar:
        while len(rows) < config.num_prompts and tried < budget:
            batch = min(budget - tried, SAMPLE_BATCH)
            requests = [
                GenerationRequest(f"self-{config.seed}-{tried + i:07d}", prefix)
                for i in range(batch)
            ]
            tried += batch
            for gen in backend.generate(requests, params):
                if gen.finish_reason != "stop" or len(rows) >= config.num_prompts:
                    continue
                text = accept(
                    tokenizer.decode(gen.output_ids, skip_special_tokens=True), config, markers
                )
                if text is None or index.offer(gen.request_id, [text]) is not None:
                    continue
                rows.append({"prompt": text, "id": gen.request_id})
                bar.update(1)
            bar.set_postfix_str(f"sampled {tried}")
    log.info(
        "self prompts %s",
        kv(accepted=len(rows), asked=config.num_prompts, sampled=tried),
    )
    if len(rows) < config.num_prompts:
        log.warning(
            "self prompts short %s",
            kv(accepted=len(rows), asked=config.num_prompts, sampled=tried),
        )
    return rows


def ensure_self_prompts(
    config: SelfPromptsConfig, target_config, *, show_progress: bool = False
) -> Path:
    """The prompt file of `config`, sampled with the target of `target_config` unless a
    file made by the same recipe is there already."""
    from transformers import AutoTokenizer

    from pipeline.targets.identity import weights_revision
    from pipeline.targets.loader import load_target
    from pipeline.targets.resolve import resolve_model

    path = Path(config.path)
    model_dir = resolve_model(target_config.model)
    want = recipe(config, target_config.model, weights_revision(model_dir, target_config.revision))
    meta_path = path.with_name(path.name + ".meta.json")
    if path.exists() and meta_path.exists():
        if json.loads(meta_path.read_text()).get("recipe") == want:
            return path
        log.warning("self prompts %s", kv(path=path, note="recipe changed, sampling again"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    backend = load_target(target_config, capture=False)
    try:
        rows = synthesize(tokenizer, backend, config, show_progress=show_progress)
    finally:
        backend.close()
    return write_rows(path, rows, {"recipe": want, "rows": len(rows)})
