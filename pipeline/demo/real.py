"""`make demo-real`: the real target end to end on one machine, as `make demo` runs the toy.

1. converts the packaged SmolLM2-135M-Instruct GGUF into a checked bf16
   directory (once; cached like the toys: docs/targets.md);
2. regenerates a slice of the real mixture of real-smollm2.yaml (chat, questions,
   code, prompts the target writes itself; `REAL_DEMO_CONVERSATIONS` of the
   12,000) with it on a local Ray and a CPU vLLM replica, capturing the union of
   the layers the drafts read (DFlash's spacing and EAGLE-3's low/middle/high);
3. prints `inspect` of the version and a few answers read back from the shards;
4. trains the DFlash baseline, DSpark (started from that DFlash draft) and the
   EAGLE-3 baseline on the same shards with one budget each (`num_steps`
   optimiser steps of 8 sequences), each reading its own subset of the
   captured layers (train-real*.yaml);
5. measures their acceptance length per domain offline (T=0) on the held-out
   split and on the source every draft was trained without (`REAL_LEFT_OUT`),
   prints both tables, each draft's ratio of the two, and one line naming the
   leader of the held-out table with its ratio over each other draft and the
   ratios' intervals (pipeline/demo/verdict.py).

The budget here is a demo's (minutes of CPU per draft), not a benchmark's:
bench/real_target.py trains the same drafts longer and adds serving speed
(and T=1). Every step is resumable, as `make demo`'s.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pipeline.demo import CONFIG_DIR
from pipeline.logs import kv

log = logging.getLogger(__name__)

REAL_CONFIG = CONFIG_DIR / "real-smollm2.yaml"
# The demo's slice of the 12,000-conversation mixture, and of the prompts the target
# writes itself: what fits `make demo-real`'s time on 2 cores.
REAL_DEMO_CONVERSATIONS = 640
REAL_DEMO_SELF_PROMPTS = 64
# The corpus source every real-target draft trains without (train-real*.yaml
# data.exclude_sources), measured on whole: prompts from a source no draft saw.
REAL_LEFT_OUT = ("truthfulqa",)
# Optimiser steps per draft (8 sequences each): what fits `make demo-real`'s time on
# 2 cores. Too few for the drafts' order to be settled; the table says so.
REAL_DEMO_STEPS = 150
# The demo's held-out share (train-real*.yaml's 0.05 is 20 samples of its slice, too
# few for an interval on every domain): about 95 samples, so the table and the verdict
# rank the drafts with intervals.
REAL_DEMO_HELDOUT = 0.15
# Why DSpark trails (docs/draft-study.md): EAGLE-3 led every DSpark recipe the study
# trained, at 300 and 1,200 steps, by less at the larger budget.
REAL_TRAILS_WHY = (
    "in the draft study (docs/draft-study.md) EAGLE-3 led every DSpark recipe at 300 and "
    "1,200 steps, by less as training grows (the best DSpark over EAGLE-3: 0.92 at 300 steps, "
    "0.96 at 1,200, on the held-out split); no budget run so far puts DSpark ahead. "
    "train-real.yaml trains the study's best DSpark cell (2 layers, rank 256, 1.0 CE + 0.9 TV, "
    "CE first, started from the DFlash draft)"
)
# Draft name -> (training config, run directory under out_dir, extra overrides), in
# training order: a warm-started draft after its source.
REAL_DRAFTS: dict[str, tuple[str, str, dict]] = {
    "DFlash": ("train-real-dflash.yaml", "train-dflash", {}),
    "DSpark": ("train-real.yaml", "train", {}),
    "EAGLE-3": ("train-real-eagle3.yaml", "train-eagle3", {}),
}
# Draft -> the draft of the same run it starts from (`init_from`): DSpark from the DFlash
# draft trained beside it (the draft study's best DSpark cell warm-starts; train-real.yaml).
REAL_WARM_FROM = {"DSpark": "DFlash"}


def real_train_config(out_dir: str | Path, data_uri: str, name: str, *, num_steps: int, **extra):
    """The TrainConfig of draft `name` of REAL_DRAFTS on `data_uri` (run dir under `out_dir`;
    a draft of REAL_WARM_FROM starts from its source's run there, trained first)."""
    from pipeline.train.config import load_train_config

    config_name, run_name, overrides = REAL_DRAFTS[name]
    warm = {}
    if name in REAL_WARM_FROM:
        warm["init_from"] = str(Path(out_dir) / REAL_DRAFTS[REAL_WARM_FROM[name]][1])
    return load_train_config(
        CONFIG_DIR / config_name,
        overrides={
            "data.uri": str(data_uri),
            "out_dir": str(Path(out_dir) / run_name),
            "num_steps": num_steps,
            **warm,
            **overrides,
            **extra,
        },
    )


def run_real_demo(
    out_dir: Path, *, num_conversations: int | None = None, num_steps: int = REAL_DEMO_STEPS
) -> dict:
    from rich.console import Console

    from pipeline.demo.run import demo_config, regenerate_and_show
    from pipeline.evaluate import demo_report
    from pipeline.targets.resolve import resolve_model
    from pipeline.train.trainer import train

    console = Console()
    config = demo_config(
        REAL_CONFIG,
        out_dir,
        num_conversations or REAL_DEMO_CONVERSATIONS,
        **{
            "corpus.self_prompts.num_prompts": REAL_DEMO_SELF_PROMPTS,
            "corpus.self_prompts.path": str(out_dir / "self-prompts.jsonl"),
        },
    )
    started = time.monotonic()

    console.rule(f"[bold]1. real target: {config.target.model}")
    model_dir = resolve_model(config.target.model)
    console.print(f"target model directory: {model_dir}")

    summary = regenerate_and_show(
        console, config, model_dir, first_step=2, answer_label="the target's answer"
    )

    console.rule(
        f"[bold]4. train DFlash, DSpark (from DFlash) and EAGLE-3 ({num_steps} steps each)"
    )
    trained: dict[str, dict] = {}
    for name in REAL_DRAFTS:
        result = train(
            real_train_config(
                out_dir,
                config.output.uri,
                name,
                num_steps=num_steps,
                **{"data.heldout_fraction": REAL_DEMO_HELDOUT},
            )
        )
        trained[name] = {
            "steps": result.steps,
            "train_seconds": round(sum(m["seconds"] for m in result.metrics), 1),
            "loss": [round(result.metrics[0]["loss"], 3), round(result.metrics[-1]["loss"], 3)],
            "export_dir": str(result.export_dir),
        }
    console.print_json(data=trained)

    console.rule(
        "[bold]5. acceptance length (offline, T=0): held-out split, and the source left out"
    )
    evaluation = demo_report(
        out_dir / "eval",
        dspark=out_dir / REAL_DRAFTS["DSpark"][1],
        dflash=out_dir / REAL_DRAFTS["DFlash"][1],
        eagle3=out_dir / REAL_DRAFTS["EAGLE-3"][1],
        left_out=REAL_LEFT_OUT,
    )
    from pipeline.demo.verdict import comparison_line

    verdict = comparison_line(evaluation.report, steps=num_steps, trails_why=REAL_TRAILS_WHY)
    if verdict:
        console.print(verdict, markup=False, highlight=False, soft_wrap=True)
    total = round(time.monotonic() - started, 1)
    log.info("demo-real done %s", kv(total_s=total))
    return {
        "summary": summary,
        "train": trained,
        "eval": evaluation,
        "verdict": verdict,
        "total_s": total,
    }
