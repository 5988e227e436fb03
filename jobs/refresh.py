"""`ray job submit --working-dir . -- python -m jobs.refresh --config jobs/configs/qwen3-8b.yaml`

Thin entrypoint for scheduled refreshes (a KubeRay RayCronJob, or a Kubernetes
CronJob that creates a RayJob): parse, set up logging, refresh the dataset
(regenerate new and changed samples, tombstone removed ones, publish the next
version), print the summary, exit non-zero on failure. A run that finds the
dataset's lease held by another driver exits 1 at once, naming the holder,
unless `--wait-for-lease` gives it time.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.refresh", description=__doc__)
    parser.add_argument("--config", required=True, help="pipeline YAML config")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set corpus.sources.0.path=s3://... (YAML value)",
    )
    parser.add_argument(
        "--wait-for-lease",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another driver's lease (default: exit at once)",
    )
    parser.add_argument("--summary-json", default=None, help="also write the run summary as JSON")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)

    from pipeline.config import parse_overrides
    from pipeline.errors import run_and_report
    from pipeline.logs import setup_logging
    from pipeline.regenerate.config import load_config
    from pipeline.regenerate.refresh import run_refresh

    setup_logging(args.verbose)

    def job() -> list[str]:
        config = load_config(args.config, overrides=parse_overrides(args.set))
        summary = run_refresh(config, wait_for_lease_s=args.wait_for_lease, show_progress=False)
        if args.summary_json:
            summary.write_json(args.summary_json)
        return summary.lines()

    return run_and_report(job, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
