"""The figures the chaos and bad-input suites publish (docs/RELIABILITY.md).

Each test that tries a fault or a bad input calls `record(...)` with what it
did and what it found; with `DSPARK_RELIABILITY_RESULTS` set (`make chaos`
sets it) every call appends one JSON line there, and `bench/reliability.py`
turns the lines into the table of docs/RELIABILITY.md. Without it `record`
does nothing, so `make test` writes no file.
"""

from __future__ import annotations

import json
import os
import time

RESULTS_ENV = "DSPARK_RELIABILITY_RESULTS"


def record(suite: str, case: str, **figures: object) -> None:
    """Append one result: `suite` (chaos | bad-input), `case`, and its figures."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    line = {"suite": suite, "case": case, "recorded_at": time.time(), **figures}
    with open(path, "a") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")
