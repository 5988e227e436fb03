"""`ray job submit --working-dir . -- python -m jobs.evaluate --config pipeline/demo/configs/eval-toy.yaml`

Thin entrypoint: parse, set up logging, run the evaluation stage (offline
T=0 tau per domain, calibration, live loop, optional vLLM cross-check),
print the table and report paths, exit non-zero on failure or when the
vLLM cross-check falls outside its tolerance. `dspark-targets evaluate
--config ...` runs the same function.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.evaluate", description=__doc__)
    parser.add_argument("--config", required=True, help="evaluation YAML config")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set live.num_prompts=4 (YAML value)",
    )
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)

    from pipeline.config import parse_overrides
    from pipeline.errors import run_and_report
    from pipeline.evaluate.config import load_eval_config
    from pipeline.evaluate.run import run_evaluation
    from pipeline.logs import setup_logging

    setup_logging(args.verbose)
    outcome: dict = {}

    def job() -> list[str]:
        result = run_evaluation(load_eval_config(args.config, overrides=parse_overrides(args.set)))
        outcome["ok"] = result.ok
        return result.lines()

    code = run_and_report(job, verbose=args.verbose)
    if code == 0 and not outcome["ok"]:
        print(
            "error: vLLM's tau is outside the stated tolerance of the offline tau", file=sys.stderr
        )
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
