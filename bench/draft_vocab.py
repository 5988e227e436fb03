"""Reduced draft vocabulary on the real target: training tokens/s with and without it.

    flock /tmp/dspark-heavy.lock .venv/bin/python bench/draft_vocab.py \\
        --data runs/real/dataset [--steps 15] [--warmup 3] [--sizes 8192,16384]

For each draft kind (1-layer DSpark and DFlash) and each draft vocabulary
(the full 49,152 tokens of SmolLM2-135M-Instruct, then `--sizes`), trains
`warmup + steps` optimiser steps at batch 8 x 32 anchors (the batch issue
#30 measured 3.7 s/step at) and reports the median seconds per step and
context tokens/s over the steps after the warm-up, from the run's
metrics.jsonl. Beside them: the share of answer tokens the reduced vocabulary
covers, on the training split it was counted from and on the held-out split
(never counted), and the share of trained slots whose CE was masked
(`ce_outside`). Held-out tau after so few steps is printed but means
nothing; a tau comparison needs a longer, matched budget.

Results merge into bench/results.json (keys `real_vocab_*`) and the
`draft_vocab` section of bench/RESULTS.md.

Tau at equal wall-clock training time (`--tau-steps N`):

    flock /tmp/dspark-heavy.lock .venv/bin/python bench/draft_vocab.py \\
        --data runs/real/dataset --tau-steps 300 [--tau-size 8192] [--probe-steps 3] \\
        [--tau-equal-steps] [--work DIR]

trains the DSpark draft of pipeline/demo/configs/train-real.yaml (the recipe
of `make demo-real`, loaded through pipeline/demo/real.py) twice: with the
reduced vocabulary of `--tau-size` tokens for N steps, then with the full
49,152-token head for as many steps as fit in the reduced run's training
seconds (the sum of its steps' seconds in metrics.jsonl). That step count is
fixed before the full run starts, because the cosine schedule depends on it:
the reduced run's seconds over the median seconds of `--probe-steps` full-
vocabulary steps (after one warm-up) timed just before, in the same process,
so both sides see the same load. Each run completes its own warm-up and
cosine schedule. Both drafts are then evaluated by the project's evaluator
(`run_evaluation`, T=0 exact offline walk, no live loop, no serving) on the
same held-out split; the figures are each macro tau and the paired stratified
bootstrap interval of reduced / full. `--tau-equal-steps` adds the reduced
vocabulary trained for the full head's step count (its own schedule), for tau
at equal steps. A rerun with the same `--work` reuses the finished runs, the
plan and the figures measured when they trained. The figures merge into
bench/results.json (keys `real_vocab_tau_*`) and the `draft_vocab tau`
section of RESULTS.md, beside the speed figures (which a speed run keeps, as
this keeps them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results_file import (  # bench/ is sys.path[0]
    RESULTS_JSON,
    cpu_capability,
    merge_results,
    public_command,
    write_section,
)

TARGET = "smollm2-135m-instruct"
TAU_KEYS = "real_vocab_tau_"  # the tau mode's figures; a speed run leaves them


def _config(data: str, out_dir: Path, kind: str, size: int | None, steps: int, threads: int):
    from pipeline.train.config import parse_train_config

    draft = dict(kind=kind, num_layers=1, draft_vocab_size=size)
    return parse_train_config(
        dict(
            target=TARGET,
            data=dict(uri=data, num_anchors=32, prefetch=2),
            out_dir=str(out_dir),
            num_steps=steps,
            global_batch_size=8,
            draft=draft,
            checkpoint_every=10_000,
            log_every=10_000,
            num_threads=threads,
        )
    )


def run_one(data: str, kind: str, size: int | None, args) -> dict:
    from pipeline.train.trainer import train

    with tempfile.TemporaryDirectory(prefix="bench-vocab-") as tmp:
        cfg = _config(data, Path(tmp), kind, size, args.warmup + args.steps, args.threads)
        started = time.perf_counter()
        result = train(cfg, export=False)
        wall = time.perf_counter() - started
        rows = result.metrics[args.warmup :]
        vocab_record = Path(tmp) / "draft_vocab.json"
        record = json.loads(vocab_record.read_text()) if vocab_record.exists() else {}
    seconds = statistics.median(r["seconds"] for r in rows)
    slots = sum(r["ce_outside"] for r in result.metrics)
    return {
        "kind": kind,
        "draft_vocab_size": size,
        "steps_timed": len(rows),
        "s_per_step": round(seconds, 3),
        "s_per_step_range": [
            round(min(r["seconds"] for r in rows), 3),
            round(max(r["seconds"] for r in rows), 3),
        ],
        "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rows), 1),
        "ce_outside_slots": slots,
        "train_coverage": record.get("coverage"),
        "heldout_tau_greedy": result.heldout.get("tau_greedy"),
        "wall_s": round(wall, 1),
    }


def heldout_coverage(data: str, size: int) -> dict:
    """Coverage of the vocabulary counted on the training split, on both splits."""
    from pipeline.drafts.vocab import coverage, select_draft_vocab
    from pipeline.targets.resolve import resolve_model
    from pipeline.train.config import TrainDataConfig
    from pipeline.train.data import TrainingData
    from pipeline.train.vocab import answer_token_counts, eos_token_ids

    target_dir = resolve_model(TARGET)
    vocab_size = json.loads((Path(target_dir) / "config.json").read_text())["vocab_size"]
    split = TrainingData(TrainDataConfig(uri=data))
    train_counts = answer_token_counts(split, vocab_size)
    held_counts = answer_token_counts(split, vocab_size, split.heldout_rows)
    vocab = select_draft_vocab(train_counts, size, always=eos_token_ids(target_dir))
    return {
        "train": round(coverage(train_counts, vocab), 4),
        "heldout": round(coverage(held_counts, vocab), 4),
        "train_answer_tokens": int(train_counts.sum()),
        "heldout_answer_tokens": int(held_counts.sum()),
        "distinct_answer_tokens": int((train_counts > 0).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="runs/real/dataset")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--sizes", default="8192")
    parser.add_argument("--kinds", default="dspark,dflash")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--tau-steps",
        type=int,
        default=None,
        help="tau mode: reduced-vocabulary steps; the full head gets the same wall time",
    )
    parser.add_argument("--tau-size", type=int, default=8192)
    parser.add_argument("--probe-steps", type=int, default=3, help="tau mode: timed full steps")
    parser.add_argument("--eval-samples", type=int, default=None, help="tau mode: cap (smoke)")
    parser.add_argument("--work", type=Path, default=None, help="tau mode: keep the runs here")
    parser.add_argument(
        "--tau-equal-steps",
        action="store_true",
        help="tau mode: also the reduced vocabulary for the full head's step count",
    )
    args = parser.parse_args()
    if args.tau_steps is not None:
        tau_main(args)
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]

    from pipeline.table.dataset import Dataset

    version = Dataset.open(args.data).latest_version()
    runs = []
    for kind in args.kinds.split(","):
        for size in [None, *sizes]:
            run = run_one(args.data, kind, size, args)
            print(json.dumps(run), flush=True)
            runs.append(run)
    covers = {size: heldout_coverage(args.data, size) for size in sizes}
    print(json.dumps(covers), flush=True)

    results: dict = {}
    for run in runs:
        tag = f"real_vocab_{run['kind']}_{run['draft_vocab_size'] or 'full'}"
        results[f"{tag}_s_per_step"] = run["s_per_step"]
        results[f"{tag}_tokens_per_s"] = run["tokens_per_s"]
    for kind in args.kinds.split(","):
        full = next(r for r in runs if r["kind"] == kind and r["draft_vocab_size"] is None)
        for size in sizes:
            reduced = next(r for r in runs if r["kind"] == kind and r["draft_vocab_size"] == size)
            results[f"real_vocab_{kind}_{size}_speedup"] = round(
                full["s_per_step"] / reduced["s_per_step"], 3
            )
    for size, cover in covers.items():
        results[f"real_vocab_{size}_coverage_train"] = cover["train"]
        results[f"real_vocab_{size}_coverage_heldout"] = cover["heldout"]
    results["real_vocab_setup"] = (
        f"{TARGET}, {args.data} v{version}, 1-layer drafts, batch 8 x 32 anchors, "
        f"{args.warmup} warm-up + {args.steps} timed steps, {args.threads} torch threads, "
        f"{platform.processor() or platform.machine()} ({cpu_capability()}), "
        f"{os.cpu_count()} CPUs shared, {time.strftime('%Y-%m-%d')}"
    )
    merge_results(results, replace=speed_keys())

    lines = [
        "## Reduced draft vocabulary on the real target (bench/draft_vocab.py)",
        "",
        results["real_vocab_setup"] + ".",
        "",
        "| draft | vocabulary | s/step (median [min-max]) | context tok/s | speedup | "
        "CE-masked slots | held-out tau_greedy (not meaningful at this budget) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        size = run["draft_vocab_size"]
        speed = results.get(f"real_vocab_{run['kind']}_{size}_speedup", 1.0)
        lo, hi = run["s_per_step_range"]
        tau = run["heldout_tau_greedy"]
        lines.append(
            f"| {run['kind']} | {size or 'full 49,152'} | {run['s_per_step']:.2f} "
            f"[{lo:.2f}-{hi:.2f}] | {run['tokens_per_s']:.0f} | {speed:.2f}x | "
            f"{run['ce_outside_slots']} | {'-' if tau is None else f'{tau:.2f}'} |"
        )
    lines.append("")
    for size, cover in covers.items():
        lines.append(
            f"Vocabulary of {size:,} (counted on the training split's "
            f"{cover['train_answer_tokens']:,} answer tokens, "
            f"{cover['distinct_answer_tokens']:,} distinct): covers {cover['train']:.2%} of them "
            f"and {cover['heldout']:.2%} of the held-out split's "
            f"{cover['heldout_answer_tokens']:,}."
        )
    write_section("draft_vocab", "\n".join(lines))


def speed_keys() -> tuple[str, ...]:
    """The `real_vocab_*` keys of results.json a speed run replaces: all but the tau mode's."""
    current = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    stale = [k for k in current if k.startswith("real_vocab_") and not k.startswith(TAU_KEYS)]
    return tuple(stale) or ("real_vocab_dspark_",)


def tau_config(work: Path, data: str, run: str, size: int | None, steps: int, threads: int):
    """train-real.yaml's DSpark draft with a draft vocabulary of `size` (None: full)."""
    from pipeline.demo.real import real_train_config

    return real_train_config(
        work / run,  # the run directory is <work>/<run>/train
        data,
        "DSpark",
        num_steps=steps,
        **{"draft.draft_vocab_size": size, "num_threads": threads},
    )


def tau_train(config) -> dict:
    """Train `config`; its step-time figures, kept beside the run, so a rerun in the
    same `--work` reuses a finished run with the figures measured when it trained."""
    from pipeline.train.trainer import train

    kept = Path(config.out_dir).parent / "figures.json"
    if kept.exists():
        return json.loads(kept.read_text())
    started = time.perf_counter()
    result = train(config, export=False)
    seconds = [m["seconds"] for m in result.metrics]
    figures = {
        "run_dir": config.out_dir,
        "draft_vocab_size": config.draft.draft_vocab_size,
        "steps": result.steps,
        "train_seconds": round(sum(seconds), 1),
        "s_per_step": round(statistics.median(seconds), 3),
        "s_per_step_range": [round(min(seconds), 3), round(max(seconds), 3)],
        "tokens_per_s": round(statistics.median(m["tokens_per_s"] for m in result.metrics), 1),
        "loss": [round(result.metrics[0]["loss"], 3), round(result.metrics[-1]["loss"], 3)],
        "wall_s": round(time.perf_counter() - started, 1),
        "load_average_after": round(os.getloadavg()[0], 2),
    }
    kept.write_text(json.dumps(figures) + "\n")
    return figures


def full_steps_for(work: Path, args, budget_s: float) -> dict:
    """How many full-vocabulary steps fit `budget_s`, from `--probe-steps` timed steps
    (after one warm-up) of the full head; recorded in `work`, so a rerun reuses it."""
    from pipeline.train.trainer import train

    plan_path = work / "tau_plan.json"
    if plan_path.exists():
        return json.loads(plan_path.read_text())
    probe_dir = work / "probe"
    config = tau_config(work, args.data, "probe", None, 1000, args.threads)
    result = train(config, stop_after=1 + args.probe_steps, export=False)
    timed = [m["seconds"] for m in result.metrics[1:]]
    shutil.rmtree(probe_dir, ignore_errors=True)
    probe = statistics.median(timed)
    plan = {
        "budget_s": round(budget_s, 1),
        "probe_s_per_step": round(probe, 3),
        "probe_seconds": [round(t, 3) for t in timed],
        "full_steps": max(1, round(budget_s / probe)),
    }
    plan_path.write_text(json.dumps(plan, indent=2) + "\n")
    return plan


def tau_main(args) -> None:
    """Held-out tau of the reduced and the full head at equal wall-clock training time."""
    from pipeline.evaluate.config import parse_eval_config
    from pipeline.evaluate.run import run_evaluation
    from pipeline.evaluate.uncertainty import PerSample, ratio_interval
    from pipeline.logs import setup_logging
    from pipeline.table.dataset import Dataset

    setup_logging()
    manifest = Dataset.open(args.data).manifest()
    dataset = (
        f"a dataset of real-smollm2.yaml ({manifest.num_rows} samples, version {manifest.version})"
    )
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-vocab-tau-"))
    work.mkdir(parents=True, exist_ok=True)
    first_start = work / "load_average_at_start.json"  # of the invocation that began `work`
    if not first_start.exists():
        first_start.write_text(json.dumps(round(os.getloadavg()[0], 2)) + "\n")
    load_start = json.loads(first_start.read_text())
    size = args.tau_size
    try:
        reduced = tau_train(
            tau_config(work, args.data, f"dspark-{size}", size, args.tau_steps, args.threads)
        )
        print(json.dumps(reduced), flush=True)
        plan = full_steps_for(work, args, reduced["train_seconds"])
        print(json.dumps(plan), flush=True)
        full = tau_train(
            tau_config(work, args.data, "dspark-full", None, plan["full_steps"], args.threads)
        )
        print(json.dumps(full), flush=True)
        names = {f"DSpark {size}": reduced, "DSpark full": full}
        if args.tau_equal_steps:
            steps = plan["full_steps"]
            names[f"DSpark {size}, {steps} steps"] = tau_train(
                tau_config(work, args.data, f"dspark-{size}-{steps}", size, steps, args.threads)
            )
        data = dict(uri=args.data)
        if args.eval_samples:
            data["max_samples"] = args.eval_samples
        config = dict(
            target=TARGET,
            out_dir=str(work / "eval"),
            data=data,
            drafts=[dict(name=n, path=r["run_dir"]) for n, r in names.items()],
            calibration=dict(enabled=False),
        )
        report = run_evaluation(parse_eval_config(config, "bench/draft_vocab.py")).report
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    rows = {n: report["drafts"][n]["offline_t0"] for n in names}

    def ratio(num: str, den: str) -> tuple[float, list[float] | None]:
        """Paired ratio of macro taus with its bootstrap interval."""
        point, lo, hi = ratio_interval(
            PerSample.from_dict(rows[num]["per_sample"]),
            PerSample.from_dict(rows[den]["per_sample"]),
        )
        return point, None if math.isnan(lo) else [round(lo, 3), round(hi, 3)]

    first, *others = names
    point, ci = ratio(first, "DSpark full")
    samples = report["data"]["num_samples"]
    setup = (
        f"{TARGET}, {dataset}, the DSpark draft of "
        f"pipeline/demo/configs/train-real.yaml (1 layer, block 5 fill-in, aux "
        f"[2, 9, 15, 21, 28], lr 2e-3, batch 8 x 32 anchors), {args.threads} torch threads; "
        f"budget: {args.tau_steps} steps with {size:,} tokens = {reduced['train_seconds']:.0f} s "
        f"of steps, the full head {plan['full_steps']} steps (that budget over "
        f"{plan['probe_s_per_step']:.2f} s/step, the median of {args.probe_steps} probe steps); "
        f"{samples} held-out samples, T=0 exact offline walk; "
        f"{platform.processor() or platform.machine()} ({cpu_capability()}), "
        f"{os.cpu_count()} CPUs shared, load average {load_start} at start, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    figures: dict = {f"{TAU_KEYS}setup": setup, f"{TAU_KEYS}heldout_samples": samples}
    for name, run in names.items():
        tag = f"{TAU_KEYS}dspark_{run['draft_vocab_size'] or 'full'}"
        if name not in (first, "DSpark full"):
            tag += "_equal_steps"
        figures[tag] = {
            **{k: v for k, v in run.items() if k not in ("run_dir", "draft_vocab_size")},
            "tau_macro": rows[name]["tau_macro"],
            "tau_macro_ci95": rows[name]["tau_macro_ci95"],
            "tau": rows[name]["tau"],
            "tau_by_domain": rows[name]["tau_by_domain"],
        }
    figures[f"{TAU_KEYS}ratio"] = round(point, 3)
    figures[f"{TAU_KEYS}ratio_ci95"] = ci
    equal = [n for n in others if n != "DSpark full"]
    if equal:
        equal_point, equal_ci = ratio(equal[0], "DSpark full")
        figures[f"{TAU_KEYS}equal_steps_ratio"] = round(equal_point, 3)
        figures[f"{TAU_KEYS}equal_steps_ratio_ci95"] = equal_ci
    figures[f"{TAU_KEYS}plan"] = plan
    figures[f"{TAU_KEYS}load_average"] = [load_start, full["load_average_after"]]
    merge_results(figures, replace=(TAU_KEYS,))
    print(json.dumps(figures, indent=2), flush=True)

    def cell(ci95) -> str:
        if not ci95 or None in ci95:
            return "-"
        return f"{ci95[0]:.3f}-{ci95[1]:.3f}"

    table = [
        f"| {n} | {r['steps']} | {r['train_seconds']:.0f} | {r['s_per_step']:.2f} "
        f"[{r['s_per_step_range'][0]:.2f}-{r['s_per_step_range'][1]:.2f}] | "
        f"{r['loss'][0]} -> {r['loss'][1]} | {rows[n]['tau_macro']:.3f} "
        f"({cell(rows[n]['tau_macro_ci95'])}) |"
        for n, r in names.items()
    ]
    command = public_command(
        "bench/draft_vocab.py", sys.argv[1:], {"--data": "DATASET", "--work": "WORK"}
    )
    write_section(
        "draft_vocab tau",
        "\n".join(
            [
                "### Tau with and without the reduced vocabulary at equal wall-clock time "
                "(bench/draft_vocab.py --tau-steps, keys real_vocab_tau_*)",
                "",
                f"`{command}`. " + setup + ". Step seconds as the "
                "trainer's metrics.jsonl records them; the two runs ran one after the other, "
                f"load average {load_start} before and {full['load_average_after']} after.",
                "",
                "| draft | steps | step seconds (sum) | s/step (median [min-max]) | "
                "loss first -> last | macro tau T=0 (95% CI) |",
                "|---|---|---|---|---|---|",
                *table,
                "",
                f"* **reduced / full macro tau = {point:.3f}** "
                f"({'95% CI ' + cell(ci) if ci else 'no interval'}; paired stratified "
                f"bootstrap over the {samples} held-out samples)",
                *(
                    [
                        f"* reduced / full macro tau at equal steps ({plan['full_steps']} "
                        f"each) = {equal_point:.3f} "
                        f"({'95% CI ' + cell(equal_ci) if equal_ci else 'no interval'})"
                    ]
                    if equal
                    else []
                ),
            ]
        ),
    )


if __name__ == "__main__":
    main()
