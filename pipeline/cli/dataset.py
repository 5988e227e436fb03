"""Dataset commands over a committed dataset URI: `inspect`, `verify`, `export`, `gc`, `repair`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.cli.options import ENDPOINT_OPTION, check_dataset_uri


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


@click.command()
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


COMMANDS = (inspect, verify, export, gc, repair)
