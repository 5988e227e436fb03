"""Corpus and target facts for the planner, read from a regeneration config.

The corpus is read as the run reads it (`load_corpus`: normalised, deduplicated)
and every row the run would produce is rendered with the target's tokenizer:
the prompt exactly as the run renders it, the answer as the corpus' reference
answer plus the end-of-turn token, capped by the answer budget. With turns=all
a later turn's history holds the target's own earlier answers; the reference
answers stand in for them (as for the answer itself), which is the one thing a
plan cannot know before the run: give `answer_tokens` when the target answers
longer or shorter than the corpus. Rows whose prompt leaves less than
`min_answer_tokens` are dropped, with the later turns of their conversation,
as the run records them as errors.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from pipeline.plan.inputs import CorpusStats, TargetStats
from pipeline.regenerate.config import PipelineConfig

log = logging.getLogger(__name__)

# Rendering a huge corpus would take as long as planning is meant to save: past
# this many conversations, an evenly spaced sample (by conversation id) is rendered.
MAX_RENDERED = 20_000


def corpus_is_local(config: PipelineConfig) -> bool:
    """True when reading the corpus needs no network (synthetic, local files)."""
    for source in config.corpus.sources:
        if source.format == "hf" or "://" in source.path:
            return False
    return True


def measure_corpus(config: PipelineConfig, max_rendered: int = MAX_RENDERED) -> CorpusStats:
    """Rows, mean prompt and answer tokens of the corpus `config` regenerates."""
    from transformers import AutoTokenizer

    from pipeline.corpus.ingest import load_corpus
    from pipeline.render import answer_budget, answer_turns, prompt_messages, render_prompt
    from pipeline.targets.resolve import resolve_model

    corpus = load_corpus(config.corpus)
    conversations = sorted(corpus.conversations, key=lambda c: c.conversation_id)
    if not conversations:
        raise ValueError("the corpus has no usable conversation: nothing to plan")
    target = config.target
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model(target.model), revision=target.revision
        )
    except Exception as err:  # no hub access, a missing directory: say what to give instead
        raise ValueError(
            f"cannot load the tokenizer of {target.model} to count the corpus' tokens "
            f"({type(err).__name__}: {err}); give them with --corpus-stats"
        ) from None
    step = max(1, -(-len(conversations) // max_rendered))
    sample = conversations[::step]
    turns_setting = config.regenerate.turns
    rows = dropped = 0
    prompt_total = answer_total = 0
    eos = 1  # the end-of-turn token the target emits and the row keeps
    per_source: dict[str, list[int]] = {}  # source -> [rows, prompt tokens, answer tokens]
    for conv in sample:
        tally = per_source.setdefault(conv.source, [0, 0, 0])
        messages = list(conv.messages)
        for turn in answer_turns(messages, turns_setting):
            prompt = render_prompt(tokenizer, prompt_messages(messages, turn, None))
            budget = answer_budget(
                len(prompt), config.generation.max_new_tokens, target.max_model_len
            )
            if budget < config.regenerate.min_answer_tokens:
                later = [t for t in answer_turns(messages, turns_setting) if t >= turn]
                dropped += len(later) if turns_setting == "all" else 1
                break
            answer = _reference_answer(messages, turn)
            ids = tokenizer.encode(answer, add_special_tokens=False) if answer else []
            rows += 1
            prompt_total += len(prompt)
            answer_total += min(len(ids) + eos, budget)
            tally[0] += 1
            tally[1] += len(prompt)
            tally[2] += min(len(ids) + eos, budget)
    if not rows:
        raise ValueError("no row of the corpus fits target.max_model_len: nothing to plan")
    scale = len(conversations) / len(sample)
    sampled = f", {len(sample)} of them rendered" if step > 1 else ""
    return CorpusStats(
        num_conversations=len(conversations),
        num_samples=round(rows * scale),
        prompt_tokens=prompt_total / rows,
        answer_tokens=answer_total / rows,
        num_dropped=round(dropped * scale),
        by_source=_by_source(corpus, per_source, scale),
        source=(
            f"read from the corpus ({len(conversations)} conversations{sampled}; "
            "answers: the corpus' reference answers)"
        ),
    )


def _by_source(corpus, per_source: dict[str, list[int]], scale: float) -> dict[str, dict]:
    """Per source: conversations, rows, mean prompt/answer tokens, weight and licence."""
    convs = Counter(c.source for c in corpus.conversations)
    out = {}
    for name, count in corpus.stats.by_source.items():
        n_rows, prompt, answer = per_source.get(name, [0, 0, 0])
        out[name] = {
            "conversations": convs.get(name, 0),
            "rows": round(n_rows * scale),
            "prompt_tokens": round(prompt / n_rows, 1) if n_rows else None,
            "answer_tokens": round(answer / n_rows, 1) if n_rows else None,
            "weight": count.weight,
            "licence": count.licence,
        }
    return out


def _reference_answer(messages: list[dict[str, Any]], turn: int) -> str:
    """Text of the corpus' answer `turn` (the first plain assistant message after its prompt)."""
    from pipeline.render import answer_positions

    position = answer_positions(messages)[turn]
    for message in messages[position + 1 :]:
        if message["role"] == "user":
            break
        if message["role"] == "assistant" and not message.get("tool_calls"):
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def measure_target(config: PipelineConfig) -> TargetStats:
    """Hidden size, depth, vocabulary, MLP width and parameters from the target's files."""
    from pipeline.targets.resolve import resolve_model, text_config

    target = config.target
    try:
        model_dir = resolve_model(target.model)
        text = text_config(model_dir, target.revision)
    except Exception as err:
        raise ValueError(
            f"cannot read the config of {target.model} ({type(err).__name__}: {err}); "
            "give the target's shape with --target-stats"
        ) from None
    return TargetStats(
        hidden_size=text.hidden_size,
        num_layers=text.num_hidden_layers,
        params=_count_params(model_dir),
        vocab_size=getattr(text, "vocab_size", None),
        intermediate_size=getattr(text, "intermediate_size", None),
        source=f"read from {model_dir}",
    )


def _count_params(model_dir: str) -> float | None:
    """Parameters in the directory's safetensors files (headers only), or None."""
    import json
    import struct
    from pathlib import Path

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        with path.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return float(total)
