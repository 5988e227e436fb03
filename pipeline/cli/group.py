"""The `dspark-targets` group itself: `--verbose`, one-line errors, and the console script.

`_Group.invoke` reports the library's errors as one line (exit 1) and `main`
click's usage errors (exit 2); `--verbose`/`-v`, before or after the command,
keeps tracebacks and third-party logs. The commands live beside this module, one
module per command group, and `pipeline/cli/__init__.py` adds them.
"""

from __future__ import annotations

import sys

import click


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
