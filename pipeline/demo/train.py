"""The training part of `make demo`: shards -> toy DSpark and DFlash drafts -> vLLM.

`train_demo_draft` trains one draft on the demo's dataset (or, without one,
on reference shards it writes from the trained toy target), exports it, and
(with `serve`) decodes held-out prompts with vLLM's CPU build, plain and
speculatively, returning vLLM's acceptance counters. `kind`:

* `dspark`: a DSpark draft in the fill-in layout (train-toy.yaml); vLLM's
  CPU build (no dspark method) serves its dflash export, the heads included
  through the project's plugin (pipeline/drafts/vllm_plugin.py);
* `dflash`: the DFlash baseline, the same config, shards and budget with the
  heads off and CE only (`draft.kind: dflash`), served as `dflash`;
* `eagle3`: the EAGLE-3 baseline (train-toy-eagle3.yaml), served as `eagle3`.

`make demo` trains the first two (pipeline/demo/run.py), so its table
compares DSpark with DFlash on equal terms.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.demo import CONFIG_DIR
from pipeline.drafts.registry import DEFAULT_KIND, draft_kind

DEMO_CONFIG = CONFIG_DIR / "train-toy.yaml"
EAGLE3_CONFIG = DEMO_CONFIG.with_name("train-toy-eagle3.yaml")
# Steps per draft: DSpark and DFlash each get this budget, so the two together take
# about what the one 150-step DSpark run of earlier demos took (DFlash steps are cheaper).
DEMO_STEPS = 100
KINDS = {  # kind -> (config, run directory under out_dir, extra overrides)
    "dspark": (DEMO_CONFIG, "train", {}),
    "dflash": (DEMO_CONFIG, "train-dflash", {"draft.kind": "dflash"}),
    "eagle3": (EAGLE3_CONFIG, "train-eagle3", {}),
}


def demo_train_config(
    out_dir: str | Path,
    shards: str,
    *,
    kind: str,
    num_steps: int = DEMO_STEPS,
    overrides: dict[str, Any] | None = None,
):
    """The TrainConfig of the demo's `kind` draft on `shards` (run dir under `out_dir`);
    `overrides` (dotted keys) go on top, as bench/demo_budget.py's seeds do."""
    from pipeline.train.config import load_train_config

    config_path, run_name, extra = KINDS[kind]
    return load_train_config(
        config_path,
        overrides={
            "data.uri": str(shards),
            "out_dir": str(Path(out_dir) / run_name),
            "num_steps": num_steps,
            **extra,
            **(overrides or {}),
        },
    )


def train_demo_draft(
    out_dir: str | Path,
    *,
    num_conversations: int = 400,
    num_steps: int = DEMO_STEPS,
    serve: bool = True,
    num_prompts: int = 6,
    data_uri: str | None = None,
    kind: str = DEFAULT_KIND,
) -> dict[str, Any]:
    """Train the toy draft under `out_dir` and return a small summary (see module docstring)."""

    from pipeline.demo.reference_shards import write_reference_shards
    from pipeline.table.dataset import Dataset
    from pipeline.train.trainer import train

    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: the demo trains one of {sorted(KINDS)}")
    out_dir = Path(out_dir)
    started = time.monotonic()
    # Train on the given dataset (the demo's regenerated one), else on reference shards.
    shards = data_uri or str(out_dir / "train-shards")
    if data_uri is None and Dataset.open(shards).latest_version() is None:
        write_reference_shards(shards, num_conversations=num_conversations, num_units=4)
    shard_seconds = time.monotonic() - started
    config = demo_train_config(out_dir, shards, kind=kind, num_steps=num_steps)
    result = train(config)
    first, last = result.metrics[0], result.metrics[-1]
    summary: dict[str, Any] = {
        "shard_seconds": round(shard_seconds, 1),
        "train_seconds": round(sum(m["seconds"] for m in result.metrics), 1),
        "steps": result.steps,
        "loss": [round(first["loss"], 3), round(last["loss"], 3)],
        "tau_tv_last_batch": round(last["tau_tv"], 2),
        "heldout": {k: round(v, 3) for k, v in result.heldout.items()},
        "export_dir": str(result.export_dir),
        "dflash_dir": str(result.dflash_dir),
    }
    # A kind trained in the fill-in layout serves through its backbone's export.
    served = result.dflash_dir if draft_kind(kind).fill_in_format else result.export_dir
    if serve and served is not None:
        from transformers import AutoTokenizer

        from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
        from pipeline.drafts.vllm_check import speculative_check
        from pipeline.render import first_prompt, render_prompt
        from pipeline.targets.resolve import resolve_model

        target_dir = resolve_model(config.target)
        tok = AutoTokenizer.from_pretrained(target_dir)
        convs = list(generate(SyntheticCorpusConfig(num_conversations=num_prompts, seed=12345)))
        prompts = [render_prompt(tok, first_prompt(c["messages"])) for c in convs]
        check = speculative_check(target_dir, served, prompts, max_tokens=96)
        summary["vllm"] = check.summary()
    summary["total_seconds"] = round(time.monotonic() - started, 1)
    return summary


if __name__ == "__main__":
    import json
    import sys

    from pipeline.logs import setup_logging

    setup_logging()
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/demo"
    kind = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_KIND
    print(json.dumps(train_demo_draft(out, kind=kind), indent=2))
