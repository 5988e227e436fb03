"""Regeneration commands: `regenerate`, `refresh` and `self-prompts`."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import CONFIG_OPTION, SET_OPTION, set_option


@click.command()
@CONFIG_OPTION
@SET_OPTION
@click.option(
    "--summary-json",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the run summary (tokens, rates, engine start, errors, version) as JSON.",
)
def regenerate(config_path: Path, overrides: tuple[str, ...], summary_json: Path | None) -> None:
    """Regenerate assistant turns with the target and capture hidden states into shards.

    Resumable: a rerun skips the units the dataset already holds.

    \b
    Example:
      dspark-targets regenerate --config pipeline/demo/configs/toy.yaml \\
          --set replicas.num_replicas=1
    """
    from pipeline.config import parse_overrides
    from pipeline.regenerate.config import load_config
    from pipeline.regenerate.run import run_regenerate

    config = load_config(config_path, overrides=parse_overrides(list(overrides)))
    summary = run_regenerate(config, summary_json=summary_json)
    for line in summary.lines():
        click.echo(line)


@click.command()
@CONFIG_OPTION
@SET_OPTION
@click.option(
    "--local",
    is_flag=True,
    help="Run in this process on one backend (e.g. target.backend=hf) instead of Ray replicas.",
)
@click.option(
    "--wait-for-lease",
    type=float,
    default=0.0,
    show_default=True,
    metavar="SECONDS",
    help="If another driver holds the dataset's lease, wait this long for it (default: exit at once).",
)
@click.option(
    "--summary-json",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the run summary as JSON.",
)
def refresh(
    config_path: Path,
    overrides: tuple[str, ...],
    local: bool,
    wait_for_lease: float,
    summary_json: Path | None,
) -> None:
    """Regenerate only what changed and publish the next dataset version.

    Diffs the corpus against the latest version by sample id and input hash:
    new and changed samples are regenerated, removed ones tombstoned. A new
    target revision, layer set, template, codec or generation parameters start
    a new lineage (said in one line before any engine starts). Exits 1 naming
    the holder if another regeneration or refresh holds the dataset's lease.

    \b
    Example:
      dspark-targets refresh --config jobs/configs/qwen3-8b.yaml --wait-for-lease 600
    """
    from pipeline.config import parse_overrides
    from pipeline.regenerate.config import load_config
    from pipeline.regenerate.refresh import run_refresh

    config = load_config(config_path, overrides=parse_overrides(list(overrides)))
    summary = run_refresh(
        config, local=local, wait_for_lease_s=wait_for_lease, show_progress=not local
    )
    if summary_json is not None:
        summary.write_json(summary_json)
    for line in summary.lines():
        click.echo(line)


@click.command("self-prompts")
@CONFIG_OPTION
@set_option("corpus.self_prompts.num_prompts=200")
def self_prompts(config_path: Path, overrides: tuple[str, ...]) -> None:
    """Sample the prompt file of `corpus.self_prompts` with the config's target (once).

    \b
    Example:
      dspark-targets self-prompts --config pipeline/demo/configs/real-smollm2.yaml
    """
    from pipeline.config import ConfigError, parse_overrides
    from pipeline.regenerate.config import load_config
    from pipeline.regenerate.driver.self_prompts import ensure_self_prompts

    config = load_config(config_path, overrides=parse_overrides(list(overrides)))
    if config.corpus.self_prompts is None:
        raise ConfigError(f"{config_path}: corpus.self_prompts is not set: nothing to sample")
    path = ensure_self_prompts(config.corpus.self_prompts, config.target, show_progress=True)
    click.echo(str(path))


COMMANDS = (regenerate, refresh, self_prompts)
