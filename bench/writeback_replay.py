"""The write-back's host CPU per sample, without an engine: a recorded-shape spool replayed.

    .venv/bin/python bench/writeback_replay.py [--samples 5477] [--rounds 3] [--profile]

The trained toy is host-bound (bench/regenerate.py): its write-back process
spends ~1 ms of CPU per sample on the one host core the engine core also
needs. This replays that work alone, deterministic and quick to profile:
an engine-like spool (one chunk file per step, ~250 requests in flight,
prompts of ~24 tokens and answers of ~50, 3 aux streams + the final one at
hidden 128, bf16: the trained toy's shape) is written first (not timed),
then one thread does what the write-back process does with it: take each
finished request's rows from the spool, build its sample, encode it, and
write each unit's shard (units of ~68 samples) when its last sample is in.
Reports CPU microseconds per sample (median of the rounds, with the range).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, NUM_AUX, IN_FLIGHT, UNIT_SAMPLES = 128, 3, 250, 68


def plan(num_samples: int, seed: int = 0):
    """Requests (id, prompt ids, output ids) and the engine steps that write their rows."""
    rng = random.Random(seed)
    requests = []
    for i in range(num_samples):
        prompt = [rng.randrange(2000) for _ in range(rng.randint(8, 40))]
        output = [rng.randrange(2000) for _ in range(max(1, int(rng.expovariate(1 / 50))))]
        requests.append((f"r{i:06d}", prompt, output))
    return requests


def steps(requests):
    """Engine steps as (chunk arguments, requests finishing at that step), ~IN_FLIGHT running."""
    pending = list(range(len(requests)))[::-1]
    running: dict[int, int] = {}  # request -> next position to write
    step = 0
    while pending or running:
        while pending and len(running) < IN_FLIGHT:
            running[pending.pop()] = 0
        keys, starts, lengths, done = [], [], [], []
        for r, at in list(running.items()):
            _, prompt, output = requests[r]
            fed = len(prompt) + len(output) - 1  # the last sampled token is never fed
            n = min(len(prompt) if at == 0 else 1, fed - at)
            keys.append(requests[r][0])
            starts.append(at)
            lengths.append(n)
            running[r] = at + n
            if at + n >= fed:
                done.append(r)
                del running[r]
        yield (step, keys, starts, lengths), done
        step += 1


def replay(spool: str, out: str, requests) -> tuple[float, int]:
    """The write-back's work as the engine steps; returns (its CPU seconds, samples written).

    Writing each step's spool file (the engine's work) is not counted.
    """
    import torch

    from pipeline.regenerate.unit import SpooledSample
    from pipeline.regenerate.writeback import ShardTarget, ShardWriteback
    from pipeline.shards.schema import Provenance
    from pipeline.targets.capture import CaptureChunk, SinkSpec, write_spool
    from pipeline.targets.capture_rows import CaptureContract, RowLayout, SpoolRows

    torch.set_num_threads(1)  # the write-back process runs on one host CPU
    prov = Provenance(
        target_name="toy:trained",
        target_revision="sha256:0",
        tokenizer_hash="sha256:0",
        aux_layer_ids=tuple(range(1, NUM_AUX + 1)),
        hidden_size=HIDDEN,
        codec="bf16",
        corpus_version="replay",
        code_version="replay",
        generation={"temperature": 0.0, "max_new_tokens": 256, "seed": 0},
    )
    layout = RowLayout(NUM_AUX, HIDDEN, "bfloat16", torch.ones(HIDDEN, dtype=torch.bfloat16), 1e-6)
    rows = SpoolRows(CaptureContract(SinkSpec("spool", spool), layout))
    writeback = ShardWriteback(rows=rows, threads=False)
    target = ShardTarget(out, None, prov)
    num_units = -(-len(requests) // UNIT_SAMPLES)
    written: list = []
    all_written = threading.Event()

    def done(w, err):
        written.append((w, err))
        if len(written) == num_units:
            all_written.set()

    # The engine's spool files, written first (not counted), then moved in step by step.
    staged = os.path.join(spool, "staged")
    os.mkdir(staged)
    g = torch.Generator().manual_seed(0)
    plan_ = list(steps(requests))
    for chunk_args, _ in plan_:
        rows_ = torch.randn(sum(chunk_args[3]), NUM_AUX + 1, HIDDEN, generator=g)
        write_spool(staged, "w0", CaptureChunk(*chunk_args, rows_.to(torch.bfloat16)))
    names = sorted(os.listdir(staged))
    units: dict[str, int] = {}
    started, main_started, wall = time.process_time(), time.thread_time(), time.perf_counter()
    for name, (_, finished) in zip(names, plan_, strict=True):
        os.rename(os.path.join(staged, name), os.path.join(spool, name))
        for r in finished:
            rid, prompt, output = requests[r]
            unit = f"u{r // UNIT_SAMPLES:05d}"
            sample = SpooledSample(rid, "replay", "chat", prompt, output, "stop")
            raw = sample.num_tokens * (NUM_AUX + 1) * HIDDEN * 2
            writeback.add(unit, sample, provenance=prov, where=rid, source="replay", nbytes=raw)
            units[unit] = units.get(unit, 0) + 1
            if units[unit] == min(UNIT_SAMPLES, len(requests) - r // UNIT_SAMPLES * UNIT_SAMPLES):
                writeback.finish(unit, target, [], done)
        writeback.flush()
    all_written.wait()
    writeback.close()
    seconds = time.process_time() - started
    print(
        f"  main thread {time.thread_time() - main_started:.2f} CPU s, "
        f"wall {time.perf_counter() - wall:.2f} s"
    )
    bad = [(w, e) for w, e in written if e is not None or w.row_errors]
    if bad:
        raise RuntimeError(f"{len(bad)} units failed or had row errors, first: {bad[0]}")
    return seconds, sum(w.shard.rows for w, _ in written)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=5477)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", help="write a cProfile of one more round to this path")
    args = p.parse_args()
    requests = plan(args.samples)
    per_sample = []
    for round_ in range(args.rounds + bool(args.profile)):
        with tempfile.TemporaryDirectory() as tmp:
            spool, out = Path(tmp, "spool"), Path(tmp, "out")
            spool.mkdir()
            if round_ == args.rounds:
                import cProfile

                with cProfile.Profile() as prof:
                    replay(str(spool), str(out), requests)
                prof.dump_stats(args.profile)
                print(f"profile: {args.profile}")
                continue
            seconds, n = replay(str(spool), str(out), requests)
        per_sample.append(seconds / n * 1e6)
        print(f"round {round_}: {n} samples, {seconds:.2f} CPU s, {per_sample[-1]:.0f} us/sample")
    if per_sample:
        per_sample.sort()
        print(
            f"write-back CPU per sample: {per_sample[len(per_sample) // 2]:.0f} us "
            f"[{per_sample[0]:.0f}-{per_sample[-1]:.0f}]"
        )


if __name__ == "__main__":
    main()
