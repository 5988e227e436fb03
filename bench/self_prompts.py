"""Do prompts the target writes itself help a draft on prompts from a source it never saw?

    .venv/bin/python bench/self_prompts.py --data DIR [--draft EAGLE-3] [--steps 300]
        [--work DIR]

On a real-target dataset regenerated with pipeline/demo/configs/real-smollm2.yaml
(which mixes in `self-prompts`, the target's own user turns: docs/corpus.md),
one draft kind of `make demo-real` trains twice with the same budget and seed:
on the mixture as configured, and with the self-prompts left out too
(`data.exclude_sources` plus `self-prompts`). Both are evaluated at T=0 on
every sample of the source left out of training (REAL_LEFT_OUT) and on the
held-out split of the rest without self-prompts (the samples both runs could
have seen the like of). Ratios with / without on the same samples, paired
bootstrap. Keys `real_self_prompts_*` in bench/results.json; a section of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

from results_file import merge_results, public_command, write_section  # bench/ is sys.path[0]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SELF = "self-prompts"


def evaluate(work: Path, runs: dict[str, str], data: dict, name: str) -> dict:
    from pipeline.evaluate.config import parse_eval_config
    from pipeline.evaluate.run import run_evaluation

    config = dict(
        target="smollm2-135m-instruct",
        out_dir=str(work / f"eval-{name}"),
        data=data,
        drafts=[dict(name=n, path=p) for n, p in runs.items()],
        calibration=dict(store=False),
    )
    return run_evaluation(parse_eval_config(config, "bench/self_prompts.py")).report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a real-target dataset with self-prompts")
    parser.add_argument("--draft", default="EAGLE-3", help="a draft of make demo-real")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--work", type=Path, default=None, help="work here and keep it")
    args = parser.parse_args()

    from pipeline.demo.real import REAL_LEFT_OUT, real_train_config
    from pipeline.evaluate.uncertainty import PerSample, ratio_interval
    from pipeline.logs import setup_logging
    from pipeline.train.trainer import train

    setup_logging()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-self-prompts-"))
    left_out = list(REAL_LEFT_OUT)
    runs = {}
    for arm, excluded in (("with", left_out), ("without", [*left_out, SELF])):
        config = real_train_config(
            work / arm, args.data, args.draft, num_steps=args.steps,
            **{"data.exclude_sources": excluded},
        )  # fmt: skip
        runs[arm] = str(train(config).out_dir)
    sets = {
        "left_out": evaluate(work, runs, dict(uri=args.data, sources=left_out, split="all"), "lo"),
        "heldout": evaluate(
            work, runs, dict(uri=args.data, exclude_sources=[*left_out, SELF]), "heldout"
        ),
    }
    figures: dict = {"real_self_prompts_draft": args.draft, "real_self_prompts_steps": args.steps}
    lines = []
    for where, report in sets.items():
        rows = {arm: report["drafts"][arm]["offline_t0"] for arm in runs}
        point, lo, hi = ratio_interval(
            PerSample.from_dict(rows["with"]["per_sample"]),
            PerSample.from_dict(rows["without"]["per_sample"]),
        )
        ci = None if math.isnan(lo) else [round(lo, 4), round(hi, 4)]
        figures[f"real_self_prompts_{where}"] = {
            "tau_with": round(rows["with"]["tau_macro"], 4),
            "tau_without": round(rows["without"]["tau_macro"], 4),
            "ratio": round(point, 4),
            "ci95": ci,
            "num_samples": report["data"]["num_samples"],
        }
        ci_text = "no interval" if ci is None else f"95% CI {ci[0]:.3f}-{ci[1]:.3f}"
        lines.append(
            f"| {where.replace('_', '-')} ({report['data']['num_samples']} samples) | "
            f"{rows['with']['tau_macro']:.3f} | {rows['without']['tau_macro']:.3f} | "
            f"{point:.3f} ({ci_text}) |"
        )
    merge_results(figures, replace=("real_self_prompts_",))
    command = public_command(
        "bench/self_prompts.py", sys.argv[1:], {"--data": "DATASET", "--work": "WORK"}
    )
    write_section(
        "bench/self_prompts.py",
        "\n".join(
            [
                "## Prompts the target writes itself (bench/self_prompts.py, real_self_prompts_*)",
                "",
                f"`{command}`: {args.draft} trained {args.steps} steps of 8 with and without "
                f"the target's own prompts ({', '.join(left_out)} left out of both); T=0 macro "
                "tau; ratio with / without on the same samples, paired bootstrap.",
                "",
                "| evaluated on | with self-prompts | without | ratio |",
                "|---|---|---|---|",
                *lines,
            ]
        ),
    )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
