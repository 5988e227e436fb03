"""The `dspark-targets` command: a thin layer that parses arguments and calls the library.

Each command exits non-zero on failure with a one-line reason; `--verbose`
shows tracebacks and third-party logs. Over 400 lines on purpose: one short
parse-and-call function per command (thirteen of them, every option with its
help text); nothing else lives here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.errors import KNOWN_ERRORS

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="YAML config (examples: jobs/configs/, pipeline/demo/configs/).",
)
SET_OPTION = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key with a YAML value, e.g. --set replicas.num_replicas=2.",
)


class _Group(click.Group):
    """Turns known errors into a one-line message and exit code 1 (2 for usage)."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except KNOWN_ERRORS as err:
            if ctx.params.get("verbose"):
                raise
            click.secho(f"error: {err}", fg="red", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--verbose", "-v", is_flag=True, help="Debug logs and full tracebacks.")
@click.version_option(package_name="dspark-targets")
def cli(verbose: bool) -> None:
    """Produce and use training targets for DSpark/DFlash speculative-decoding drafts."""
    from pipeline.logs import setup_logging

    setup_logging(verbose)


@cli.command()
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
    """
    from pipeline.config import parse_overrides
    from pipeline.regenerate.config import load_config
    from pipeline.regenerate.run import run_regenerate

    config = load_config(config_path, overrides=parse_overrides(list(overrides)))
    summary = run_regenerate(config, summary_json=summary_json)
    for line in summary.lines():
        click.echo(line)


@cli.command()
@CONFIG_OPTION
@SET_OPTION
@click.option(
    "--follow", is_flag=True, help="Start while a regeneration still commits; read new versions."
)
def train(config_path: Path, overrides: tuple[str, ...], follow: bool) -> None:
    """Train a DSpark draft from committed shards and export it for vLLM.

    With --follow, training starts while a regeneration still commits: epoch 0
    picks up each new version as it lands (same as --set data.follow=true).
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


@cli.command()
@CONFIG_OPTION
@SET_OPTION
def evaluate(config_path: Path, overrides: tuple[str, ...]) -> None:
    """Measure drafts' acceptance length per domain against the target; write a report.

    Exits 1 if the vLLM cross-check (when configured) falls outside its tolerance.
    """
    from pipeline.config import parse_overrides
    from pipeline.evaluate.config import load_eval_config
    from pipeline.evaluate.run import run_evaluation

    result = run_evaluation(
        load_eval_config(config_path, overrides=parse_overrides(list(overrides)))
    )
    click.echo("\n".join(result.lines()))
    if not result.ok:
        sys.exit(1)


@cli.command()
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


ENDPOINT_OPTION = click.option(
    "--endpoint-url",
    envvar="AWS_ENDPOINT_URL",
    default=None,
    help="S3-compatible endpoint for s3:// URIs (default: $AWS_ENDPOINT_URL, else AWS).",
)


@cli.command()
@click.argument("uri")
@click.option(
    "--version", "version", type=int, default=None, help="Version to detail (default: latest)."
)
@ENDPOINT_OPTION
def inspect(uri: str, version: int | None, endpoint_url: str | None) -> None:
    """Show a dataset's versions, shards, rows, tokens, bytes per token and provenance."""
    from pipeline.shards.inspection import inspect_dataset

    click.echo(inspect_dataset(uri, version=version, endpoint_url=endpoint_url).to_text())


@cli.command()
@click.argument("uri")
@click.option(
    "--version", "version", type=int, default=None, help="Version to verify (default: latest)."
)
@ENDPOINT_OPTION
def verify(uri: str, version: int | None, endpoint_url: str | None) -> None:
    """Re-hash and decode every shard of a dataset version; exit 1 naming corrupt shards."""
    from pipeline.shards.inspection import verify_dataset

    report = verify_dataset(uri, version=version, endpoint_url=endpoint_url)
    click.echo(report.to_text())
    if not report.ok:
        sys.exit(1)


@cli.command()
@click.argument("uri")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["hf-datasets", "speculators"]),
    required=True,
    help="hf-datasets: a datasets.save_to_disk directory; speculators: the per-sample "
    "hs_{i}.safetensors + Arrow token dataset layout speculators' offline training reads.",
)
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="New directory."
)
@click.option(
    "--version", "version", type=int, default=None, help="Version to export (default: latest)."
)
@click.option(
    "--verify", is_flag=True, help="Re-hash every shard against the manifest before reading it."
)
@ENDPOINT_OPTION
def export(
    uri: str, fmt: str, out: Path, version: int | None, verify: bool, endpoint_url: str | None
) -> None:
    """Write the live samples of a dataset version in another trainer's layout."""
    from pipeline.shards.export import export_dataset

    report = export_dataset(
        uri, out, format=fmt, version=version, endpoint_url=endpoint_url, verify=verify
    )
    click.echo(report.to_text())


@cli.command()
@click.argument("uri")
@click.option("--delete", is_flag=True, help="Delete (default: only list) what gc finds.")
@click.option(
    "--keep-versions",
    type=int,
    default=None,
    metavar="K",
    help="Retain only the newest K versions (plus pinned ones and the newest complete one); "
    "default: retain every version.",
)
@click.option(
    "--min-age-hours",
    type=float,
    default=1.0,
    show_default=True,
    help="Also keep unreferenced files younger than this (for writers outside a write session).",
)
@ENDPOINT_OPTION
def gc(
    uri: str,
    delete: bool,
    keep_versions: int | None,
    min_age_hours: float,
    endpoint_url: str | None,
) -> None:
    """List (or delete) what no retained version names and no live writer may commit.

    Files a live write session may still commit are kept whatever their age;
    stale multipart uploads are aborted; with --keep-versions, the roots of
    older unpinned versions go, and the files only they named.
    """
    from pipeline.shards.gc import gc_dataset

    report = gc_dataset(
        uri,
        delete=delete,
        keep_versions=keep_versions,
        min_age_s=min_age_hours * 3600,
        endpoint_url=endpoint_url,
    )
    click.echo(report.to_text())


@cli.command()
@CONFIG_OPTION
@SET_OPTION
@click.option(
    "--inputs",
    "inputs_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Planner inputs YAML (sections corpus, target, assume; num_replicas), "
    "e.g. cluster/plan-moe-2p8t-gb300.yaml.",
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
    help="Other assumptions (codec_ratio, encode_mbps_per_core, gpu_memory_gb, train_epochs, "
    "train_gpu_tflops, train_mfu, ...); see docs/cluster.md.",
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
    """Validate a config; print it resolved, the resources it asks for, and what its corpus costs.

    Capacity: stored TB per version (hidden states + tokens, by codec), objects and
    shard sizes, hidden-state bytes/s per replica with the encode cores and upload
    bandwidth that takes, replica-hours and wall days, training tokens and draft
    GPU-hours.
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


@cli.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/demo"))
@click.option(
    "--num-conversations", type=int, default=None, help="Corpus size (default: the config's)."
)
def demo(out: Path, num_conversations: int | None) -> None:
    """Run the embedded default end to end on this machine (local Ray, CPU vLLM, toy target)."""
    from pipeline.demo.run import run_demo

    run_demo(out_dir=out, num_conversations=num_conversations)


@cli.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--num-conversations", type=int, default=1000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def corpus(out: Path, num_conversations: int, seed: int) -> None:
    """Write the synthetic multi-domain corpus as JSONL and Parquet."""
    from pipeline.corpus.synthetic import SyntheticCorpusConfig, write_corpus

    paths = write_corpus(SyntheticCorpusConfig(num_conversations=num_conversations, seed=seed), out)
    for path in paths:
        click.echo(str(path))


@cli.command("toy-target")
@click.argument("name", default="trained")
@click.option("--report", is_flag=True, help="Also print held-out loss, answer diversity, entropy.")
def toy_target(name: str, report: bool) -> None:
    """Build (or find cached) a toy target model and print its directory."""
    import json

    from pipeline.toy.target import build_toy_target

    model_dir = build_toy_target(name)
    click.echo(str(model_dir))
    if report:
        from pipeline.demo.quality import quality_report

        click.echo(json.dumps(quality_report(model_dir), indent=2))


def main() -> None:
    cli(prog_name="dspark-targets")


if __name__ == "__main__":
    main()
