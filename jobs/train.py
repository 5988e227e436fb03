"""`ray job submit --working-dir . -- python -m jobs.train --config pipeline/demo/configs/train-toy.yaml`

Thin entrypoint: parse, set up logging, train (Ray Train when the config asks
for more than one worker), export, print the summary, exit non-zero on
failure. `dspark-targets train --config ...` runs the same function.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__)
    parser.add_argument("--config", required=True, help="training YAML config")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set num_workers=4 (YAML value)",
    )
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)

    from pipeline.config import parse_overrides
    from pipeline.errors import run_and_report
    from pipeline.logs import setup_logging
    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import summary_lines, train

    setup_logging(args.verbose)

    def job() -> list[str]:
        config = load_train_config(args.config, overrides=parse_overrides(args.set))
        return summary_lines(train(config))

    return run_and_report(job, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
