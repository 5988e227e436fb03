"""`make demo`: the embedded default end to end on one machine.

Builds (or reuses) the trained toy target, writes the synthetic corpus, starts
a local Ray with one replica actor holding a CPU vLLM engine, regenerates the
first assistant turn of a few conversations and prints them beside the
corpus' reference answers.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pipeline.logs import kv

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "jobs" / "configs" / "toy.yaml"


def pick_demo_conversations(conversations: list[dict], count: int) -> list[dict]:
    """The first `count` conversations, taken round-robin over domains."""
    by_domain: dict[str, list[dict]] = {}
    for conv in conversations:
        by_domain.setdefault(conv["domain"], []).append(conv)
    picked: list[dict] = []
    depth = 0
    while len(picked) < count and any(depth < len(v) for v in by_domain.values()):
        for convs in by_domain.values():
            if depth < len(convs) and len(picked) < count:
                picked.append(convs[depth])
        depth += 1
    return picked


def run_demo(
    out_dir: Path, num_conversations: int = 6, config_path: Path = DEFAULT_CONFIG
) -> list[dict]:
    import ray
    from rich.console import Console
    from rich.table import Table
    from transformers import AutoTokenizer

    from pipeline.config import load_config
    from pipeline.corpus.synthetic import SyntheticSpec, generate, write_corpus
    from pipeline.render import first_prompt, render_prompt
    from pipeline.replica import init_ray, start_replicas
    from pipeline.targets.base import GenerationRequest
    from pipeline.targets.toy import resolve_model

    console = Console()
    config = load_config(config_path)
    started = time.monotonic()

    console.rule("[bold]1. toy target")
    model_dir = resolve_model(config.target.model)
    console.print(f"target model directory: {model_dir}")

    console.rule("[bold]2. synthetic corpus")
    syn = config.corpus.synthetic
    assert syn is not None, "the demo config uses the synthetic corpus"
    spec = SyntheticSpec(
        num_conversations=syn.num_conversations,
        seed=syn.seed,
        multi_turn_fraction=syn.multi_turn_fraction,
        domains=tuple(syn.domains),
    )
    paths = write_corpus(spec, out_dir / "corpus")
    console.print("wrote " + ", ".join(str(p) for p in paths))

    console.rule("[bold]3. vLLM replica in a Ray actor")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    conversations = pick_demo_conversations(list(generate(spec)), num_conversations)
    requests = [
        GenerationRequest(
            request_id=c["id"], prompt_ids=render_prompt(tokenizer, first_prompt(c["messages"]))
        )
        for c in conversations
    ]
    init_ray(config.ray)
    try:
        actors = start_replicas(config.target, config.replicas)
        t0 = time.monotonic()
        generations = ray.get(actors[0].generate.remote(requests, config.generation))
        gen_seconds = time.monotonic() - t0
    finally:
        ray.shutdown()

    table = Table(title="regenerated first assistant turns (greedy)", show_lines=True)
    table.add_column("domain")
    table.add_column("prompt (last user turn)")
    table.add_column("toy target's answer")
    table.add_column("corpus reference")
    rows = []
    for conv, gen in zip(conversations, generations, strict=True):
        prompt = first_prompt(conv["messages"])[-1]["content"]
        answer = tokenizer.decode(gen.output_ids, skip_special_tokens=True)
        reference = next(m["content"] for m in conv["messages"] if m["role"] == "assistant")
        table.add_row(conv["domain"], prompt, answer, reference)
        rows.append(
            {
                "domain": conv["domain"],
                "prompt": prompt,
                "answer": answer,
                "reference": reference,
                "finish_reason": gen.finish_reason,
            }
        )
    console.print(table)
    num_tokens = sum(len(g.output_ids) for g in generations)
    log.info(
        "demo done %s",
        kv(
            conversations=len(rows),
            generated_tokens=num_tokens,
            generate_s=round(gen_seconds, 2),
            total_s=round(time.monotonic() - started, 1),
        ),
    )
    return rows
