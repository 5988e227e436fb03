"""Draft commands: `train` a draft from committed shards and `evaluate` drafts against the target."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.cli.options import CONFIG_OPTION, set_option


@click.command()
@CONFIG_OPTION
@set_option("num_steps=200")
@click.option(
    "--follow", is_flag=True, help="Start while a regeneration still commits; read new versions."
)
def train(config_path: Path, overrides: tuple[str, ...], follow: bool) -> None:
    """Train a draft (DSpark, DFlash or EAGLE-3: `draft.kind`) from committed shards; export it.

    With --follow, training starts while a regeneration still commits: epoch 0
    picks up each new version as it lands (same as --set data.follow=true).

    \b
    Example:
      dspark-targets train --config pipeline/demo/configs/train-toy.yaml --set num_steps=50
    """
    from pipeline.config import parse_overrides
    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import summary_lines
    from pipeline.train.trainer import train as run_train

    pairs = parse_overrides(list(overrides))
    if follow:
        pairs["data.follow"] = True
    result = run_train(load_train_config(config_path, overrides=pairs))
    click.echo("\n".join(summary_lines(result)))


@click.command()
@CONFIG_OPTION
@set_option("live.num_prompts=4")
def evaluate(config_path: Path, overrides: tuple[str, ...]) -> None:
    """Measure drafts' acceptance length per domain against the target; write a report.

    Exits 1 if the vLLM cross-check (when configured) falls outside its tolerance.

    \b
    Example:
      dspark-targets evaluate --config pipeline/demo/configs/eval-toy.yaml
    """
    from pipeline.config import parse_overrides
    from pipeline.evaluate.config import load_eval_config
    from pipeline.evaluate.run import run_evaluation

    result = run_evaluation(
        load_eval_config(config_path, overrides=parse_overrides(list(overrides)))
    )
    click.echo("\n".join(result.lines()))
    if not result.ok:
        click.secho(
            "error: vLLM's tau is outside the stated tolerance of the offline tau",
            fg="red",
            err=True,
        )
        sys.exit(1)


COMMANDS = (train, evaluate)
