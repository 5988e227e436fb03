"""`ray job submit --working-dir . -- python -m jobs.regenerate --config pipeline/demo/configs/toy.yaml`

Thin entrypoint: parse, set up logging, run the regeneration stage, print the
summary, exit non-zero on failure. The same code runs from `dspark-targets
regenerate` on a laptop (it then starts a local Ray).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.regenerate", description=__doc__)
    parser.add_argument("--config", required=True, help="pipeline YAML config")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set replicas.num_replicas=4 (YAML value)",
    )
    parser.add_argument("--summary-json", default=None, help="also write the run summary as JSON")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)

    from pipeline.config import parse_overrides
    from pipeline.errors import run_and_report
    from pipeline.logs import setup_logging
    from pipeline.regenerate.config import load_config
    from pipeline.regenerate.run import run_regenerate

    setup_logging(args.verbose)

    def job() -> list[str]:
        config = load_config(args.config, overrides=parse_overrides(args.set))
        return run_regenerate(config, summary_json=args.summary_json).lines()

    return run_and_report(job, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
