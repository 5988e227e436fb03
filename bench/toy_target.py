"""Build time of the trained toy target from an empty cache (issue goal: <= 5 min on 2 cores).

    .venv/bin/python bench/toy_target.py [--name trained]

Runs `dspark-targets toy-target <name>` in a child process with a fresh
`DSPARK_TARGETS_CACHE` (corpus, tokenizer, training, save: everything a
first `make demo` does in step 1) and records its wall and CPU seconds
(children included) with the machine's load average before the run.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_file import merge_results, write_section  # bench/ is sys.path[0]

GOAL_S = 300.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="trained")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-toy-") as cache:
        env = {**os.environ, "DSPARK_TARGETS_CACHE": cache}
        cli = Path(sys.executable).with_name("dspark-targets")
        started = time.perf_counter()
        subprocess.run([str(cli), "toy-target", args.name], env=env, check=True)
        wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    key = f"toy_{args.name}_build"
    figures = {
        f"{key}_wall_s": round(wall, 1),
        f"{key}_cpu_s": round(cpu, 1),
        f"{key}_load_average": round(load, 2),
        f"{key}_cores": os.cpu_count(),
    }
    merge_results(figures)
    verdict = "met" if wall <= GOAL_S else "NOT met"
    write_section(
        f"bench/toy_target.py {args.name}",
        "\n".join(
            [
                f"## Toy target build (bench/toy_target.py, `{args.name}`)",
                "",
                f"From an empty cache: corpus, tokenizer, training and save in one child process. "
                f"{os.cpu_count()} cores ({platform.machine()}), load average {load:.2f} before "
                f"the run.",
                "",
                f"* wall **{wall:.0f} s** (goal <= {GOAL_S:.0f} s: {verdict}), CPU {cpu:.0f} s",
            ]
        ),
    )
    print(figures)


if __name__ == "__main__":
    main()
