"""The reliability figures: run the chaos and bad-input suites, write their table.

    python bench/reliability.py            # runs the suites and the soak (~12 min here), then the table
    python bench/reliability.py --render   # the table again from bench/reliability.jsonl

The suites' tests call `tests/reliability.py:record` with what they did and
what they found; this script points `DSPARK_RELIABILITY_RESULTS` at a fresh
file, runs them, keeps the lines in `bench/reliability.jsonl` (committed) and
rewrites the tables between the markers of docs/RELIABILITY.md. A suite that
fails leaves the committed figures as they were.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINES = ROOT / "bench" / "reliability.jsonl"
DOC = ROOT / "docs" / "RELIABILITY.md"
SUITES = ["tests/chaos", "tests/corpus/test_bad_inputs.py"]
BEGIN, END = "<!-- reliability: begin -->", "<!-- reliability: end -->"


def run_suites() -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lines.jsonl"
        env = {**os.environ, "DSPARK_RELIABILITY_RESULTS": str(out)}
        # -m "": the soak (marker `soak`, deselected in `make test`) runs here too.
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "", *SUITES]
        code = subprocess.call(cmd, cwd=ROOT, env=env)
        if code != 0:
            raise SystemExit(f"the suites failed (pytest exit {code}); figures left as they were")
        return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value).replace("|", "\\|")


def render(lines: list[dict]) -> str:
    chaos = [r for r in lines if r["suite"] == "chaos"]
    soak = [r for r in lines if r["suite"] == "soak"]
    bad = [r for r in lines if r["suite"] == "bad-input"]
    out = ["### Chaos suite (`tests/chaos`)", ""]
    cols = [
        ("fault", "fault"),
        ("faults_survived", "faults"),
        ("rows_tried", "samples tried"),
        ("samples_committed", "committed"),
        ("samples_lost", "lost"),
        ("samples_duplicated", "duplicated"),
        ("verify", "verify"),
        ("result", "result"),
        ("seconds", "s"),
    ]
    out.append("| " + " | ".join(title for _, title in cols) + " |")
    out.append("|" + "---|" * len(cols))
    for r in sorted(chaos, key=lambda r: r["case"]):
        out.append("| " + " | ".join(_cell(r.get(key, "")) for key, _ in cols) + " |")
    out += _soak(soak)
    total = [r for r in bad if r["case"] == "all sources together"]
    kinds = sorted((r for r in bad if r not in total), key=lambda r: r["case"])
    out += ["", "### Bad-input suite (`tests/corpus/test_bad_inputs.py`)", ""]
    out.append("| reason | inputs tried | error records | files |")
    out.append("|---|---|---|---|")
    for r in kinds:
        out.append(
            f"| `{r['case']}` | {r['inputs_tried']} | {r['error_records']} | {_cell(r['files'])} |"
        )
    for r in total:
        out.append(
            f"\n{len(kinds)} kinds of damage, {r['inputs_tried']} bad inputs, "
            f"{r['error_records']} error records; {r['good_rows_kept']} good rows kept, "
            f"{r['good_rows_lost']} lost; the load {r['result']}."
        )
    return "\n".join(out)


SOAK_FIGURES = [
    ("seconds", "seconds"),
    ("versions_published", "versions published"),
    ("versions_checked", "versions checked (every invariant, each version)"),
    ("commits", "commits by the two writers"),
    ("commits_refused", "commits refused (lease lost, conflict, fenced off)"),
    ("s3_calls", "S3 calls"),
    ("faults_injected", "faults injected (S3 call failures and `_latest` puts failed)"),
    ("pointer_puts_failed", "`_latest` puts failed past every retry"),
    ("pauses_past_the_lease", "pauses past the lease"),
    ("takeovers", "takeovers"),
    ("fencing_versions", "fencing versions"),
    ("late_commits_replaced", "late commits replaced by a copy of their parent"),
    ("gc_runs", "gc runs (`--keep-versions 1`)"),
    ("gc_versions_retired", "versions retired by gc"),
    ("gc_files_deleted", "files deleted by gc"),
    ("gc_pins_honoured", "pins honoured by gc (sum over runs)"),
    ("versions_followed", "versions read by the follower"),
    ("exports", "exports"),
    ("samples_committed", "samples committed"),
    ("samples_verified", "samples read back exactly once at the end"),
    ("violations", "violations"),
]


def _soak(soak: list[dict]) -> list[str]:
    if not soak:
        return []
    out = ["", "### Lifecycle soak (`tests/chaos/test_soak.py`)", ""]
    out += ["| figure | value |", "|---|---|"]
    for r in soak:
        out += [f"| {title} | {_cell(r.get(key, ''))} |" for key, title in SOAK_FIGURES]
    return out


def write_doc(table: str) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} markers")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="only re-render the committed lines")
    args = parser.parse_args()
    if args.render:
        lines = [json.loads(x) for x in LINES.read_text().splitlines() if x.strip()]
    else:
        lines = run_suites()
        LINES.write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in lines))
    table = render(lines)
    write_doc(table)
    print(table)


if __name__ == "__main__":
    main()
