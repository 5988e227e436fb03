"""The training part of `make demo`: reference shards -> a toy DSpark draft -> vLLM.

`train_demo_draft` writes reference shards from the trained toy target (the
HF reference path, until the regeneration stage's shards are used), trains a
DSpark draft in the fill-in layout for a couple of minutes, exports it, and
(with `serve`) decodes held-out prompts with vLLM's CPU build, plain and with
the draft's DFlash backbone, returning vLLM's acceptance counters.
`kind="eagle3"` trains the EAGLE-3 baseline instead (train-toy-eagle3.yaml)
and serves it with vLLM's `eagle3` method.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.demo import CONFIG_DIR

DEMO_CONFIG = CONFIG_DIR / "train-toy.yaml"
EAGLE3_CONFIG = DEMO_CONFIG.with_name("train-toy-eagle3.yaml")


def train_demo_draft(
    out_dir: str | Path,
    *,
    num_conversations: int = 400,
    num_steps: int = 150,
    serve: bool = True,
    num_prompts: int = 6,
    data_uri: str | None = None,
    kind: str = "dspark",
) -> dict[str, Any]:
    """Train the toy draft under `out_dir` and return a small summary (see module docstring)."""

    from pipeline.demo.reference_shards import write_reference_shards
    from pipeline.shards.manifest import Dataset
    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import train

    if kind not in ("dspark", "eagle3"):
        raise ValueError(f"kind {kind!r}: the demo trains 'dspark' or 'eagle3'")
    out_dir = Path(out_dir)
    started = time.monotonic()
    # Train on the given dataset (the demo's regenerated one), else on reference shards.
    shards = data_uri or str(out_dir / "train-shards")
    if data_uri is None and Dataset.open(shards).latest_version() is None:
        write_reference_shards(shards, num_conversations=num_conversations, num_units=4)
    shard_seconds = time.monotonic() - started
    config = load_train_config(
        EAGLE3_CONFIG if kind == "eagle3" else DEMO_CONFIG,
        overrides={
            "data.uri": str(shards),
            "out_dir": str(out_dir / ("train-eagle3" if kind == "eagle3" else "train")),
            "num_steps": num_steps,
        },
    )
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
    served = result.export_dir if kind == "eagle3" else result.dflash_dir
    if serve and served is not None:
        from transformers import AutoTokenizer

        from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
        from pipeline.render import first_prompt, render_prompt
        from pipeline.targets.resolve import resolve_model
        from pipeline.train.vllm_check import speculative_check

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
    kind = sys.argv[2] if len(sys.argv) > 2 else "dspark"
    print(json.dumps(train_demo_draft(out, kind=kind), indent=2))
