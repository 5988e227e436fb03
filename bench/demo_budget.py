"""Where the demo's DSpark and DFlash drafts settle their order: macro tau against the budget.

    .venv/bin/python bench/demo_budget.py [--steps 100,200,300] [--seeds 0,1]
        [--conversations 600] [--keep DIR] [--dspark-set KEY=VALUE ...]

Demo-sized data (reference shards of `--conversations` synthetic
conversations, corpus seed 1 and 256 new tokens as pipeline/demo/configs/toy.yaml
regenerates them), and the demo's own two training configs
(pipeline/demo/train.py: DSpark in the fill-in layout with `0.1 CE + 0.9 L1 +
1.0 BCE`, DFlash with CE only; lr 3e-3, batch 16, held-out fraction 0.05), each
trained for every budget in `--steps` with every seed in `--seeds` (a budget is
its own run: the cosine schedule spans it). Each budget's drafts are evaluated
together on the held-out split (offline T=0 walk, what the demo prints); per
budget and seed: both macro taus and DSpark / DFlash with its paired bootstrap
interval. `--dspark-set` trains DSpark with those config keys changed (e.g.
`loss.ce_first_fraction=0.5`), in its own run directory. Keys `demo_budget*` merge into bench/results.json; the section
between the demo_budget markers of bench/RESULTS.md is replaced.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

from results_file import merge_results, write_section  # bench/ is sys.path[0]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def t1_teacher_forced(run_dir: Path) -> float | None:
    """The run's held-out teacher-forced expected acceptance at T=1 (summary.json)."""
    import json

    tau = json.loads((run_dir / "summary.json").read_text()).get("heldout", {}).get("tau_tv")
    return None if tau is None else round(tau, 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=_ints, default=[100, 200, 300])
    parser.add_argument("--seeds", type=_ints, default=[0, 1])
    parser.add_argument("--conversations", type=int, default=600)
    parser.add_argument("--keep", type=Path, default=None, help="work here and keep it")
    parser.add_argument("--dspark-set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from pipeline.config import parse_overrides
    from pipeline.demo.reference_shards import write_reference_shards
    from pipeline.demo.train import demo_train_config
    from pipeline.evaluate.config import parse_eval_config
    from pipeline.evaluate.run import run_evaluation
    from pipeline.evaluate.uncertainty import PerSample, ratio_interval
    from pipeline.train.trainer import train

    dspark_set = parse_overrides(args.dspark_set)
    tag = "-".join(args.dspark_set).replace("=", "").replace(".", "_")
    with tempfile.TemporaryDirectory(prefix="bench-demo-budget-") as tmp:
        work = args.keep or Path(tmp)
        shards = work / f"shards-{args.conversations}"
        if not (shards / "_latest").exists():
            write_reference_shards(
                shards,
                num_conversations=args.conversations,
                corpus_seed=1,
                max_new_tokens=256,
                num_units=4,
            )
        rows, train_s = [], {}
        for steps in args.steps:
            drafts = []
            for seed in args.seeds:
                out = work / f"steps{steps}-seed{seed}"
                for kind, name in (("dspark", "DSpark"), ("dflash", "DFlash")):
                    overrides = {"seed": seed}
                    if kind == "dspark" and args.dspark_set:
                        overrides |= {**dspark_set, "out_dir": str(out / f"train-{tag}")}
                    config = demo_train_config(
                        out, str(shards), kind=kind, num_steps=steps, overrides=overrides
                    )
                    if not (Path(config.out_dir) / "export" / "config.json").exists():
                        started = time.perf_counter()
                        train(config)
                        train_s[f"{name} {steps}x s{seed}"] = round(time.perf_counter() - started)
                    drafts.append({"name": f"{name} s{seed}", "path": config.out_dir})
            report = run_evaluation(
                parse_eval_config(
                    {
                        "target": "toy:trained",
                        "out_dir": str(work / f"eval-{steps}"),
                        "drafts": drafts,
                        "calibration": {"enabled": False},
                    },
                    "demo_budget",
                )
            ).report["drafts"]
            paths = {d["name"]: Path(d["path"]) for d in drafts}
            for seed in args.seeds:
                a, b = (report[f"{n} s{seed}"]["offline_t0"] for n in ("DSpark", "DFlash"))
                tf = [t1_teacher_forced(paths[f"{n} s{seed}"]) for n in ("DSpark", "DFlash")]
                ratio, lo, hi = ratio_interval(
                    PerSample.from_dict(a["per_sample"]), PerSample.from_dict(b["per_sample"])
                )
                rows.append(
                    {
                        "steps": steps,
                        "seed": seed,
                        "dspark": round(a["tau_macro"], 3),
                        "dflash": round(b["tau_macro"], 3),
                        "ratio": round(ratio, 3),
                        "ci95": None if math.isnan(lo) else [round(lo, 3), round(hi, 3)],
                        "samples": a["num_samples"],
                        "dspark_t1_tf": tf[0],
                        "dflash_t1_tf": tf[1],
                    }
                )

    key = "demo_budget" + (f"_{tag}" if args.dspark_set else "")
    merge_results({key: rows, f"{key}_train_s": train_s})  # its two keys, others kept
    lines = [
        f"## The demo's DSpark against DFlash by budget (bench/demo_budget.py, key {key})",
        "",
        f"Demo-sized reference shards ({args.conversations} conversations, corpus seed 1), the "
        "demo's two training configs (pipeline/demo/train.py), held-out fraction 0.05; offline "
        f"T=0 macro tau; DSpark with {', '.join(args.dspark_set) or 'the demo config'}; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}. "
        "Ratio: DSpark / DFlash, paired stratified bootstrap over the held-out samples. T=1 tf: "
        "the teacher-forced expected acceptance at T=1 on the trainer's 64 held-out samples.",
        "",
        "| steps | seed | DSpark | DFlash | DSpark / DFlash | 95% CI | held-out samples "
        "| T=1 tf DSpark | T=1 tf DFlash |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ci = "n/a" if r["ci95"] is None else "{:.3f}-{:.3f}".format(*r["ci95"])
        lines.append(
            f"| {r['steps']} | {r['seed']} | {r['dspark']:.2f} | {r['dflash']:.2f} | "
            f"{r['ratio']:.3f} | {ci} | {r['samples']} | {r['dspark_t1_tf']} | {r['dflash_t1_tf']} |"
        )
    lines += ["", f"Training seconds: {train_s or 'reused from --keep'}."]
    write_section("bench/demo_budget.py" + (f" {tag}" if args.dspark_set else ""), "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
