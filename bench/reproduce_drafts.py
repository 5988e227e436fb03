"""Does today's code still train the drafts that the committed P6/P4/P7 figures came from?

    .venv/bin/python bench/reproduce_drafts.py [--work /tmp/bench-eval] [--steps 300] [--batch 16]
        [--conversations 800] [--heldout 0.15]

The work directory is one kept by `bench/evaluate.py --keep DIR` (bench/train_parity.py
uses the same names and this default). Without one there is nothing to compare:
it says so and exits 0, so `make bench` passes on a fresh machine. Every bf16/fp8 DSpark and DFlash draft found there is trained
again from the same shards, with the same budget, by the current trainer (one
thread, seed 0), into a scratch directory. Its exported tensors are compared with
the kept export, tensor by tensor. Bitwise equal means every figure computed from
the kept drafts (the evaluator is deterministic at T=0 and seeded at T=1) is what
the current code gives. Training on CPU is deterministic here. Any difference
means the figures must be rerun.

Writes `eval_drafts_reproduced` (per draft: bitwise, max |diff|, seconds, and the
commit that trained it again) into bench/results.json. It does not touch RESULTS.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
RUNS = {  # run directory kind, codec -> the anchor layout bench/evaluate.py trains it with
    ("dspark", "bf16"): True,
    ("dflash", "bf16"): None,
    ("dspark", "fp8"): True,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-eval"))
    parser.add_argument("--conversations", type=int, default=800)
    parser.add_argument("--heldout", type=float, default=0.15)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    import torch
    from evaluate import _train  # bench/evaluate.py's training, unchanged
    from results_file import merge_results
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    tag = f"{args.conversations}c-{args.steps}x{args.batch}-h{args.heldout}"
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="reproduce-drafts-") as scratch:
        for (kind, codec), anchor in RUNS.items():
            name = f"run-{kind}-{codec}-{tag}"
            kept = args.work / name / "export" / "model.safetensors"
            shards = args.work / f"shards-{codec}-{args.conversations}"
            if not kept.exists() or not (shards / "_latest").exists():
                print(f"{name}: not in {args.work}, skipped", flush=True)
                continue
            started = time.perf_counter()
            _train(shards, Path(scratch) / name, kind, args.steps, args.batch, anchor, args.heldout)
            seconds = time.perf_counter() - started
            old = load_file(kept)
            new = load_file(Path(scratch) / name / "export" / "model.safetensors")
            if sorted(old) != sorted(new):
                raise SystemExit(f"{name}: tensor names differ: {sorted(set(old) ^ set(new))}")
            diff = max(float((old[k].float() - new[k].float()).abs().max()) for k in old)
            out[name] = {
                "bitwise": all(torch.equal(old[k], new[k]) for k in old),
                "max_abs_diff": diff,
                "tensors": len(old),
                "seconds": round(seconds, 1),
                "commit": commit,
            }
            print(name, out[name], flush=True)
    if not out:
        print(f"no kept draft under {args.work} (bench/evaluate.py --keep DIR keeps them)")
        return
    merge_results({"eval_drafts_reproduced": out})


if __name__ == "__main__":
    main()
