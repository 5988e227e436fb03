"""Serving-speed benchmark: each draft's end-to-end speedup in vLLM, single stream and at equal load.

    .venv/bin/python bench/serve.py --config EVAL.yaml [--set serving.num_prompts=64] \
        [--prefix real_serve_] [--left-out truthfulqa] [--fixed-lengths 128 256]
    .venv/bin/python bench/serve.py --toy [--steps 60] [--set serving.max_tokens=32]

`--config`: an evaluation config with a `serving:` section (the target, its trained
drafts, the dataset; pipeline/evaluate/serving.py) run as `dspark-targets evaluate`
runs it, on its held-out split; `--left-out SOURCE`: once more on every sample of a
source the drafts were trained without (keys `<p>ood_*`); `--fixed-lengths N ...`: once
more per N with every output N tokens long (ignore_eos; keys `<p>fixed<N>_*`). Every run
starts each engine `serving.server_starts` times, alternated. The figures are keyed
`real_serve_*` by default. `--toy`: the trained toy target, 64 reference
conversations, a one-layer DFlash draft trained for `--steps` steps, small serving
settings; keys `serve_*` (a check that the bench runs, not a figure to quote: a draft
as deep as a 4-layer toy target cannot pay; docs/evaluate.md says why).

Figures per run (`<p>` its prefix; per served draft, `<draft>` its name in lower case
with `_`; docs/evaluate.md gives each formula):

* `<p>e2e_<draft>`: end-to-end single-stream speedup over the target alone ({ratio,
  ci95}: paired bootstrap over the prompts), `<p>e2e_best` and `<p>e2e_best_ci_low`
  (the draft with the highest ratio); `<p>c16_min`: the lowest aggregate-throughput
  ratio over the target alone at 16 requests in flight (when swept);
* `<p>single_stream_e2e_tok_s` (no draft), `<p><draft>_single_stream_e2e_tok_s` and
  each start's, the decode-only `<p><draft>_single_stream_decode_speedup`;
* `<p><draft>_equal_requests_speedup` (aggregate tok/s at each level both swept);
* `<p><draft>_vllm_tau`, `<p><draft>_offline_tau`, `<p><draft>_speedup_over_tau`;
* `<p><draft>_identity` (identical / near-tie flips / real divergences) and
  `<p>identity_control` (the plain engine against itself, second start against first);
* `<p>curves`: every engine's (concurrency, tok/s per user, aggregate tok/s);
* `<p>settings`, `<p>host` (with the CPU threads the engines could use).

The plot goes to bench/figures/<p>curve.png; results merge into bench/results.json
(this prefix's earlier keys replaced) and a section of bench/RESULTS.md; the raw
serving section (per-request tokens and latencies) and the server logs of each run go
to bench/serve_runs/<p>/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from results_file import cpu_capability, merge_results, write_section  # bench/ is sys.path[0]

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "bench" / "figures"
RUNS = ROOT / "bench" / "serve_runs"  # each run's raw serving section and server log tails
TOY_SERVING = dict(
    num_prompts=8,
    max_tokens=64,
    concurrency=[1, 4, 16],
    dtype="float32",  # toy drafts are fp32; bf16 is emulated on CPUs without it
    enforce_eager=True,
    max_model_len=1024,
    identity=dict(),  # every served prompt
)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def toy_config(work: Path, steps: int) -> dict:
    """Reference shards of the trained toy target and a DFlash draft trained on them."""
    from pipeline.demo.reference_shards import write_reference_shards
    from pipeline.train.config import parse_train_config
    from pipeline.train.trainer import train

    shards = work / "shards"
    write_reference_shards(shards, num_conversations=64, num_units=2)
    run = work / "dflash"
    train(
        parse_train_config(
            dict(
                target="toy:trained",
                data=dict(uri=str(shards), num_anchors=64, heldout_fraction=0.25, prefetch=1),
                out_dir=str(run),
                num_steps=steps,
                global_batch_size=8,
                draft=dict(kind="dflash", num_layers=1, block_size=4),
                optim=dict(lr=3e-3),
                checkpoint_every=steps,
                log_every=1000,
                num_threads=1,
            )
        )
    )
    return dict(
        target="toy:trained",
        drafts=[dict(name="DFlash", path=str(run))],
        out_dir=str(work / "eval"),
        calibration=dict(enabled=False),
        serving=TOY_SERVING,
    )


def _cpus() -> str:
    """The CPUs this process (and the engines it starts) may run on."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return ",".join(map(str, cpus)) or "unknown"


def e2e_figures(serving: dict, prefix: str) -> dict:
    """Each draft's single-stream end-to-end speedup (`<prefix>e2e_eagle3`) and the best
    draft's, with its interval's lower end."""
    from pipeline.evaluate.serving import BASELINE

    out: dict = {}
    best = None
    for name, e in serving["engines"].items():
        fig = e.get("single_stream_e2e_speedup") if name != BASELINE else None
        if not fig:
            continue
        out[f"{prefix}e2e_{_slug(name).replace('_', '')}"] = fig
        if best is None or fig["ratio"] > best[1]["ratio"]:
            best = (name, fig)
    out[f"{prefix}e2e_best"] = best[1]["ratio"] if best else None
    out[f"{prefix}e2e_best_ci_low"] = best[1]["ci95"][0] if best else None
    out[f"{prefix}e2e_best_draft"] = best[0] if best else None
    return out


def figures_of(serving: dict, prefix: str) -> dict:
    from pipeline.evaluate.serving import BASELINE

    engines = serving["engines"]
    out: dict = {}
    out[f"{prefix}single_stream_e2e_tok_s"] = engines[BASELINE]["single_stream"]["e2e_tok_s"]
    out[f"{prefix}identity_control"] = engines[BASELINE].get("identity_control")
    for name, e in engines.items():
        if name == BASELINE:
            continue
        k = f"{prefix}{_slug(name)}_"
        if not e.get("served"):
            out[k + "not_served"] = e["reason"]
            continue
        acc = e.get("acceptance") or {}
        ident = e.get("identity") or {}
        out.update(
            {
                k + "method": e["method"],
                k + "single_stream_tok_s": e["single_stream"]["per_user_tok_s"],
                k + "single_stream_e2e_tok_s": e["single_stream"]["e2e_tok_s"],
                k + "single_stream_e2e_tok_s_per_start": e["single_stream"].get(
                    "e2e_tok_s_per_start"
                ),
                k + "single_stream_e2e_speedup": e["single_stream_e2e_speedup"],
                k + "single_stream_decode_speedup": e["single_stream_speedup"],
                k + "equal_requests_speedup": e.get("equal_requests"),
                k + "vllm_tau": acc.get("tau"),
                k + "offline_tau": acc.get("offline_tau"),
                k + "speedup_over_tau": e["speedup_over_tau"],
                k + "identity": {
                    x: ident.get(x)
                    for x in (
                        "num_prompts",
                        "num_identical",
                        "num_near_tie_flips",
                        "num_real_divergences",
                    )
                },
                k + "ttft_p50_ms": e["single_stream"]["ttft_ms"]["p50"],
                k + "tpot_p50_ms": e["single_stream"]["tpot_ms"]["p50"],
            }
        )
        c16 = (e.get("equal_requests") or {}).get("16")
        if c16 is not None:
            out[f"{prefix}c16_min"] = min(c16, out.get(f"{prefix}c16_min", c16))
    out.update(e2e_figures(serving, prefix))
    out[f"{prefix}curves"] = {
        name: [[p["concurrency"], p["per_user_tok_s"], p["aggregate_tok_s"]] for p in e["curve"]]
        for name, e in engines.items()
        if e.get("served")
    }
    out[f"{prefix}settings"] = {
        k: serving[k]
        for k in (
            "num_prompts",
            "max_tokens",
            "temperature",
            "dtype",
            "concurrency",
            "server_starts",
        )
    }
    out[f"{prefix}host"] = (
        f"{platform.machine()}, {cpu_capability()}, CPUs {_cpus()}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'unset')}"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="evaluation YAML with a serving: section")
    source.add_argument("--toy", action="store_true", help="the trained toy target (a smoke run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--prefix", default=None, help="key prefix (real_serve_ / serve_)")
    parser.add_argument("--left-out", nargs="*", default=[], help="--config: a source left out")
    parser.add_argument(
        "--fixed-lengths", type=int, nargs="*", default=[], help="--config: ignore_eos runs"
    )
    parser.add_argument("--steps", type=int, default=60, help="--toy: the draft's training steps")
    parser.add_argument("--keep", type=Path, default=None, help="--toy: work here and keep it")
    args = parser.parse_args()

    from pipeline.config import parse_overrides

    prefix = args.prefix or ("serve_" if args.toy else "real_serve_")
    overrides = parse_overrides(args.set)
    runs = [(prefix, {})]
    if args.left_out:
        runs.append(
            (
                f"{prefix}ood_",
                {"data.sources": args.left_out, "data.split": "all", "data.exclude_sources": []},
            )
        )
    for n in args.fixed_lengths:
        runs.append((f"{prefix}fixed{n}_", {"serving.ignore_eos": True, "serving.max_tokens": n}))
    for key_prefix, extra in runs:
        _bench(args, key_prefix, {**overrides, **extra})


def _bench(args, prefix: str, overrides: dict) -> None:
    """One evaluation with serving; its figures, plot, section, raw report and logs."""
    from pipeline.evaluate.config import load_eval_config, parse_eval_config
    from pipeline.evaluate.run import run_evaluation
    from pipeline.evaluate.serving_report import plot_serving, serving_markdown

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-serve-"))
    started = time.monotonic()
    try:
        if args.toy:
            data = toy_config(work, args.steps)
            for key, value in overrides.items():  # dotted keys into the toy's dict
                *path, last = key.split(".")
                node = data
                for part in path:
                    node = node.setdefault(part, {})
                node[last] = value
            config = parse_eval_config(data, "bench/serve.py --toy")
        else:
            config = load_eval_config(args.config, overrides=overrides)
        if config.serving is None:
            raise SystemExit(f"{args.config}: no serving: section to benchmark")
        result = run_evaluation(config)
        serving = result.report["serving"]
        keep_raw(serving, Path(config.out_dir) / "serving", RUNS / prefix.rstrip("_"))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    figures = figures_of(serving, prefix)
    figures[f"{prefix}target"] = config.target
    figures[f"{prefix}seconds"] = round(time.monotonic() - started, 1)
    FIGURES.mkdir(parents=True, exist_ok=True)
    plot = plot_serving(
        serving,
        FIGURES / f"{prefix}curve.png",
        title=f"{config.target}: throughput vs interactivity (labels: requests in flight)",
    )
    merge_results(figures, replace=(prefix,))
    write_section(
        f"bench/serve.py {prefix}",
        f"## Serving speed ({prefix}*): {config.target}\n\n"
        f"`python bench/serve.py {shlex.join(sys.argv[1:])}`"
        + (
            f" (this run: {shlex.join(f'{k}={v}' for k, v in overrides.items())})"
            if overrides
            else ""
        )
        + f"; host {figures[f'{prefix}host']}; plot: [figures/{plot.name}](figures/{plot.name}); "
        f"raw report and server logs: serve_runs/{prefix.rstrip('_')}/.\n\n"
        + serving_markdown(serving),
    )
    print(json.dumps(figures, indent=2))


def keep_raw(serving: dict, logs: Path, out: Path) -> None:
    """The serving section (per-request tokens and latencies included) and the tail of
    each server log, into the repository (small: the tails only)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "serving.json").write_text(json.dumps(serving, indent=1) + "\n")
    for log in sorted(logs.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        (out / log.name).write_text("\n".join(lines[-200:]) + "\n")


if __name__ == "__main__":
    main()
