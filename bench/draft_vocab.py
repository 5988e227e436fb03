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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from results_file import cpu_capability, merge_results, write_section  # bench/ is sys.path[0]

TARGET = "smollm2-135m-instruct"


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
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    from pipeline.shards.manifest import Dataset

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
    merge_results(results, replace=("real_vocab_",))

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


if __name__ == "__main__":
    main()
