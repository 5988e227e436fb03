"""The `plan` command: a regeneration config resolved, its Ray resources and its capacity plan."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.options import CONFIG_OPTION, ENDPOINT_OPTION, SET_OPTION


@click.command()
@CONFIG_OPTION
@SET_OPTION
@click.option(
    "--inputs",
    "inputs_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Planner inputs YAML (sections corpus, target, assume; num_replicas), "
    "e.g. cluster/plan/moe-2p8t-gb300.yaml.",
)
@click.option(
    "--corpus-stats",
    default=None,
    metavar="SPEC",
    help="num_conversations=..,num_samples=..,prompt_tokens=..,answer_tokens=.. (means per "
    "sample) or a YAML/JSON file; keys given override what is read from a local corpus.",
)
@click.option(
    "--target-stats",
    default=None,
    metavar="SPEC",
    help="hidden_size=..,num_layers=..,params=..,active_params=..,vocab_size=.. or a file.",
)
@click.option(
    "--assume",
    "assume_spec",
    default=None,
    metavar="SPEC",
    help="Other inputs: the GPUs (gpu=GB300, train_gpu=H100; or gpu_memory_gb, "
    "train_gpu_tflops) and assumptions (codec_ratio, encode_mbps_per_core, train_epochs, "
    "train_mfu, ...), which the plan labels ASSUMPTION; see docs/cluster.md.",
)
@click.option("--replicas", type=int, default=None, help="Replicas (racks); default: the config's.")
@click.option(
    "--replica-tok-s",
    type=float,
    default=None,
    help="Generated tok/s of one replica while capturing (default: the project's measured "
    "figure for a known setup).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option(
    "--capacity-only",
    is_flag=True,
    help="Print only the capacity plan (not the resolved config and its Ray resources).",
)
@click.option(
    "--compare",
    "compare_uri",
    default=None,
    metavar="URI",
    help="Compare the prediction with a committed dataset (what `inspect` reports).",
)
@ENDPOINT_OPTION
def plan(
    config_path: Path,
    overrides: tuple[str, ...],
    inputs_path: Path | None,
    corpus_stats: str | None,
    target_stats: str | None,
    assume_spec: str | None,
    replicas: int | None,
    replica_tok_s: float | None,
    as_json: bool,
    capacity_only: bool,
    compare_uri: str | None,
    endpoint_url: str | None,
) -> None:
    """Validate a regeneration config; print it resolved, its Ray resources and its cost.

    Capacity: stored TB per version (hidden states + tokens, by codec), objects and
    shard sizes, hidden-state bytes/s per replica with the encode cores and upload
    bandwidth that takes, replica-hours, regeneration GPU-hours and wall days,
    training tokens and draft GPU-hours. Every figure that is assumed rather than
    read or measured is labelled as such, with where a measured one comes from.

    \b
    Examples:
      dspark-targets plan --config pipeline/demo/configs/toy.yaml
      dspark-targets plan --config jobs/configs/moe-2p8t-gb300.yaml \\
          --inputs cluster/plan/moe-2p8t-gb300.yaml --capacity-only
      dspark-targets plan --config jobs/configs/qwen3-8b.yaml --capacity-only \\
          --target-stats hidden_size=4096,num_layers=36,params=8.2e9,vocab_size=151936 \\
          --corpus-stats num_conversations=100000,num_samples=150000,prompt_tokens=800,answer_tokens=600 \\
          --assume gpu=H100 --replica-tok-s 20000
    """
    from pipeline.config import parse_overrides
    from pipeline.plan import describe_resources
    from pipeline.plan.planner import compare_with_dataset, make_plan
    from pipeline.regenerate.config import dump_config, load_config

    config = load_config(config_path, overrides=parse_overrides(list(overrides)))
    report = make_plan(
        config,
        str(config_path),
        inputs_path=inputs_path,
        corpus_spec=corpus_stats,
        target_spec=target_stats,
        assume_spec=assume_spec,
        num_replicas=replicas,
        replica_tok_s=replica_tok_s,
    )
    comparison = None
    if compare_uri is not None:
        comparison = compare_with_dataset(report, compare_uri, endpoint_url=endpoint_url)
    if as_json:
        import json

        out = report.to_dict()
        if comparison is not None:
            out["compare"] = comparison
        click.echo(json.dumps(out, indent=2, default=str))
        return
    if not capacity_only:
        click.echo(dump_config(config).rstrip())
        click.echo("---")
        click.echo(describe_resources(config))
        click.echo("---")
    click.echo(report.to_text())
    if comparison is not None:
        from pipeline.plan.report import comparison_table

        click.echo("---")
        click.echo(comparison_table(comparison))


COMMANDS = (plan,)
