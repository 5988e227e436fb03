"""Commands for this machine: the embedded `demo`, the synthetic `corpus` and a `toy-target`."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
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


@click.command()
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


@click.command("toy-target")
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


COMMANDS = (demo, corpus, toy_target)
