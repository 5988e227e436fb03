"""The project's named failure, and how the thin entrypoints report failures (light: no torch).

`KNOWN_ERRORS` are failures a user can act on from the message alone (bad
config or input, a missing file, a stage that stopped short); `jobs/*.py` and
the CLI print them as one line and exit 1, and show the traceback only with
`--verbose`. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class PipelineError(RuntimeError):
    """A stage stopped short; the message says what finished, what did not, and what to do."""


# ConfigError and the project's data errors are ValueErrors.
KNOWN_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, PipelineError)


def run_and_report(job: Callable[[], list[str]], *, verbose: bool) -> int:
    """Run `job`, print the lines it returns; one-line errors and exit 1 on known failures."""
    try:
        lines = job()
    except KNOWN_ERRORS as err:
        if verbose:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0
