"""The `dspark-targets` command: a thin layer that parses arguments and calls the library.

`python -m pipeline <command>` is the one command surface, on a laptop and in
`ray job submit` alike. Each command exits non-zero on failure with a one-line
reason (`group.py`). One module per command group, each a short parse-and-call
function per command with every option's help text and an example; nothing else
lives here:

  regenerate.py  regenerate, refresh, self-prompts
  drafts.py      train, evaluate
  dataset.py     inspect, verify, export, gc, repair
  plan.py        plan
  demo.py        demo, corpus, toy-target
"""

from __future__ import annotations

from pipeline.cli import dataset, demo, drafts, plan, regenerate
from pipeline.cli.group import cli, main

for _module in (regenerate, drafts, dataset, plan, demo):
    for _command in _module.COMMANDS:
        cli.add_command(_command)

__all__ = ["cli", "main"]
