"""Drafts on the real target: acceptance length at T=0 and T=1 (real_P6) and serving speed,
on the held-out split of the training mixture and on a source left out of training.

    .venv/bin/python bench/real_target.py [--data DIR] [--steps 400] [--live-prompts 24]
        [--serve-prompts 16] [--serve-concurrency 1 4 16] [--no-serve] [--work DIR]
        [--set KEY=VALUE ...]

The real target is SmolLM2-135M-Instruct (`make setup-real`; docs/targets.md).
Its dataset is `--data` (a version regenerated with
pipeline/demo/configs/real-smollm2.yaml, which captures the union of the
drafts' layers) or, without it, one regenerated here with that config. Three
drafts train on the same shards with the same budget (`--steps` optimiser
steps of 8 sequences, one process, the configs of `make demo-real`:
pipeline/demo/configs/train-real*.yaml), each reading its own subset of the
captured layers:

* DSpark: one layer, block 5 in the fill-in layout (4 drafted tokens), Markov
  rank 64, 1.0 CE + 0.9 L1 + BCE (the draft study's best DSpark loss at 300 steps);
* DFlash: the same backbone, CE only;
* EAGLE-3: one layer, training-time test unrolled 4 steps (4 drafted tokens).

Then one `evaluate` run (the library function the CLI calls) on the held-out
split: T=0 the exact offline walk; T=1 the live loop with rejection sampling
against the HF target (`--live-prompts` prompts); and, unless `--no-serve`,
the serving benchmark (pipeline/evaluate/serving.py): the target in vLLM's
OpenAI server without a draft and with each export (DSpark as its DFlash
backbone, the method vLLM's CPU build has), single stream and a concurrency
sweep, with the T=0 identity check. Figures: `real_tau_*`, `real_P6`
(DSpark / DFlash macro tau, T=0) and `real_P6_T1` with paired bootstrap
intervals, each draft's training seconds per step and tokens/s, and the
serving figures keyed `real_serve_*` as bench/serve.py names them, its plot
in bench/figures/real_serve_curve.png.

Every draft trains without the source left out (REAL_LEFT_OUT, the configs'
`data.exclude_sources`); a second `evaluate` run reads every sample of that
source (`data.split: all`): its T=0 tau per draft (`real_tau_T0_left_out`), each
draft's generalisation ratio left-out / held-out (`real_ood_tau_ratio_<draft>`,
unpaired bootstrap: docs/evaluate.md) and, served on its prompts at one request
in flight, end-to-end speedups (`real_serve_ood_*`, `real_serve_ood_e2e_best`
with a paired bootstrap over prompts). Results merge into bench/results.json
and this bench's sections of bench/RESULTS.md are replaced.
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
    cpu_capability,
    merge_results,
    paired_ratio,
    public_command,
    write_section,
)
from serve import FIGURES, RUNS, e2e_figures, figures_of, keep_raw

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BATCH = 8  # train-real*.yaml's global batch


def regenerate(out: Path, conversations: int | None) -> str:
    """A dataset of the real target's default config (make demo-real's) under `out`."""
    from pipeline.demo.real import REAL_CONFIG
    from pipeline.demo.run import demo_config
    from pipeline.regenerate.run import run_regenerate

    run_regenerate(demo_config(REAL_CONFIG, out, conversations))
    return str(out / "dataset")


def train_drafts(data: str, work: Path, steps: int, extra: dict) -> dict[str, dict]:
    """Train (or reuse, when finished in `work`) the three drafts in REAL_DRAFTS' order;
    their speed figures, a warm-started draft's seconds with its source's beside."""
    from pipeline.demo.real import REAL_DRAFTS, REAL_WARM_FROM, real_train_config
    from pipeline.train.trainer import train

    out: dict[str, dict] = {}
    for name in REAL_DRAFTS:
        config = real_train_config(work, data, name, num_steps=steps, **extra)
        result = train(config)
        timed = (
            result.metrics[3:] or result.metrics
        )  # metrics.jsonl: a row a step; warm-up left out
        out[name] = {
            "run_dir": config.out_dir,
            "steps": result.steps,
            "s_per_step": round(statistics.median(m["seconds"] for m in timed), 3),
            "tokens_per_s": round(statistics.median(m["tokens_per_s"] for m in timed), 1),
            "train_seconds": round(sum(m["seconds"] for m in result.metrics), 1),
            "loss": [round(result.metrics[0]["loss"], 3), round(result.metrics[-1]["loss"], 3)],
        }
        source = REAL_WARM_FROM.get(name)
        out[name]["starts_from"] = source
        out[name]["compute_seconds"] = round(
            out[name]["train_seconds"] + (out[source]["train_seconds"] if source else 0.0), 1
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="a real-target dataset (else regenerated)")
    parser.add_argument("--conversations", type=int, default=None)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--live-prompts", type=int, default=24, help="T=1 prompts (0: skip)")
    parser.add_argument("--serve-prompts", type=int, default=16)
    parser.add_argument(
        "--serve-concurrency", type=int, nargs="+", default=[1, 4, 16], help="held-out prompts"
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="serving: tokens a request")
    parser.add_argument("--no-serve", action="store_true")
    parser.add_argument("--work", type=Path, default=None, help="work here and keep it")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="training overrides"
    )
    args = parser.parse_args()

    from pipeline.config import parse_overrides
    from pipeline.demo.real import REAL_DRAFTS, REAL_LEFT_OUT
    from pipeline.evaluate.config import parse_eval_config
    from pipeline.evaluate.generalisation import generalisation
    from pipeline.evaluate.run import run_evaluation
    from pipeline.evaluate.serving_report import plot_serving, serving_markdown
    from pipeline.logs import setup_logging
    from pipeline.table.dataset import Dataset

    setup_logging()
    load = os.getloadavg()[0]
    started = time.monotonic()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-real-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        data = args.data or regenerate(work, args.conversations)
        trained = train_drafts(data, work, args.steps, parse_overrides(args.set))
        drafts = [dict(name=n, path=t["run_dir"]) for n, t in trained.items()]
        drafts.append(dict(name="untrained", path=trained["DSpark"]["run_dir"], untrained=True))
        config = dict(
            target="smollm2-135m-instruct",
            out_dir=str(work / "eval"),
            data=dict(uri=data, exclude_sources=list(REAL_LEFT_OUT)),
            drafts=drafts,
            calibration=dict(store=False),
        )
        if args.live_prompts:
            config["live"] = dict(
                temperatures=[1.0], num_prompts=args.live_prompts, max_new_tokens=128
            )
        if not args.no_serve:
            config["serving"] = dict(
                drafts=[dict(name=n) for n in REAL_DRAFTS],
                num_prompts=args.serve_prompts,
                max_tokens=args.max_tokens,
                concurrency=args.serve_concurrency,
                identity=dict(),  # every served prompt, greedy, against the plain engine
            )
        result = run_evaluation(parse_eval_config(config, "bench/real_target.py"))
        # The source left out of training: every sample of it, T=0, and served single-stream.
        ood_config = {
            **config,
            "out_dir": str(work / "eval-left-out"),
            "data": dict(uri=data, sources=list(REAL_LEFT_OUT), split="all"),
            "drafts": [d for d in drafts if not d.get("untrained")],
        }
        ood_config.pop("live", None)
        if "serving" in config:
            ood_config["serving"] = {**config["serving"], "concurrency": [1]}
        ood = run_evaluation(parse_eval_config(ood_config, "bench/real_target.py")).report
        report, md = result.report, result.markdown_path.read_text()
        for section, out_dir, name in (
            (report.get("serving"), config["out_dir"], "real_serve"),
            (ood.get("serving"), ood_config["out_dir"], "real_serve_ood"),
        ):
            if section:
                keep_raw(section, Path(out_dir) / "serving", RUNS / name)
        FIGURES.mkdir(exist_ok=True)
        plots = {}
        for key, path in result.plots.items():
            if path.name == "serving_curve.png":
                continue  # drawn below as real_serve_curve.png, as bench/serve.py names it
            name = f"real_{path.name}"
            shutil.copyfile(path, FIGURES / name)
            plots[key] = name
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    rows = report["drafts"]
    command = public_command(
        "bench/real_target.py", sys.argv[1:], {"--data": "DATASET", "--work": "WORK"}
    )

    def compare(num: str, den: str, where: str) -> dict | None:
        """Paired ratio of macro taus with its bootstrap interval."""
        pick = (
            (lambda d: d["offline_t0"])
            if where == "t0"
            else (lambda d: d.get("live", {}).get("1.0"))
        )
        return paired_ratio(pick(rows[num]), pick(rows[den]))

    t0 = {n: d["offline_t0"]["tau_macro"] for n, d in rows.items() if d.get("offline_t0")}
    gen = generalisation(report, ood)
    ood_figures = ood_keys(gen, ood, REAL_LEFT_OUT)
    t1 = {n: d["live"]["1.0"]["tau_macro"] for n, d in rows.items() if d.get("live", {}).get("1.0")}
    p6, p6_t1 = compare("DSpark", "DFlash", "t0"), compare("DSpark", "DFlash", "t1")
    vs_eagle = compare("DSpark", "EAGLE-3", "t0"), compare("DSpark", "EAGLE-3", "t1")
    totals = Dataset.open(data).manifest(report["data"]["version"]).totals
    budget = (
        f"{args.steps} steps x {BATCH} sequences each (pipeline/demo/configs/train-real*.yaml"
        + (f", {' '.join(args.set)}" if args.set else "")
        + f"); dataset version {report['data']['version']}, {totals.rows} samples, "
        f"{totals.tokens} tokens; {report['data']['num_samples']} held-out samples"
    )
    figures: dict = {
        "real_target": "smollm2-135m-instruct",
        "real_budget": budget,
        "real_tau_T0": t0,
        "real_tau_T1": t1 or None,
        "real_tau_by_domain_T0": {
            n: d["offline_t0"]["tau_by_domain"] for n, d in rows.items() if d.get("offline_t0")
        },
        "real_P6": p6["ratio"] if p6 else None,
        "real_P6_ci95": p6["ci95"] if p6 else None,
        "real_P6_T1": p6_t1["ratio"] if p6_t1 else None,
        "real_P6_T1_ci95": p6_t1["ci95"] if p6_t1 else None,
        "real_dspark_over_eagle3": {"T0": vs_eagle[0], "T1": vs_eagle[1]},
        "real_train": {
            n: {k: v for k, v in t.items() if k != "run_dir"} for n, t in trained.items()
        },
        **ood_figures,
        "real_bench_load_average": round(load, 2),
        "real_bench_seconds": round(time.monotonic() - started, 1),
    }
    merge_results(
        figures, replace=("real_tau_", "real_P6", "real_train", "real_budget", "real_ood_")
    )
    table = md[md.index("| draft |") :].split("\n\n")[0]
    live_table = md[md.index("## Temperature > 0") :].split("\n\n")[1] if t1 else ""

    def line(key: str, label: str, fig: dict | None, goal: str) -> str:
        if not fig:
            return f"* {key}: not measured"
        ci = "95% CI {:.3f}-{:.3f}".format(*fig["ci95"]) if fig["ci95"] else "no interval"
        return f"* **{key}** ({label}) **= {fig['ratio']:.3f}** ({ci}; {goal})"

    speed = "\n".join(
        f"| {n} | {t.get('starts_from') or '-'} | {t['steps']} | {t['train_seconds']:.0f} | "
        f"{t.get('compute_seconds', t['train_seconds']):.0f} | {t['s_per_step']} | "
        f"{t['tokens_per_s']} | {t['loss'][0]} -> {t['loss'][1]} |"
        for n, t in trained.items()
    )
    write_section(
        "bench/real_target.py",
        "\n".join(
            [
                "## Drafts on the real target (bench/real_target.py, keys real_tau_*, real_P6)",
                "",
                f"SmolLM2-135M-Instruct; `{command}`; "
                f"budget: {budget}; {platform.machine()}, {cpu_capability()}, load average "
                f"{load:.2f}. Intervals: paired stratified bootstrap over held-out samples.",
                "",
                "Training (one process, fp32 on CPU):",
                "",
                "| draft | starts from | steps | seconds | with its source | s/step | "
                "context tokens/s | loss first -> last |",
                "|---|---|---|---|---|---|---|---|",
                speed,
                "",
                "T=0, exact offline walk of the held-out samples:",
                "",
                table,
                "",
                *(
                    [
                        "T=1, live loop with rejection sampling against the HF target:",
                        "",
                        live_table,
                        "",
                    ]
                    if t1
                    else []
                ),
                line("real_P6", "DSpark / DFlash macro tau, T=0", p6, "goal >= 1.16 at T=1"),
                line("real_P6_T1", "DSpark / DFlash macro tau, T=1", p6_t1, "goal >= 1.16"),
                line("DSpark / EAGLE-3", "macro tau, T=0", vs_eagle[0], "paper: 1.27-1.31 at T=1"),
                line("DSpark / EAGLE-3", "macro tau, T=1", vs_eagle[1], "paper: 1.27-1.31 at T=1"),
                "",
                f"Prompts from a source no draft trained on ({', '.join(REAL_LEFT_OUT)}, every "
                f"sample: {ood['data']['num_samples']}), T=0; ratio = left-out / held-out macro "
                "tau, unpaired bootstrap (goal >= 0.85 for every draft):",
                "",
                generalisation_markdown(gen),
                "",
                "Plots: " + ", ".join(f"[{k}](figures/{v})" for k, v in plots.items()) + ".",
            ]
        ),
    )
    ood_serving = ood.get("serving")
    if ood_serving:
        figures.update(ood_serve_keys(ood_serving, "real_serve_ood_"))
        merge_results(
            {k: v for k, v in figures.items() if k.startswith("real_serve_ood_")},
            replace=("real_serve_ood_",),
        )
    serving = report.get("serving")
    if serving:
        prefix = "real_serve_"
        serve_figures = figures_of(serving, prefix)
        serve_figures[f"{prefix}target"] = "smollm2-135m-instruct"
        plot = plot_serving(
            serving,
            FIGURES / f"{prefix}curve.png",
            title="SmolLM2-135M-Instruct on CPU vLLM: throughput vs interactivity",
        )
        merge_results(serve_figures, replace=(prefix,), keep=("real_serve_ood_",))
        write_section(
            f"bench/serve.py {prefix}",
            f"## Serving speed ({prefix}*): SmolLM2-135M-Instruct\n\n"
            f"`{command}` (drafts: the table "
            f"above); host {serve_figures[f'{prefix}host']}; plot: "
            f"[figures/{plot.name}](figures/{plot.name}).\n\n" + serving_markdown(serving),
        )
        figures.update(serve_figures)
    if ood_serving and serving:
        write_section("bench/real_target.py e2e", e2e_markdown(figures, command))
    print(json.dumps(figures, indent=2, default=str))


def e2e_markdown(figures: dict, command: str) -> str:
    """The single-stream end-to-end speedups, held-out split beside the left-out source."""
    slugs = {"DSpark": "dspark", "DFlash": "dflash", "EAGLE-3": "eagle3"}

    def cell(prefix: str, slug: str) -> str:
        fig = figures.get(f"{prefix}e2e_{slug}")
        if not fig:
            return "n/a"
        lo, hi = fig["ci95"]
        return f"{fig['ratio']:.2f} ({lo:.2f}-{hi:.2f})"

    rows = [
        f"| {name} | {cell('real_serve_', slug)} | {cell('real_serve_ood_', slug)} | "
        f"{figures.get(f'real_serve_ood_{slug}_vllm_tau') or float('nan'):.2f} |"
        for name, slug in slugs.items()
    ]
    best = figures.get("real_serve_ood_e2e_best")
    return "\n".join(
        [
            "## End to end, one request at a time (real_serve_e2e_*, real_serve_ood_e2e_*)",
            "",
            f"`{command}`. Speedup = output tokens over wall seconds (first token included) "
            "with the draft / without, the same prompts in the same order; 95% paired "
            "bootstrap over prompts. Left-out: prompts of the source no draft trained on. "
            "Raw report (per request) and server log tails: serve_runs/real_serve/ and "
            "serve_runs/real_serve_ood/.",
            "",
            "| draft | held-out split | left-out source | vLLM tau, left-out |",
            "|---|---|---|---|",
            *rows,
            "",
            f"* **real_serve_ood_e2e_best** = {best:.2f} "
            f"({figures.get('real_serve_ood_e2e_best_draft')}; CI low "
            f"{figures.get('real_serve_ood_e2e_best_ci_low'):.2f}; goal >= 1.5, CI low >= 1.3)"
            if best is not None
            else "* real_serve_ood_e2e_best: not measured",
        ]
    )


def ood_keys(gen: dict, ood: dict, left_out) -> dict:
    """real_tau_T0_left_out and each draft's real_ood_tau_ratio_<draft> (with its interval)."""
    slug = {"DSpark": "dspark", "DFlash": "dflash", "EAGLE-3": "eagle3"}
    out: dict = {
        "real_left_out_source": list(left_out),
        "real_tau_T0_left_out": {n: round(g["left_out"][0], 4) for n, g in gen.items()},
    }
    for name, g in gen.items():
        if name in slug:
            point, lo, hi = g["ratio"]
            out[f"real_ood_tau_ratio_{slug[name]}"] = round(point, 4)
            out[f"real_ood_tau_ratio_{slug[name]}_ci95"] = (
                None if math.isnan(lo) else [round(lo, 4), round(hi, 4)]
            )
    return out


def ood_serve_keys(serving: dict, prefix: str) -> dict:
    """The left-out source's serving figures: e2e speedups, tau and tok/s per engine."""
    out = e2e_figures(serving, prefix)
    for name, e in serving["engines"].items():
        if e.get("served"):
            single = e["single_stream"]
            key = f"{prefix}{name.lower().replace('-', '').replace(' ', '_')}"
            out[key + "_e2e_tok_s"] = single.get("e2e_tok_s")
            out[key + "_vllm_tau"] = (single.get("acceptance") or {}).get("tau")
    return out


def generalisation_markdown(gen: dict) -> str:
    def fmt(v):
        return f"{v[0]:.3f}" + ("" if math.isnan(v[1]) else f" ({v[1]:.3f}-{v[2]:.3f})")

    rows = [
        f"| {n} | {fmt(g['heldout'])} | {fmt(g['left_out'])} | {fmt(g['ratio'])} |"
        for n, g in gen.items()
    ]
    head = "| draft | held-out split | left-out source | ratio |\n|---|---|---|---|"
    return "\n".join([head, *rows])


if __name__ == "__main__":
    main()
