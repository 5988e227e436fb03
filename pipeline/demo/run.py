"""`make demo`: the embedded default end to end on one machine.

1. builds (or reuses) the trained toy target;
2. writes the synthetic corpus (JSONL + Parquet) for the user to look at;
3. regenerates it on a local Ray with a CPU vLLM replica that captures hidden
   states in the same pass, committing a dataset version under `<out>/dataset`;
4. prints `inspect` of that version and a few regenerated answers read back
   from the shards, beside the corpus' reference answers;
5. trains a DSpark draft and the DFlash baseline on the dataset (same shards,
   same budget), exports both and serves the DSpark draft with vLLM, heads
   included through the project's vLLM plugin (output identical to plain
   decoding, acceptance counters);
6. measures both drafts' acceptance length per domain offline and prints the
   table (only drafts it trained, and an untrained floor), the plot paths and
   one line naming the leader, with its ratio over the other draft and that
   ratio's interval at the demo's budget (pipeline/demo/verdict.py).

Every step is resumable: a second `make demo` reuses the target and finds the
dataset's units committed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pipeline.demo import CONFIG_DIR
from pipeline.logs import kv

log = logging.getLogger(__name__)

DEFAULT_CONFIG = CONFIG_DIR / "toy.yaml"


def run_demo(
    out_dir: Path, num_conversations: int | None = None, config_path: Path = DEFAULT_CONFIG
) -> dict:
    from rich.console import Console

    from pipeline.corpus.synthetic import write_corpus
    from pipeline.targets.resolve import resolve_model

    console = Console()
    config = demo_config(config_path, out_dir, num_conversations)
    started = time.monotonic()

    console.rule("[bold]1. toy target")
    model_dir = resolve_model(config.target.model)
    console.print(f"target model directory: {model_dir}")

    console.rule("[bold]2. synthetic corpus")
    syn = config.corpus.synthetic
    assert syn is not None, "the demo config uses the synthetic corpus"
    console.print("wrote " + ", ".join(str(p) for p in write_corpus(syn, out_dir / "corpus")))

    summary = regenerate_and_show(console, config, model_dir, first_step=3)

    console.rule("[bold]5. train DSpark and DFlash drafts on the dataset, serve DSpark with vLLM")
    from pipeline.demo.train import DEMO_STEPS, train_demo_draft

    trained = {
        kind: train_demo_draft(out_dir, data_uri=config.output.uri, kind=kind, serve=serve)
        for kind, serve in (("dspark", True), ("dflash", False))
    }
    console.print_json(data=trained)
    log.info("trained %s", kv(steps_each=DEMO_STEPS, drafts=",".join(trained)))

    console.rule("[bold]6. acceptance length on the held-out split (offline, T=0)")
    from pipeline.demo.verdict import comparison_line
    from pipeline.evaluate import demo_report

    evaluation = demo_report(
        out_dir / "eval", dspark=out_dir / "train", dflash=out_dir / "train-dflash"
    )
    verdict = comparison_line(evaluation.report, steps=DEMO_STEPS)
    if verdict:
        console.print(verdict, markup=False, highlight=False, soft_wrap=True)
    log.info("demo done %s", kv(total_s=round(time.monotonic() - started, 1)))
    return {
        "summary": summary,
        "dataset": config.output.uri,
        "train": trained,
        "eval": evaluation,
        "verdict": verdict,
    }


def demo_config(
    config_path: Path, out_dir: Path, num_conversations: int | None = None, **overrides
):
    """A demo's regeneration config, writing `<out_dir>/dataset`; `num_conversations` sets
    the synthetic corpus' size, or the mixture's (`corpus.size`) where there is one."""
    from pipeline.regenerate.config import load_config

    overrides = {"output.uri": str(out_dir / "dataset"), **overrides}
    if num_conversations:
        config = load_config(config_path, overrides=overrides)
        key = (
            "corpus.size"
            if config.corpus.size is not None
            else "corpus.synthetic.num_conversations"
        )
        overrides[key] = num_conversations
    return load_config(config_path, overrides=overrides)


def regenerate_and_show(
    console, config, model_dir: str, *, first_step: int, answer_label: str = "toy target's answer"
):
    """A demo's steps `first_step` and the next: regenerate + capture, then `inspect` of the
    committed version and a few answers read back from its shards. Returns the RunSummary."""
    from pipeline.regenerate.run import run_regenerate
    from pipeline.table.inspection import inspect_dataset

    console.rule(f"[bold]{first_step}. regenerate + capture (local Ray, CPU vLLM replica)")
    summary = run_regenerate(config)
    for line in summary.lines():
        console.print(line)
    console.rule(f"[bold]{first_step + 1}. dspark-targets inspect " + config.output.uri)
    print(inspect_dataset(config.output.uri).to_text())
    console.print(answers_table(config, model_dir, answer_label=answer_label))
    return summary


def answers_table(
    config, model_dir: str, per_domain: int = 1, answer_label: str = "toy target's answer"
):
    """A rich table of regenerated first answers, read back from the committed shards."""
    from rich.table import Table
    from transformers import AutoTokenizer

    from pipeline.corpus.identity import sample_id
    from pipeline.corpus.ingest import load_corpus
    from pipeline.table.reader import ShardReader

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    corpus = load_corpus(config.corpus)
    wanted: dict[str, object] = {}
    seen: dict[str, int] = {}
    for conv in corpus.conversations:
        if seen.get(conv.domain, 0) < per_domain:
            seen[conv.domain] = seen.get(conv.domain, 0) + 1
            wanted[sample_id(conv.conversation_id, 0)] = conv
    table = Table(title="regenerated first answers (read back from the shards)", show_lines=True)
    for column in ("domain", "prompt (last user turn)", answer_label, "corpus reference"):
        table.add_column(column)
    for sample in ShardReader(config.output.uri, prefetch=0):
        conv = wanted.get(sample.sample_id)
        if conv is None:
            continue
        prompt = next(m["content"] for m in conv.messages if m["role"] == "user")
        answer = tokenizer.decode(
            sample.input_ids[sample.num_prompt_tokens :], skip_special_tokens=True
        )
        reference = next((m["content"] for m in conv.messages if m["role"] == "assistant"), "")
        table.add_row(conv.domain, prompt, answer, reference)
    return table
