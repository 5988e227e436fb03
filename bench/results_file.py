"""Where every benchmark records its figures: keys merged into results.json, one section of RESULTS.md each.

Each bench owns its keys and the section between its own markers, so running
one bench never erases another's figures.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS_JSON = BENCH / "results.json"
RESULTS_MD = BENCH / "RESULTS.md"


def merge_results(new: dict) -> dict:
    """Update results.json with `new` (other benches' keys stay)."""
    current = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    current.update(new)
    RESULTS_JSON.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    return current


def write_section(tag: str, body: str) -> None:
    """Replace (or append) the RESULTS.md section between `<!-- <tag>: begin/end -->`."""
    begin, end = f"<!-- {tag}: begin -->", f"<!-- {tag}: end -->"
    section = f"{begin}\n{body.rstrip()}\n{end}\n"
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else "# Benchmark results\n"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + section.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS_MD.write_text(text)


def spread(values: Iterable[float]) -> dict:
    """The median of per-round figures with their range: {"median", "min", "max"}."""
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt_spread(d: dict, digits: int = 0) -> str:
    """A `spread` as "median [min-max]"."""
    return f"{d['median']:.{digits}f} [{d['min']:.{digits}f}-{d['max']:.{digits}f}]"
