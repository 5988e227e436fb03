"""Does growing a replica's units in flight pay? (c) as shipped against (c) with its units fixed.

    .venv/bin/python bench/unit_growth.py [--targets large,trained] [--rounds 3]
        [--conversations large=1000,trained=4000] [--no-write]

Both runs are `run_regenerate` with the default config through a local Ray,
committing shards, on the workload of bench/regenerate.py (its held-out
synthetic conversations, natural lengths, ~30% multi-turn, `turns: all`,
EOS honoured). The only difference: the fixed run sets
`max_units_in_flight_per_replica` to the count a replica starts with, so its
scheduler never gives a hungry replica another unit (scheduler.py). Rounds
alternate which runs first; rates are steady-state generated tok/s (engine
start excluded); the ratio grown / fixed is per round, reported as the
median with its range. Also recorded: each run's mean engine batch, engine
steps, and the feeder's admission and result-handling seconds, which say
where the host CPU went. Results merge into bench/results.json
(`growth_<target>_*`); this bench's section of RESULTS.md is replaced.
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


def one_run(name: str, conversations: int, out: Path, fixed_units: int | None) -> dict:
    cfg = bench_config(name, conversations, out)
    if fixed_units is not None:
        regen = cfg.regenerate.model_copy(update={"max_units_in_flight_per_replica": fixed_units})
        cfg = cfg.model_copy(update={"regenerate": regen})
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


def run_target(name: str, conversations: int, rounds: int) -> dict:
    from pipeline.regenerate.pool import init_ray
    from pipeline.toy.target import build_toy_target

    build_toy_target(name)
    work = Path(tempfile.mkdtemp(prefix=f"bench-growth-{name}-"))
    per_round = []
    try:
        init_ray(bench_config(name, conversations, work / "unused").ray)
        start_units = None
        for round_ in range(rounds):
            order = ("grown", "fixed") if round_ % 2 == 0 else ("fixed", "grown")
            r: dict = {}
            for kind in order:  # round 0 runs grown first: its summary gives the start count
                fixed = start_units if kind == "fixed" else None
                got = one_run(name, conversations, work / f"r{round_}-{kind}", fixed)
                start_units = start_units or got["units_wanted"]
                r.update({f"{kind}_{k}": v for k, v in got.items() if k in KEEP})
            r["grown_over_fixed"] = r["grown_tok_s"] / r["fixed_tok_s"]
            r["fixed_units"] = start_units
            per_round.append({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})
            print(f"{name} round {round_} ({'+'.join(order)}): {json.dumps(per_round[-1])}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    keys = ["grown_over_fixed"] + [f"{kind}_{k}" for kind in ("grown", "fixed") for k in KEEP]
    return {
        "conversations": conversations,
        "fixed_units": start_units,
        **{k: spread(r[k] for r in per_round) for k in keys},
        "rounds": per_round,
    }


def record(results: dict, args, load: float) -> None:
    flat: dict = {}
    for name, r in results.items():
        for key, value in r.items():
            if isinstance(value, dict):
                flat[f"growth_{name}_{key}"] = round(value["median"], 3)
                flat[f"growth_{name}_{key}_range"] = [
                    round(value["min"], 3),
                    round(value["max"], 3),
                ]
    merge_results(flat)

    fmt = fmt_spread
    lines = [
        "# Unit growth A/B (bench/unit_growth.py)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, load average {load:.1f} at "
        f"start. (c) = `run_regenerate`, default config, through local Ray, committing shards; "
        f"the workload of bench/regenerate.py; {args.rounds} alternating rounds, medians "
        "[min-max], engine starts excluded.",
        "",
        "| target | conversations | grown tok/s | fixed tok/s | grown / fixed | mean batch "
        "grown / fixed | engine steps grown / fixed | admit s grown / fixed "
        "| handle s grown / fixed | units: start / peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['conversations']} | {fmt(r['grown_tok_s'])} | "
            f"{fmt(r['fixed_tok_s'])} | {fmt(r['grown_over_fixed'], 3)} | "
            f"{fmt(r['grown_mean_batch'])} / {fmt(r['fixed_mean_batch'])} | "
            f"{fmt(r['grown_engine_steps'])} / {fmt(r['fixed_engine_steps'])} | "
            f"{fmt(r['grown_admit_s'], 1)} / {fmt(r['fixed_admit_s'], 1)} | "
            f"{fmt(r['grown_handle_s'], 1)} / {fmt(r['fixed_handle_s'], 1)} | "
            f"{r['fixed_units']} / {r['grown_peak_units']['median']:.0f} |"
        )
    lines += ["", "Per round:", ""]
    for name, r in results.items():
        for i, rnd in enumerate(r["rounds"]):
            lines.append(f"* {name} round {i}: " + ", ".join(f"{k} {v}" for k, v in rnd.items()))
    write_section("bench/unit_growth.py", "\n".join(lines))
    print("wrote bench/results.json and bench/RESULTS.md", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default="large,trained")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--conversations", default="large=1000,trained=4000")
    p.add_argument("--no-write", action="store_true", help="print only; leave results files alone")
    args = p.parse_args()
    from pipeline.logs import setup_logging

    setup_logging()
    load = os.getloadavg()[0]
    counts = dict(part.split("=", 1) for part in args.conversations.split(","))
    results: dict = {}
    for name in args.targets.split(","):
        results[name] = run_target(name, int(counts[name]), args.rounds)
        if not args.no_write:  # after each target, so a long run keeps what it measured
            record(results, args, load)


if __name__ == "__main__":
    main()
