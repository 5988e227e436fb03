"""Options and checks that several commands share: `--config`, `--set`, `--endpoint-url`."""

from __future__ import annotations

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
