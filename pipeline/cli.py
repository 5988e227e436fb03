"""The `dspark-targets` command: a thin layer that parses arguments and calls the library.

`python -m pipeline <command>` is the one command surface, on a laptop and in
`ray job submit` alike. Each command exits non-zero on failure with a one-line
reason (`_Group.invoke` for the library's errors, `main` for click's usage
errors); `--verbose`/`-v`, before or after the command, keeps tracebacks and
third-party logs. Over 400 lines on purpose: one short parse-and-call function
per command, every option with its help text and an example; nothing else
lives here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="YAML config (examples: jobs/configs/, pipeline/demo/configs/).",
)


def set_option(example: str):
    """`--set KEY=VALUE`, repeatable, with an example key of the command's own config."""
    return click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help=f"Override a config key with a YAML value (repeatable), e.g. --set {example}.",
    )


SET_OPTION = set_option("replicas.num_replicas=2")  # regeneration configs


def _verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta["dspark.verbose"] = True
        from pipeline.logs import setup_logging

        setup_logging(True)


class _Group(click.Group):
    """The one place the library's errors are reported: as one line, exit 1.

    `pipeline.errors.describe_error` says which failures a user can act on;
    anything else is a bug and keeps its traceback. Every command also takes
    `--verbose/-v` (after its name, as well as before it); with it, a failure
    keeps its traceback too.
    """

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params.append(
            click.Option(
                ["--verbose", "-v"],
                is_flag=True,
                expose_value=False,
                is_eager=True,
                callback=_verbose,
                help="Debug logs and full tracebacks.",
            )
        )
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except Exception as err:
            from pipeline.config import WrongConfigKind
            from pipeline.errors import describe_error

            message = describe_error(err)
            if message is None or ctx.meta.get("dspark.verbose"):
                raise
            if isinstance(err, WrongConfigKind) and ctx.invoked_subcommand:
                article = "an" if err.kind[0] in "aeiou" else "a"
                message += f"; `{ctx.invoked_subcommand}` takes {article} {err.kind} config"
            click.secho(f"error: {message}", fg="red", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_verbose,
    help="Debug logs and full tracebacks.",
)
@click.version_option(package_name="dspark-targets")
def cli() -> None:
    """Produce and use training targets for DSpark/DFlash/EAGLE-3 speculative-decoding drafts.

    On a Ray cluster, submit any command as a job:

    \b
      ray job submit --working-dir . -- python -m pipeline regenerate \\
          --config jobs/configs/qwen3-8b.yaml
    """
    from pipeline.logs import setup_logging

    setup_logging(bool(click.get_current_context().meta.get("dspark.verbose")))


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


@cli.command()
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


@cli.command()
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


def check_dataset_uri(uri: str) -> str:
    """`uri`, after checking that a local one names a directory that exists."""
    if "://" in uri and not uri.startswith("file://"):
        return uri
    path = Path(uri.removeprefix("file://"))
    if not path.exists():
        raise FileNotFoundError(f"{uri}: no such dataset (the path does not exist)")
    if not path.is_dir():
        raise NotADirectoryError(f"{uri} is a file; a dataset is a directory or an s3:// prefix")
    return uri


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
@click.option(
    "--sources", is_flag=True, help="Also read every shard's small columns: tokens per source."
)
@ENDPOINT_OPTION
def inspect(uri: str, version: int | None, sources: bool, endpoint_url: str | None) -> None:
    """Show a dataset's versions, shards, rows, tokens, bytes per token and provenance.

    Exits 1 when nothing has been committed there.

    \b
    Example:
      dspark-targets inspect runs/demo/dataset
    """
    from pipeline.table.inspection import inspect_dataset

    report = inspect_dataset(
        check_dataset_uri(uri), version=version, endpoint_url=endpoint_url, sources=sources
    )
    if report.manifest is None:
        raise ValueError(f"{report.uri}: no committed version (no dataset there, or none yet)")
    click.echo(report.to_text())


@cli.command()
@click.argument("uri")
@click.option(
    "--version", "version", type=int, default=None, help="Version to verify (default: latest)."
)
@click.option(
    "--against-target",
    is_flag=True,
    help="Also recompute random samples with the target (transformers, float32) and compare "
    "every stored layer and the final state; exit 1 past the tolerance or on an off-by-one.",
)
@click.option("--samples", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--target", default=None, help="Model reference (default: the provenance's).")
@ENDPOINT_OPTION
def verify(
    uri: str,
    version: int | None,
    against_target: bool,
    samples: int,
    seed: int,
    target: str | None,
    endpoint_url: str | None,
) -> None:
    """Re-hash and decode every shard of a dataset version; exit 1 naming corrupt shards.

    With --against-target, also recompute random samples with the target and
    compare every stored layer; exit 1 past the tolerance or on an off-by-one.

    \b
    Example:
      dspark-targets verify s3://bucket/datasets/qwen3-8b --version 3
      dspark-targets verify runs/demo/dataset --against-target --samples 4
    """
    from pipeline.table.inspection import verify_dataset

    report = verify_dataset(check_dataset_uri(uri), version=version, endpoint_url=endpoint_url)
    click.echo(report.to_text())
    ok = report.ok
    if against_target and not ok:
        click.echo("target check skipped: the version's files are damaged")
    elif against_target:
        from pipeline.regenerate.target_check import check_against_target

        check = check_against_target(
            uri,
            version=report.version,
            num_samples=samples,
            seed=seed,
            target=target,
            endpoint_url=endpoint_url,
        )
        click.echo(check.to_text())
        ok = ok and check.ok
    if not ok:
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
    """Write the live samples of a dataset version in another trainer's layout.

    \b
    Example:
      dspark-targets export runs/demo/dataset --format hf-datasets --out runs/demo/hf
    """
    from pipeline.table.export import export_dataset

    report = export_dataset(
        check_dataset_uri(uri),
        out,
        format=fmt,
        version=version,
        endpoint_url=endpoint_url,
        verify=verify,
    )
    click.echo(report.to_text())


@cli.command()
@click.argument("uri")
@click.option("--delete", is_flag=True, help="Delete (default: only list) what gc finds.")
@click.option(
    "--keep-versions",
    type=click.IntRange(min=1),
    default=None,
    metavar="K",
    help="Retain only the newest K versions (plus pinned ones, the newest complete one and "
    "what _latest names); default: retain every version.",
)
@click.option(
    "--min-age-hours",
    type=float,
    default=72.0,
    show_default=True,
    help="Keep unreferenced files younger than this, on the store's clock (must exceed the "
    "longest commit, 24 h, unless --unsafe-min-age).",
)
@click.option(
    "--unsafe-min-age",
    is_flag=True,
    help="Accept a --min-age-hours at or below the longest commit (then only live write "
    "sessions protect commits in flight).",
)
@ENDPOINT_OPTION
def gc(
    uri: str,
    delete: bool,
    keep_versions: int | None,
    min_age_hours: float,
    unsafe_min_age: bool,
    endpoint_url: str | None,
) -> None:
    """List (or delete) what no retained version names and no live writer may commit.

    Files a live write session may still commit are kept whatever their age;
    stale multipart uploads are aborted; with --keep-versions, older unpinned
    versions are retired (their roots stay) and the files only they named go.

    \b
    Example:
      dspark-targets gc runs/demo/dataset --keep-versions 2 --delete
    """
    from pipeline.table.gc import gc_dataset
    from pipeline.table.retention import check_min_age

    min_age_s = check_min_age(min_age_hours * 3600, unsafe=unsafe_min_age, what="--min-age-hours")
    report = gc_dataset(
        check_dataset_uri(uri),
        delete=delete,
        keep_versions=keep_versions,
        min_age_s=min_age_s,
        unsafe_min_age=unsafe_min_age,
        endpoint_url=endpoint_url,
    )
    click.echo(report.to_text())


@cli.command()
@click.argument("uri")
@click.option("--apply", is_flag=True, help="Write the repairs (default: only say what it finds).")
@ENDPOINT_OPTION
def repair(uri: str, apply: bool, endpoint_url: str | None) -> None:
    """Rebuild a dataset's `_latest` pointer and newest root from the versions present.

    A damaged pointer is rewritten to the newest intact version; damaged roots
    are retired, and if the newest ones are damaged, a new version repeats
    the newest intact one with the changes recovered from their segments.
    Dry run by default.

    \b
    Example:
      dspark-targets repair s3://bucket/datasets/qwen3-8b --apply
    """
    from pipeline.table.repair import repair_dataset

    report = repair_dataset(check_dataset_uri(uri), apply=apply, endpoint_url=endpoint_url)
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


@cli.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Run directory (default: runs/demo, or runs/real with --real).",
)
@click.option(
    "--num-conversations",
    type=click.IntRange(min=1),
    default=None,
    help="Corpus size (default: the config's).",
)
@click.option(
    "--real",
    is_flag=True,
    help="The real target (SmolLM2-135M-Instruct; `make setup-real`) instead of the toy: "
    "regenerate, train DSpark, DFlash and EAGLE-3, print their acceptance lengths.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="--real: optimiser steps per draft (default: the demo's budget).",
)
def demo(out: Path | None, num_conversations: int | None, real: bool, steps: int | None) -> None:
    """Run the embedded default end to end on this machine (local Ray, CPU vLLM, toy target).

    With --real: the real target SmolLM2-135M-Instruct instead, into runs/real.

    \b
    Examples:
      dspark-targets demo --out runs/demo
      dspark-targets demo --real
    """
    if real:
        from pipeline.demo.real import REAL_DEMO_STEPS, run_real_demo

        run_real_demo(
            out or Path("runs/real"),
            num_conversations=num_conversations,
            num_steps=steps or REAL_DEMO_STEPS,
        )
        return
    if steps is not None:
        raise click.UsageError("--steps applies to --real only")
    from pipeline.demo.run import run_demo

    run_demo(out_dir=out or Path("runs/demo"), num_conversations=num_conversations)


@cli.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--num-conversations", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def corpus(out: Path, num_conversations: int, seed: int) -> None:
    """Write the synthetic multi-domain corpus as JSONL and Parquet.

    \b
    Example:
      dspark-targets corpus --out runs/corpus --num-conversations 300
    """
    from pipeline.corpus.synthetic import SyntheticCorpusConfig, write_corpus

    paths = write_corpus(SyntheticCorpusConfig(num_conversations=num_conversations, seed=seed), out)
    for path in paths:
        click.echo(str(path))


@cli.command("self-prompts")
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
    click.echo(str(ensure_self_prompts(config.corpus.self_prompts, config.target)))


@cli.command("toy-target")
@click.argument("name", default="trained")
@click.option("--report", is_flag=True, help="Also print held-out loss, answer diversity, entropy.")
def toy_target(name: str, report: bool) -> None:
    """Build (or find cached) a toy target model and print its directory.

    \b
    Example:
      dspark-targets toy-target trained --report
    """
    import json

    from pipeline.toy.target import build_toy_target

    model_dir = build_toy_target(name)
    click.echo(str(model_dir))
    if report:
        from pipeline.demo.quality import quality_report

        click.echo(json.dumps(quality_report(model_dir), indent=2))


def main() -> None:
    """The console script: click's usage errors, too, as one line (exit 2)."""
    try:
        code = cli.main(prog_name="dspark-targets", standalone_mode=False)
    except click.UsageError as err:
        if type(err).__name__ == "NoArgsIsHelpError":  # a bare `dspark-targets`: its help
            click.echo(err.format_message(), err=True)
            sys.exit(err.exit_code)
        hint = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
        click.secho(f"error: {err.format_message()}{hint}", fg="red", err=True)
        sys.exit(err.exit_code)
    except click.ClickException as err:
        click.secho(f"error: {err.format_message()}", fg="red", err=True)
        sys.exit(err.exit_code)
    except click.Abort:
        click.secho("error: aborted", fg="red", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
