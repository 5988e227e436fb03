"""Training a draft: `train(config)` runs the whole run, in this process or on Ray Train.

`train(config)` pins the dataset version the run reads (pipeline/train/pinning.py),
runs a `Trainer` (pipeline/train/loop.py: set-up, resume, the loop's named steps)
in this process (num_workers == 1) or one per Ray Train worker in a `TorchTrainer`
(gloo on CPU, NCCL on GPU), reads back the run's summary, releases the pins once
the run is finished and exports the final draft. `summary_lines` is what
`dspark-targets train` prints.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.drafts.checkpoint import export_dir, latest_checkpoint
from pipeline.torch_threads import torch_threads
from pipeline.train.config import TrainConfig
from pipeline.train.loop import Trainer
from pipeline.train.metrics import read_metrics, read_summary
from pipeline.train.pinning import pin_data_version, release_run_pins

__all__ = ["TrainResult", "Trainer", "run_worker", "summary_lines", "train"]

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    out_dir: Path
    steps: int  # optimiser steps completed (over all runs of this out_dir)
    metrics: list[dict[str, Any]]  # one per step, from metrics.jsonl
    heldout: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    export_dir: Path | None = None
    dflash_dir: Path | None = None


def train(
    config: TrainConfig, *, stop_after: int | None = None, export: bool = True
) -> TrainResult:
    """Train (or resume) per `config`; export the final draft when `export`.

    `stop_after` ends this run after that many total steps (the schedule still
    spans `num_steps`): how tests and users simulate an interrupted run.
    """
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = pin_data_version(config)  # once, for every worker
    if config.num_workers > 1 or config.use_ray:
        from pipeline.train.distributed import train_on_ray

        train_on_ray(
            config, _ray_loop, {"config": config.model_dump(mode="json"), "stop_after": stop_after}
        )
    else:
        run_worker(config.model_dump(mode="json"), stop_after=stop_after)
    summary = read_summary(out_dir)
    result = TrainResult(
        out_dir=out_dir,
        steps=summary["steps"],
        metrics=read_metrics(out_dir),
        heldout=summary.get("heldout", {}),
        checkpoint=latest_checkpoint(out_dir),
    )
    if result.steps >= config.num_steps:
        release_run_pins(config)  # finished: no resume will read the data again
    if export and result.steps >= config.num_steps:
        from pipeline.drafts.export import export_checkpoint

        if config.export.dflash_backbone is not None:
            log.warning(
                "export.dflash_backbone is ignored: a DSpark draft in the fill-in layout is "
                "exported as its DFlash backbone only; remove the key"
            )
        paths = export_checkpoint(result.checkpoint, export_dir(out_dir, config.export.dir))
        result.export_dir = paths.draft
        result.dflash_dir = paths.dflash_backbone
    return result


def run_worker(
    config_data: dict[str, Any], *, stop_after: int | None = None, distributed: bool = False
) -> None:
    """One worker's whole run (rank and world size come from torch.distributed)."""
    config = TrainConfig.model_validate(config_data)
    with torch_threads(config.num_threads):
        trainer = Trainer(config, distributed=distributed)
        trainer.resume()
        trainer.train(stop_after=stop_after)


def _ray_loop(loop_config: dict[str, Any]) -> None:
    """What every Ray Train worker runs."""
    run_worker(loop_config["config"], stop_after=loop_config["stop_after"], distributed=True)


def summary_lines(result: TrainResult) -> list[str]:
    """A short human-readable report of a run (what `dspark-targets train` prints)."""
    lines = [f"trained {result.steps} steps -> {result.out_dir}"]
    if result.metrics:
        first, last = result.metrics[0], result.metrics[-1]
        lines.append(
            f"loss {first['loss']:.3f} -> {last['loss']:.3f}; "
            f"teacher-forced tau {first['tau_tv']:.2f} -> {last['tau_tv']:.2f} (last batch)"
        )
    if result.heldout:
        h = result.heldout
        lines.append(
            f"held-out ({h['samples']} samples): tau_tv {h['tau_tv']:.2f}, tau_greedy {h['tau_greedy']:.2f}"
        )
    if result.export_dir:
        what = "its DFlash backbone, served by vLLM's CPU build" if result.dflash_dir else "draft"
        lines.append(f"export ({what}, speculators format): {result.export_dir}")
    return lines
