"""One regeneration setting at a time: (c) as shipped against (c) with that setting changed.

    .venv/bin/python bench/regenerate_ab.py [--ab growth,writeback,inprocess]
        [--targets large,trained] [--rounds 4] [--conversations large=1000,trained=4000] [--no-write]

Both runs of a pair are `run_regenerate` with the default config through a
local Ray, committing shards, on the workload of bench/regenerate.py (its
held-out synthetic conversations, natural lengths, ~30% multi-turn,
`turns: all`, EOS honoured); only the A/B's setting differs (`AB` below):

* growth: the changed run fixes `max_units_in_flight_per_replica` at the count
  a replica starts with, so its scheduler never gives a hungry replica
  another unit (scheduler.py);
* writeback: the changed run encodes and writes in threads of the replica's
  own process (`regenerate.writeback.mode: threads`) instead of the
  lower-priority write-back process (regenerate/replica/writeback_process.py);
* inprocess: the changed run's replica holds vLLM's engine core and model
  worker in its own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` through the
  job's runtime_env; the spool transport works there too) instead of
  vLLM's separate, spin-waiting processes. An A/B that changes the job's
  runtime_env restarts the local Ray before each run of both kinds alike.

The A/Bs of settings that lost (the write-back process on every CPU, the
engine core on the host CPUs) or that measured nothing either way (the
replica at Ray's nice 15) went with their settings; their sections of
bench/RESULTS.md stay as the record of why (docs/capture.md).

Rounds alternate which run goes first (the default round count is even, so
each run goes first equally often: this VM's order effect was larger than
some settings' effect); rates are steady-state generated tok/s
(engine start excluded); the ratio shipped / changed is per round, reported
as the median with its range. Also recorded: each run's mean engine batch,
engine steps, and the feeder's admission and result-handling seconds, which
say where the engine thread's time went. Results merge into
bench/results.json (`<ab>_<target>_*`); each A/B's section of RESULTS.md is
replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from regenerate import bench_config, run_c  # bench/ is sys.path[0]
from results_file import fmt_spread, merge_results, spread, write_section

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KEEP = ("tok_s", "mean_batch", "engine_steps", "admit_s", "handle_s", "peak_units")
START_COUNT = "@units_wanted"  # an override value: the shipped run's starting unit count

# name: (title, (label of the shipped run, label of the changed run), the changed settings)
AB = {
    "growth": (
        "Unit growth",
        ("grown", "fixed"),
        {"max_units_in_flight_per_replica": START_COUNT},
    ),
    "writeback": (
        "Write-back in a process or in the replica's threads",
        ("process", "threads"),
        {"writeback.mode": "threads"},
    ),
    "inprocess": (
        "vLLM's engine in the replica's process or in its own processes",
        ("mp", "inproc"),
        {"ray.runtime_env": {"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}},
    ),
}


def one_run(
    name: str, conversations: int, out: Path, changes: dict | None, *, restart: bool = False
) -> dict:
    cfg = bench_config(name, conversations, out)
    if changes:
        data = cfg.model_dump()
        for key, value in changes.items():
            # A dotted key from the top ("ray.runtime_env"); one not naming a top-level
            # section is `regenerate`'s ("writeback.mode").
            path = key.split(".")
            if path[0] not in data:
                path = ["regenerate", *path]
            *parents, field = path
            node = data
            for part in parents:
                node = node[part]
            node[field] = value
        cfg = type(cfg).model_validate(data)
    if restart:  # the job's runtime_env reaches the replica only through ray.init
        import ray

        from pipeline.regenerate.driver.pool import init_ray

        ray.shutdown()
        init_ray(cfg.ray)
    got = run_c(cfg, None)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "tok_s": got["c_generated_tokens"] / got["c_s"],
        "mean_batch": got["c_mean_batch"],
        "engine_steps": got["c_engine_steps"],
        "admit_s": got["c_admit_s"],
        "handle_s": got["c_handle_s"],
        "peak_units": got["c_peak_units"],
        "units_wanted": got["c_units_wanted"],
    }


def run_target(ab: str, name: str, conversations: int, rounds: int) -> dict:
    from pipeline.regenerate.driver.pool import init_ray
    from pipeline.toy.target import build_toy_target

    _, (shipped, changed), settings = AB[ab]
    build_toy_target(name)
    work = Path(tempfile.mkdtemp(prefix=f"bench-ab-{ab}-{name}-"))
    per_round = []
    restart = any(key.startswith("ray.") for key in settings)  # for both kinds alike
    try:
        if not restart:  # else each run starts its own Ray
            init_ray(bench_config(name, conversations, work / "unused").ray)
        start_units = None
        for round_ in range(rounds):
            order = (shipped, changed) if round_ % 2 == 0 else (changed, shipped)
            r: dict = {}
            for kind in order:  # round 0 runs the shipped one first: it gives the start count
                changes = None
                if kind == changed:
                    changes = {
                        k: start_units if v == START_COUNT else v for k, v in settings.items()
                    }
                got = one_run(
                    name, conversations, work / f"r{round_}-{kind}", changes, restart=restart
                )
                start_units = start_units or got["units_wanted"]
                r.update({f"{kind}_{k}": v for k, v in got.items() if k in KEEP})
            r[f"{shipped}_over_{changed}"] = r[f"{shipped}_tok_s"] / r[f"{changed}_tok_s"]
            r["start_units"] = start_units
            per_round.append({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})
            print(f"{ab} {name} round {round_} ({'+'.join(order)}): {json.dumps(per_round[-1])}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    keys = [f"{shipped}_over_{changed}"]
    keys += [f"{kind}_{k}" for kind in (shipped, changed) for k in KEEP]
    return {
        "conversations": conversations,
        "start_units": start_units,
        **{k: spread(r[k] for r in per_round) for k in keys},
        "rounds": per_round,
    }


def record(ab: str, results: dict, args, load: float) -> None:
    title, (a, b), settings = AB[ab]
    flat: dict = {}
    for name, r in results.items():
        for key, value in r.items():
            if isinstance(value, dict):
                flat[f"{ab}_{name}_{key}"] = round(value["median"], 3)
                flat[f"{ab}_{name}_{key}_range"] = [round(value["min"], 3), round(value["max"], 3)]
    merge_results(flat)

    fmt = fmt_spread
    changes = ", ".join(
        f"`{k if k.split('.')[0] in ('ray', 'replicas', 'cpu_host') else 'regenerate.' + k}: {v}`"
        for k, v in settings.items()
    )
    if START_COUNT in settings.values():
        changes += f" ({START_COUNT}: the count a replica starts with)"
    lines = [
        f"# {title} A/B (bench/regenerate_ab.py --ab {ab})",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, load average {load:.1f} at "
        f"start. (c) = `run_regenerate`, default config, through local Ray, committing shards; "
        f"the workload of bench/regenerate.py; {args.rounds} alternating rounds, medians "
        f"[min-max], engine starts excluded. {a} = as shipped; {b} = {changes}.",
        "",
        f"| target | conversations | {a} tok/s | {b} tok/s | {a} / {b} | mean batch "
        f"{a} / {b} | engine steps {a} / {b} | admit s {a} / {b} | handle s {a} / {b} "
        "| units: start / peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['conversations']} | {fmt(r[f'{a}_tok_s'])} | "
            f"{fmt(r[f'{b}_tok_s'])} | {fmt(r[f'{a}_over_{b}'], 3)} | "
            f"{fmt(r[f'{a}_mean_batch'])} / {fmt(r[f'{b}_mean_batch'])} | "
            f"{fmt(r[f'{a}_engine_steps'])} / {fmt(r[f'{b}_engine_steps'])} | "
            f"{fmt(r[f'{a}_admit_s'], 1)} / {fmt(r[f'{b}_admit_s'], 1)} | "
            f"{fmt(r[f'{a}_handle_s'], 1)} / {fmt(r[f'{b}_handle_s'], 1)} | "
            f"{r['start_units']} / {r[f'{a}_peak_units']['median']:.0f} |"
        )
    lines += ["", "Per round:", ""]
    for name, r in results.items():
        for i, rnd in enumerate(r["rounds"]):
            lines.append(f"* {name} round {i}: " + ", ".join(f"{k} {v}" for k, v in rnd.items()))
    write_section(f"bench/regenerate_ab.py {ab}", "\n".join(lines))
    print("wrote bench/results.json and bench/RESULTS.md", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ab", default="growth,writeback", help=f"which A/Bs: {', '.join(AB)}")
    p.add_argument("--targets", default="large,trained")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--conversations", default="large=1000,trained=4000")
    p.add_argument("--no-write", action="store_true", help="print only; leave results files alone")
    args = p.parse_args()
    from pipeline.logs import setup_logging

    setup_logging()
    counts = dict(part.split("=", 1) for part in args.conversations.split(","))
    for ab in args.ab.split(","):
        if ab not in AB:
            raise SystemExit(f"unknown A/B {ab!r}; known: {', '.join(AB)}")
        load = os.getloadavg()[0]
        results: dict = {}
        for name in args.targets.split(","):
            results[name] = run_target(ab, name, int(counts[name]), args.rounds)
            if not args.no_write:  # after each target, so a long run keeps what it measured
                record(ab, results, args, load)


if __name__ == "__main__":
    main()
