"""Host CPU of capture's plumbing, without an engine: the spool and the write-back, replayed.

    .venv/bin/python bench/writeback_replay.py [--against REF] [--samples 5477] [--rounds 3]
        [--profile PATH] [--no-write]

On a CPU with native bf16 the trained toy's regeneration is host-bound
(bench/regenerate.py, docs/capture.md): its write-back process spends ~1 ms
of CPU per sample on the one host core the engine core also needs, and the
model worker writes a spool file every engine step. This replays both
alone, deterministic and quick to profile, on the trained toy's shape
(~250 requests in flight, prompts of 8-40 tokens, answers of ~50 with an
exponential tail, 3 aux streams + the final one at hidden 128, bf16, units of
68 samples): each engine step's spool file is written as the model worker
writes it (timed apart: the engine's share), then one thread does what the
write-back process does: take each finished request's rows from the spool,
build its sample, encode it, and write each unit's shard when its last
sample is in. Reported: write-back CPU microseconds per sample and the
worker's spool write per step, medians of the rounds with their range.

`--against REF` runs the same replay on the code of git ref REF (a
worktree) in alternating rounds, each round in fresh processes, and reports
REF / this checkout per round: the side-by-side figure for a change to this
plumbing. Results merge into bench/results.json (`writeback_replay_*`) and
this bench's section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "--child" not in sys.argv:
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

    from pipeline.regenerate.replica.writeback import ShardTarget
    from pipeline.shards.schema import Provenance
    from pipeline.targets.capture import CaptureChunk, SinkSpec
    from pipeline.targets.capture_chunks import write_spool
    from pipeline.targets.capture_rows import CaptureContract, RowLayout

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
    writeback, add = _writeback(CaptureContract(SinkSpec("spool", spool), layout))
    target = ShardTarget(out, None, prov)
    num_units = -(-len(requests) // UNIT_SAMPLES)
    written: list = []
    all_written = threading.Event()

    def done(w, err):
        written.append((w, err))
        if len(written) == num_units:
            all_written.set()

    # The rows of every step, made before the clock starts.
    g = torch.Generator().manual_seed(0)
    plan_ = [
        (chunk_args, finished, torch.randn(sum(chunk_args[3]), NUM_AUX + 1, HIDDEN, generator=g))
        for chunk_args, finished in steps(requests)
    ]
    plan_ = [(a, f, rows_.to(torch.bfloat16)) for a, f, rows_ in plan_]
    units: dict[str, int] = {}
    engine = 0.0  # the worker's share: writing the step's spool file
    started = time.process_time()
    for chunk_args, finished, rows_ in plan_:
        t0 = time.thread_time()
        write_spool(spool, "w0", CaptureChunk(*chunk_args, rows_))
        engine += time.thread_time() - t0
        for r in finished:
            rid, prompt, output = requests[r]
            unit = f"u{r // UNIT_SAMPLES:05d}"
            add(unit, rid, prompt, output, prov)
            units[unit] = units.get(unit, 0) + 1
            if units[unit] == min(UNIT_SAMPLES, len(requests) - r // UNIT_SAMPLES * UNIT_SAMPLES):
                writeback.finish(unit, target, [], done)
        writeback.flush()
    all_written.wait()
    writeback.close()
    writeback_seconds = time.process_time() - started - engine
    bad = [(w, e) for w, e in written if e is not None or w.row_errors]
    if bad:
        raise RuntimeError(f"{len(bad)} units failed or had row errors, first: {bad[0]}")
    samples = sum(w.shard.rows for w, _ in written)
    if samples != len(requests):
        raise RuntimeError(f"{samples} rows written of {len(requests)} samples")
    return {
        "writeback_us_per_sample": writeback_seconds / samples * 1e6,
        "spool_write_us_per_step": engine / len(plan_) * 1e6,
        "steps": len(plan_),
    }


def _writeback(contract):
    """The write-back as the process runs it (one thread), and how a finished request
    reaches it: a `PendingSample` over `SpooledRows`; before that interface (an older
    `--against` ref) a `SpooledSample` and the spool reader passed in."""
    try:
        from pipeline.regenerate.replica.pending import PendingSample
    except ImportError:
        return _writeback_before_pending(contract)
    from pipeline.regenerate.replica.writeback import ShardWriteback, WritebackConfig
    from pipeline.targets.base import Generation
    from pipeline.targets.capture_rows import SpooledRows, open_spool

    open_spool(contract)
    writeback = ShardWriteback(WritebackConfig(mode="threads"), threads=False)
    spool = contract.sink.capture_dir

    def add(unit, rid, prompt, output, prov):
        num_tokens = len(prompt) + len(output)
        rows = SpooledRows(rid, num_tokens, spool, num_tokens * (NUM_AUX + 1) * HIDDEN * 2)
        sample = PendingSample("replay", "chat", Generation(rid, prompt, output, "stop", rows))
        writeback.add(unit, sample, provenance=prov, where=rid)

    return writeback, add


def _writeback_before_pending(contract):
    from pipeline.regenerate.unit import SpooledSample

    from pipeline.regenerate.replica.writeback import ShardWriteback
    from pipeline.targets.capture_rows import SpoolRows

    writeback = ShardWriteback(rows=SpoolRows(contract), threads=False)

    def add(unit, rid, prompt, output, prov):
        sample = SpooledSample(rid, "replay", "chat", prompt, output, "stop")
        raw = sample.num_tokens * (NUM_AUX + 1) * HIDDEN * 2
        writeback.add(unit, sample, provenance=prov, where=rid, source="replay", nbytes=raw)

    return writeback, add


def child(args) -> None:
    """One round on the code under `--code` (this checkout or a worktree): JSON on stdout."""
    requests = plan(args.samples)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        spool, out = Path(tmp, "spool"), Path(tmp, "out")
        spool.mkdir()
        if args.profile:
            import cProfile

            with cProfile.Profile() as prof:
                got = replay(str(spool), str(out), requests)
            prof.dump_stats(args.profile)
        else:
            got = replay(str(spool), str(out), requests)
    import pipeline

    if not Path(pipeline.__file__).resolve().is_relative_to(Path(args.code).resolve()):
        raise RuntimeError(f"imported {pipeline.__file__}, not the code under {args.code}")
    print(json.dumps(got))


def one_round(code: Path, args, profile: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", "--code", str(code)]
    cmd += ["--samples", str(args.samples)] + (["--profile", profile] if profile else [])
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--against", help="a git ref whose code runs beside this checkout's")
    p.add_argument("--samples", type=int, default=5477)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", help="write a cProfile of one more round (this checkout) here")
    p.add_argument("--no-write", action="store_true", help="print only; leave results files alone")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--code", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    from results_file import cpu_capability, fmt_spread, merge_results, spread, write_section

    load = os.getloadavg()[0]
    worktree = None
    codes = {"this": ROOT}
    try:
        if args.against:
            worktree = Path(tempfile.mkdtemp(prefix="replay-ref-"))
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(ROOT),
                    "worktree",
                    "add",
                    "--detach",
                    str(worktree),
                    args.against,
                ],
                check=True,
                capture_output=True,
            )
            codes["ref"] = worktree
        per_round = []
        for round_ in range(args.rounds):
            order = list(codes) if round_ % 2 == 0 else list(codes)[::-1]
            r = {}
            for name in order:
                r.update({f"{name}_{k}": v for k, v in one_round(codes[name], args).items()})
            if args.against:
                for k in ("writeback_us_per_sample", "spool_write_us_per_step"):
                    r[f"ref_over_this_{k}"] = r[f"ref_{k}"] / r[f"this_{k}"]
            per_round.append({k: round(v, 3) for k, v in r.items()})
            print(f"round {round_} ({'+'.join(order)}): {json.dumps(per_round[-1])}", flush=True)
        if args.profile:
            one_round(ROOT, args, args.profile)
            print(f"profile: {args.profile}")
    finally:
        if worktree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)])
    keys = [k for k in per_round[0] if not k.endswith("_steps")]
    med = {k: spread(r[k] for r in per_round) for k in keys}
    for k, v in med.items():
        print(f"{k}: {fmt_spread(v, 3)}")
    if args.no_write:
        return
    flat = {f"writeback_replay_{k}": round(v["median"], 3) for k, v in med.items()}
    flat.update(
        {
            f"writeback_replay_{k}_range": [round(v["min"], 3), round(v["max"], 3)]
            for k, v in med.items()
        }
    )
    flat["writeback_replay_against"] = args.against
    flat["writeback_replay_cpu_capability"] = cpu_capability()
    merge_results(flat, replace=("writeback_replay_",))  # no ref figures left from a run before
    lines = [
        "# Capture plumbing replayed (bench/writeback_replay.py)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores ({cpu_capability()}), load "
        f"average {load:.1f} at start. {args.samples} samples of the trained toy's shape, "
        f"{per_round[0]['this_steps']} engine steps, {args.rounds} alternating rounds, medians "
        "[min-max]; each round in fresh processes. this = this checkout"
        + (f"; ref = `{args.against}`." if args.against else "."),
        "",
        "| code | write-back CPU us / sample | spool write us / step (model worker) |",
        "|---|---|---|",
    ]
    for name in codes:
        lines.append(
            f"| {name} | {fmt_spread(med[f'{name}_writeback_us_per_sample'])} | "
            f"{fmt_spread(med[f'{name}_spool_write_us_per_step'])} |"
        )
    if args.against:
        lines += [
            "",
            "ref / this: write-back "
            f"{fmt_spread(med['ref_over_this_writeback_us_per_sample'], 3)}, spool write "
            f"{fmt_spread(med['ref_over_this_spool_write_us_per_step'], 3)}.",
        ]
    lines += ["", "Per round:", ""] + [
        f"* round {i}: {json.dumps(r)}" for i, r in enumerate(per_round)
    ]
    write_section("bench/writeback_replay.py", "\n".join(lines))
    print("wrote bench/results.json and bench/RESULTS.md", flush=True)


if __name__ == "__main__":
    if "--child" in sys.argv:  # the code under test first on the path
        code = sys.argv[sys.argv.index("--code") + 1]
        sys.path.insert(0, code)
    main()
