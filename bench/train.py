"""Training benchmark: shard-reader samples/s versus trainer samples/s (key P5).

    .venv/bin/python bench/train.py [--steps 30] [--conversations 200]

P5 = reader samples/s / trainer samples/s on the same machine (goal >= 10):
how far ahead the data path runs of the model, i.e. whether streaming shards
can ever starve training. Both single-threaded (torch and zstd), on the
trained toy target's reference shards (HF capture, aux ids [1, 2, 3], bf16
codec) and the toy DSpark draft of pipeline/demo/configs/train-toy.yaml:

* reader: `ShardReader(uri, prefetch=0)` over every sample (read + decode),
  median of 3 passes;
* data pipeline: the trainer's own path (epoch plan, decode of one rank's
  rows, anchor draw, packing), batches/s x batch size, no model;
* trainer: optimiser steps of the real training loop (forward, loss,
  backward, AdamW), samples/s over the steps after the first 5.

Results merge into bench/results.json (other keys kept) and a section of
bench/RESULTS.md between train markers is replaced.
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

from results_file import merge_results, write_section  # bench/ is sys.path[0]

from pipeline.demo import CONFIG_DIR

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--conversations", type=int, default=200)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from pipeline.demo.reference_shards import write_reference_shards
    from pipeline.table.reader import ShardReader
    from pipeline.train.config import load_train_config, resolve_spec
    from pipeline.train.data import TrainingData, iter_batches
    from pipeline.train.trainer import train

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        uri = Path(tmp) / "shards"
        write_reference_shards(uri, num_conversations=args.conversations, num_units=4)

        rates = []
        for _ in range(3):
            started = time.perf_counter()
            n = sum(1 for _ in ShardReader(str(uri), prefetch=0))
            rates.append(n / (time.perf_counter() - started))
        reader = statistics.median(rates)

        config = load_train_config(
            CONFIG_DIR / "train-toy.yaml",
            overrides={
                "data.uri": str(uri),
                "out_dir": f"{tmp}/run",
                "num_steps": args.steps,
                "data.heldout_fraction": 0.0,
                "checkpoint_every": 10**6,
            },
        )
        data = TrainingData(config.data)
        spec = resolve_spec(
            config.target if Path(config.target).exists() else _target_dir(config.target),
            config.draft,
            data.provenance.aux_layer_ids,
            mask_token_id=3,
        )
        it = iter_batches(data, spec, seed=0, global_batch_size=config.global_batch_size)
        next(it)
        started = time.perf_counter()
        num = 10
        for _ in range(num):
            next(it)
        pipeline_rate = num * config.global_batch_size / (time.perf_counter() - started)

        result = train(config, export=False)
        steady = result.metrics[5:]
        trainer = sum(m["samples"] for m in steady) / sum(m["seconds"] for m in steady)
        tokens = sum(m["tokens"] for m in steady) / sum(m["seconds"] for m in steady)

    load = os.getloadavg()[0]
    figures = {
        "P5": round(reader / trainer, 2),
        "P5_reader_samples_per_s": round(reader, 1),
        "P5_data_pipeline_samples_per_s": round(pipeline_rate, 1),
        "P5_trainer_samples_per_s": round(trainer, 2),
        "P5_trainer_tokens_per_s": round(tokens, 1),
        "P5_bench_load_average": round(load, 2),
    }
    merge_results(figures)
    section = "\n".join(
        [
            "## Training throughput (bench/train.py, key P5)",
            "",
            f"Trained toy target reference shards ({args.conversations} conversations, bf16), toy DSpark "
            f"draft of pipeline/demo/configs/train-toy.yaml ({spec.num_layers} layers, block {spec.block_size}, "
            f"batch {config.global_batch_size}), {args.steps} steps, one thread, "
            f"{platform.processor() or platform.machine()}, load average {load:.2f}.",
            "",
            "| what | samples/s |",
            "|---|---|",
            f"| shard reader (read + decode) | {reader:.1f} |",
            f"| trainer data path (plan, decode, anchors, packing) | {pipeline_rate:.1f} |",
            f"| trainer (forward, loss, backward, AdamW) | {trainer:.2f} ({tokens:.0f} tokens/s) |",
            f"| **P5 = reader / trainer** | **{reader / trainer:.1f}** (goal >= 10) |",
        ]
    )
    write_section("bench/train.py", section)
    print(json.dumps(figures, indent=2))


def _target_dir(name: str) -> str:
    from pipeline.targets.resolve import resolve_model

    return resolve_model(name)


if __name__ == "__main__":
    main()
