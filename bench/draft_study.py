"""The draft study: which recipe of each draft kind accepts the most tokens for its
training compute on the real target, screened by successive halving.

    .venv/bin/python bench/draft_study.py --data DATASET --work WORK
        [--budgets 300 1200 4800] [--keep 3 1] [--seeds 0] [--final-seeds 0 1]
        [--only CELL ...] [--max-samples N] [--serve-cost] [--live N]

Every cell is a recipe: a draft of pipeline/demo/configs/train-real*.yaml (DSpark,
DFlash, EAGLE-3) with a few keys changed (GRID). At the first budget every cell
trains; after each budget the best `--keep` cells of each kind by held-out T=0
macro tau go on to the next budget, with one more per kind that combines every
single change that beat the kind's base at the first budget (the cells cut are
recorded). A cell that trained over COSTLY times its base's seconds goes on only
if it beat the base by COSTLY_GAIN: the study compares recipes at equal compute.
The last budget trains each survivor under every seed of `--final-seeds`. Each
run lives in WORK/<cell>/steps<N>-seed<S>/ and its figures in study.json there:
a rerun reuses every finished run and resumes an interrupted one from its
checkpoint.

Per run: the exact offline T=0 walk on the held-out split of the training
mixture and on every sample of the source left out of training (REAL_LEFT_OUT),
macro and per domain, with bootstrap intervals; DSpark also without its heads
(the backbone vLLM's CPU build serves); the teacher-forced expected acceptance at
T=1 on the trainer's held-out samples (`tau_tv`, 1 + sum_k prod_i (1 - TV_i));
training seconds (a warm start counts its source's too) and context tokens; the
draft's layer passes per drafting round (DSpark/DFlash: its layers once over the
block; EAGLE-3: its layer once per drafted token), a proxy for the served
cost, and with `--serve-cost` the served cost itself at the last budget: the
median drafting round of each export served single-stream in CPU vLLM (the
plugin's round timer), beside the plain target's time per token (an export
only vLLM's GPU method serves is skipped on a CPU host), and with `--live N` the
live loop at T=1 (rejection sampling against the target, the same draws for
every draft) on N prompts of each set, drawn evenly over it. Figures merge into
bench/results.json as `study_*`, the section of bench/RESULTS.md is replaced,
and bench/figures/study_tau_vs_compute.png plots tau against training seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from results_file import (  # bench/ is sys.path[0]
    merge_results,
    paired_ratio,
    public_command,
    write_section,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIGURES = Path(__file__).resolve().parent / "figures"
RESULT = "study.json"
# What a kind's base cell keeps fixed, whatever pipeline/demo/configs/train-real*.yaml
# later adopt from the study: DSpark's base is one layer trained on the paper's
# 0.1 CE + 0.9 L1 + BCE from step 0, with a Markov head of rank 64.
PINNED = {
    "DSpark": {
        "loss.ce_weight": 0.1,
        "loss.tv_weight": None,
        "loss.ce_first_fraction": 0.0,
        "draft.markov_rank": 64,
        "draft.num_layers": 1,
    }
}
# The screen's compute rule: a cell over COSTLY times its base's training seconds goes
# on (alone or in the combined cell) only when COSTLY_GAIN times the base's tau or more.
COSTLY, COSTLY_GAIN = 2.0, 1.05


@dataclass(frozen=True)
class Cell:
    """A recipe: a draft of REAL_DRAFTS with `changes` (dotted training-config keys)."""

    name: str
    draft: str  # DSpark | DFlash | EAGLE-3
    changes: dict = field(default_factory=dict)
    warm_from: str | None = None  # a cell whose run (same budget, seed) this one starts from
    combine: bool = True  # may join its kind's combined cell


def _variants(draft: str, prefix: str, changes: dict[str, dict]) -> list[Cell]:
    return [Cell(prefix, draft)] + [Cell(f"{prefix}-{k}", draft, v) for k, v in changes.items()]


GRID: tuple[Cell, ...] = (
    *_variants(
        "DSpark",
        "dspark",
        {
            "L2": {"draft.num_layers": 2},
            "L3": {"draft.num_layers": 3},
            "B8": {"draft.block_size": 8},
            "A128": {"data.num_anchors": 128},
            "R256": {"draft.markov_rank": 256},
            "tv09": {"loss.tv_weight": 0.9},  # the paper's 0.1 CE + 0.9 TV
            "cefirst": {"loss.ce_first_fraction": 0.5},
            "cefirst09": {"loss.ce_first_fraction": 0.9},
            "ce1": {"loss.ce_weight": 1.0},  # 1.0 CE + 0.9 L1 + BCE
            "kl": {"loss.kl_weight": 1.0, "loss.l1_weight": 0.0},  # forward KL for L1, as EAGLE-3
        },
    ),
    Cell("dspark-warm", "DSpark", {}, warm_from="dflash"),
    # The paper's layout: the anchor's own query drafts the first token, 5 tokens a block
    # (the fill-in cells draft 4). Screened only: vLLM serves it only by its GPU dspark
    # method, so no combined cell takes it.
    Cell("dspark-anchor", "DSpark", {"draft.sample_from_anchor": True}, combine=False),
    *_variants(
        "DFlash",
        "dflash",
        {
            "L2": {"draft.num_layers": 2},
            "L3": {"draft.num_layers": 3},
            "B8": {"draft.block_size": 8},
            "A128": {"data.num_anchors": 128},
        },
    ),
    *_variants(
        "EAGLE-3", "eagle3", {"S7": {"draft.block_size": 7}, "A128": {"data.num_anchors": 128}}
    ),
)


@dataclass
class Study:
    """Where the study reads and writes, and how a run is evaluated."""

    data: str
    work: Path
    target: str = "smollm2-135m-instruct"
    left_out: tuple[str, ...] = ()
    max_samples: int | None = None
    base: dict[str, tuple] = field(default_factory=dict)  # draft -> (yaml path, overrides)
    serve_cost: bool = False  # the last budget's runs served in vLLM for their round cost
    live: int = 0  # prompts per set of the last budget's live loop at T=1 (0: none)

    def run_dir(self, cell: Cell, budget: int, seed: int) -> Path:
        return self.work / cell.name / f"steps{budget}-seed{seed}"

    def run(self, cell: Cell, budget: int, seed: int, cells: dict[str, Cell]) -> dict:
        """The training figures of `cell` at `budget` steps and `seed`: read back when
        written, else trained (or resumed from its checkpoint) and written."""
        from pipeline.train.config import load_train_config
        from pipeline.train.trainer import train

        out = self.run_dir(cell, budget, seed)
        if (out / RESULT).exists():
            return json.loads((out / RESULT).read_text())
        changes = {**cell.changes}
        source_seconds = 0.0
        if cell.warm_from:
            source = self.run(cells[cell.warm_from], budget, seed, cells)
            changes["init_from"] = source["run_dir"]
            source_seconds = source["train_seconds"]
        path, overrides = self.base[cell.draft]
        config = load_train_config(
            path,
            overrides={
                **overrides,
                "data.uri": self.data,
                "out_dir": str(out / "train"),
                "num_steps": budget,
                "seed": seed,
                **changes,
            },
        )
        result = train(config)
        spec = json.loads((result.checkpoint / "spec.json").read_text())
        passes = spec["num_layers"] * (spec["block_size"] if spec["kind"] == "eagle3" else 1)
        record = {
            "cell": cell.name,
            "draft": cell.draft,
            "changes": changes,
            "budget": budget,
            "seed": seed,
            "run_dir": str(result.out_dir),
            "train_seconds": round(sum(m["seconds"] for m in result.metrics) + source_seconds, 1),
            "warm_source_seconds": source_seconds,
            "train_tokens": sum(m["tokens"] for m in result.metrics),
            "layer_passes_per_round": passes,
            "tau_t1_teacher_forced": round(result.heldout.get("tau_tv", math.nan), 4),
            "heldout": {},
            "left_out": {},
        }
        self.save(record)
        return record

    def save(self, record: dict) -> None:
        from pipeline.storage import write_text_atomic

        out = Path(record["run_dir"]).parent
        write_text_atomic(out / RESULT, json.dumps(record))

    def data_of(self, where: str, max_samples: int | None) -> dict:
        """The evaluation's data section for `where` ("heldout" or "left_out")."""
        if where == "heldout":
            return dict(uri=self.data, exclude_sources=list(self.left_out), max_samples=max_samples)
        return dict(
            uri=self.data, sources=list(self.left_out), split="all", max_samples=max_samples
        )

    def evaluate(self, records: list[dict], where: str, *, backbone: bool = False) -> None:
        """Fill `record[where]` ("heldout" or "left_out": {row: offline_t0}) of every record
        that lacks it, all in one evaluation (the samples are read once); DSpark runs also
        get their backbone row when `backbone`."""
        from pipeline.evaluate.config import parse_eval_config
        from pipeline.evaluate.run import run_evaluation

        drafts, todo = [], []
        for r in records:  # only the rows a record lacks
            key = f"{r['cell']}@{r['budget']}-{r['seed']}"
            wanted = [] if "draft" in r[where] else [dict(name=key, path=r["run_dir"])]
            if backbone and r["draft"] == "DSpark" and "backbone" not in r[where]:
                wanted.append(dict(name=f"{key}/backbone", path=r["run_dir"], use_heads=False))
            drafts += wanted
            todo += [r] if wanted else []
        if not todo:
            return
        config = dict(
            target=self.target,
            out_dir=str(self.work / "eval" / f"{where}-{len(drafts)}-{drafts[0]['name']}"),
            data=self.data_of(where, self.max_samples),
            drafts=drafts,
            calibration=dict(enabled=False),
        )
        rows = run_evaluation(parse_eval_config(config, "bench/draft_study.py")).report["drafts"]
        for r in todo:
            key = f"{r['cell']}@{r['budget']}-{r['seed']}"
            if key in rows:
                r[where]["draft"] = rows[key]["offline_t0"]
            if f"{key}/backbone" in rows:
                r[where]["backbone"] = rows[f"{key}/backbone"]["offline_t0"]
            self.save(r)

    def live_t1(self, records: list[dict], where: str) -> None:
        """Fill `record[where]["live_t1"]` of every record that lacks it: the live loop at
        T=1 (rejection sampling against the reference target) on `live` prompts of the
        set, drawn evenly over it; the same prompts and random draws for every draft."""
        from pipeline.evaluate.config import parse_eval_config
        from pipeline.evaluate.run import run_evaluation

        todo = [r for r in records if "live_t1" not in r[where]]
        if not todo or not self.live:
            return
        keys = {f"{r['cell']}@{r['budget']}-{r['seed']}": r for r in todo}
        config = dict(
            target=self.target,
            out_dir=str(self.work / "eval" / f"live-{where}-{len(todo)}-{next(iter(keys))}"),
            data=self.data_of(where, self.live),
            drafts=[dict(name=k, path=r["run_dir"]) for k, r in keys.items()],
            live=dict(temperatures=[1.0], num_prompts=self.live),
            calibration=dict(enabled=False),
        )
        rows = run_evaluation(parse_eval_config(config, "bench/draft_study.py")).report["drafts"]
        for key, r in keys.items():
            r[where]["live_t1"] = rows[key]["live"]["1.0"]
            self.save(r)

    def served_cost(self, records: list[dict], num_prompts: int = 8, max_tokens: int = 64) -> None:
        """Fill `served_round_ms` of every record that lacks it: the median wall time of one
        drafting round with its export served single-stream in CPU vLLM (heads included),
        beside `target_token_ms`, the plain engine's end-to-end time per generated token
        on the same prompts (left-out samples' prompts, which no draft trained on)."""
        import statistics

        import torch

        from pipeline.drafts.registry import serving_kind
        from pipeline.drafts.vllm_check import decode, export_method
        from pipeline.table.split import DatasetSplit
        from pipeline.targets.resolve import resolve_model

        todo = [r for r in records if "served_round_ms" not in r]
        if not todo:
            return
        split = DatasetSplit(self.data, sources=list(self.left_out) or None, heldout_fraction=0.0)
        samples = split.decode(split.train_rows[:num_prompts])
        prompts = [s.input_ids[: s.num_prompt_tokens].tolist() for s in samples]
        target = resolve_model(self.target)
        plain = decode(target, prompts, max_tokens=max_tokens, single_stream=True)
        token_ms = 1e3 * plain.seconds / max(1, sum(len(o) for o in plain.outputs))
        for r in todo:
            export = Path(r["run_dir"]) / "export"
            if serving_kind(export_method(export)).vllm_needs_gpu and not torch.cuda.is_available():
                continue  # the anchor layout: only vLLM's GPU dspark method serves it
            run = decode(
                target,
                prompts,
                max_tokens=max_tokens,
                draft_dir=str(export),
                single_stream=True,
                round_times=True,
            )
            r["served_round_ms"] = round(statistics.median(run.round_ms), 2)
            r["target_token_ms"] = round(token_ms, 2)
            r["served_tau"] = round(run.tau, 3)
            self.save(r)


def macro(run: dict, where: str = "heldout", row: str = "draft") -> float:
    return run[where].get(row, {}).get("tau_macro", math.nan)


def base_of(cells: list[Cell], draft: str) -> Cell:
    return next(c for c in cells if c.draft == draft and not c.changes and not c.warm_from)


def affordable(cells: list[Cell], scores: dict[str, float], seconds: dict[str, float]) -> set:
    """The cells worth their compute: at most COSTLY times their base's training seconds,
    or ahead of the base by at least COSTLY_GAIN (a dearer recipe must buy its cost)."""
    out = set()
    for c in cells:
        base = base_of(cells, c.draft).name
        cheap = seconds.get(c.name, 0) <= COSTLY * seconds.get(base, math.inf)
        if cheap or scores.get(c.name, 0) >= COSTLY_GAIN * scores[base]:
            out.add(c.name)
    return out


def combined(cells: list[Cell], first: dict[str, float], worth: set | None = None) -> list[Cell]:
    """Per draft kind, one cell with every single change that beat its base at the first
    budget and is worth its compute (of changes to one key, the best; a warm start that
    beat the base makes the combined cell warm-start too); none where fewer than two
    changes qualify."""
    out = []
    for draft in dict.fromkeys(c.draft for c in cells):
        base = base_of(cells, draft)
        best: dict[str, tuple[float, Cell]] = {}
        warm = None
        for c in cells:
            if c.draft != draft or not c.combine or (worth is not None and c.name not in worth):
                continue
            if first.get(c.name, 0) <= first[base.name]:
                continue
            if c.warm_from and not c.changes:
                warm = c
            elif len(c.changes) == 1 and not c.warm_from:
                (key,) = c.changes
                if key not in best or first[c.name] > best[key][0]:
                    best[key] = (first[c.name], c)
        if len(best) + (warm is not None) > 1:
            winners = [c for _, c in sorted(best.values(), key=lambda t: t[1].name)]
            tags = [c.name.removeprefix(base.name + "-") for c in winners]
            tags += [warm.name.removeprefix(base.name + "-")] if warm else []
            changes = {k: v for c in winners for k, v in c.changes.items()}
            out.append(
                Cell(
                    base.name + "+" + "+".join(tags),
                    draft,
                    changes,
                    warm.warm_from if warm else None,
                )
            )
    return out


def halving(
    study: Study,
    grid: tuple[Cell, ...],
    budgets: list[int],
    keep: list[int],
    seeds: list[int],
    final_seeds: list[int],
    left_out_from: int,
) -> dict:
    """Successive halving over `budgets`; {"runs": [...], "cut": {budget: [cells]}}.
    Runs at budgets from `left_out_from` on are also measured on the left-out source;
    at the last budget DSpark runs also without their heads."""
    cells = {c.name: c for c in grid}
    alive = list(grid)
    runs, cut = [], {}
    for i, budget in enumerate(budgets):
        last = i == len(budgets) - 1
        got = {
            c.name: [study.run(c, budget, s, cells) for s in (final_seeds if last and i else seeds)]
            for c in alive
        }
        mine = [r for rs in got.values() for r in rs]
        study.evaluate(mine, "heldout", backbone=last and i > 0)
        if budget >= left_out_from and study.left_out:
            study.evaluate(mine, "left_out", backbone=last and i > 0)
        runs.extend(mine)
        if last:
            if study.serve_cost:
                study.served_cost(mine)
            for where in ("heldout", "left_out") if study.left_out else ("heldout",):
                study.live_t1(mine, where)
            break
        scores = {n: sum(macro(r) for r in rs) / len(rs) for n, rs in got.items()}
        seconds = {n: sum(r["train_seconds"] for r in rs) / len(rs) for n, rs in got.items()}
        worth = affordable(alive, scores, seconds) if i == 0 else {c.name for c in alive}
        survivors = []
        for draft in dict.fromkeys(c.draft for c in alive):
            ranked = sorted(
                (c for c in alive if c.draft == draft and c.name in worth),
                key=lambda c: -scores[c.name],
            )
            survivors += ranked[: keep[min(i, len(keep) - 1)]]
        if i == 0:
            extra = combined(alive, scores, worth)
            cells.update({c.name: c for c in extra})
            survivors += extra
        cut[budget] = sorted(c.name for c in alive if c not in survivors)
        alive = survivors
    return {"runs": runs, "cut": cut}


def best_runs(runs: list[dict], budget: int) -> dict[str, dict]:
    """Per draft kind, the seed-0 run of its best cell at `budget` (mean over seeds)."""
    by_cell: dict[str, list[dict]] = {}
    for r in runs:
        if r["budget"] == budget:
            by_cell.setdefault(r["cell"], []).append(r)
    best: dict[str, tuple[float, dict]] = {}
    for got in by_cell.values():
        score = sum(macro(r) for r in got) / len(got)
        draft = got[0]["draft"]
        if draft not in best or score > best[draft][0]:
            best[draft] = (score, min(got, key=lambda r: r["seed"]))
    return {d: r for d, (_, r) in best.items()}


def compact(run: dict) -> dict:
    def tau(where: str, row: str = "draft"):
        t = run[where].get(row)
        return (
            None
            if not t
            else {
                "macro": t["tau_macro"],
                "ci95": t.get("tau_macro_ci95"),
                "by_domain": t["tau_by_domain"],
            }
        )

    out = {
        k: run[k]
        for k in (
            "cell",
            "draft",
            "budget",
            "seed",
            "train_seconds",
            "train_tokens",
            "layer_passes_per_round",
            "tau_t1_teacher_forced",
        )
    }
    out.update(
        {k: run[k] for k in ("served_round_ms", "target_token_ms", "served_tau") if k in run}
    )
    out["changes"] = {k: v for k, v in run["changes"].items() if k != "init_from"}
    out["T0_heldout"], out["T0_left_out"] = tau("heldout"), tau("left_out")
    if run["heldout"].get("live_t1"):
        out["T1_live_heldout"] = tau("heldout", "live_t1")
        out["T1_live_left_out"] = tau("left_out", "live_t1")
    if run["heldout"].get("backbone"):
        out["T0_heldout_backbone"] = tau("heldout", "backbone")
    return out


def _ci(row: dict | None) -> list[float] | None:
    """A row's macro-tau interval; None where none was drawn (stored as nulls)."""
    ci = (row or {}).get("tau_macro_ci95")
    return ci if ci and None not in ci else None


def frontier(runs: list[dict]) -> list[dict]:
    """The runs no cheaper run beats (by training seconds, then held-out T=0 macro tau):
    the most a method buys for each amount of compute."""
    front, best = [], -math.inf
    for r in sorted(runs, key=lambda r: (r["train_seconds"], -macro(r))):
        if macro(r) > best:
            front.append(r)
            best = macro(r)
    return front


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {"DSpark": "tab:red", "DFlash": "tab:blue", "EAGLE-3": "tab:green"}
    for draft, colour in colours.items():
        mine = [r for r in runs if r["draft"] == draft]
        if not mine:
            continue
        ax.scatter(
            [r["train_seconds"] for r in mine],
            [macro(r) for r in mine],
            s=14,
            alpha=0.35,
            color=colour,
        )
        front = frontier(mine)
        xs, ys = [r["train_seconds"] for r in front], [macro(r) for r in front]
        cis = [_ci(r["heldout"].get("draft")) or [y, y] for r, y in zip(front, ys, strict=True)]
        err = [
            [y - ci[0] for ci, y in zip(cis, ys, strict=True)],
            [ci[1] - y for ci, y in zip(cis, ys, strict=True)],
        ]
        ax.errorbar(
            xs, ys, yerr=err, color=colour, marker="o", label=f"{draft} (best for its compute)"
        )
    ax.set_xscale("log")
    ax.set_xlabel("training seconds (2 CPU cores; a warm start counts its source)")
    ax.set_ylabel("held-out macro tau, T=0 (95% CI)")
    ax.set_title("Draft study, SmolLM2-135M-Instruct: acceptance against training compute")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _round_ms(run: dict) -> str:
    if "served_round_ms" not in run:
        return "-"
    return f"{run['served_round_ms']:.1f} (target {run['target_token_ms']:.1f})"


def _live(run: dict) -> str:
    """A run's T=1 live macro tau, held-out / left-out ("-" where it was not run)."""
    got = [run[w].get("live_t1") for w in ("heldout", "left_out")]
    return " / ".join(f"{t['tau_macro']:.3f}" if t else "-" for t in got) if any(got) else "-"


def markdown(runs: list[dict], cut: dict, ratios: dict, command: str, left_out) -> str:
    def fmt(t) -> str:
        if not t:
            return "-"
        ci = _ci(t)
        return f"{t['tau_macro']:.3f}" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")

    lines = [
        "## Draft study (bench/draft_study.py, keys study_*)",
        "",
        f"SmolLM2-135M-Instruct; `{command}`. Held-out split of the training mixture and every sample "
        f"of the source left out of training ({', '.join(left_out)}); T=0 exact offline walk, 95% "
        "bootstrap intervals; T=1 tf: teacher-forced expected acceptance on the trainer's held-out "
        "samples; passes: draft layer passes per drafting round; round ms: the median drafting "
        "round served single-stream in CPU vLLM (heads included), the target's own ms per token "
        "beside it; T=1 live: the live loop at T=1 (rejection sampling against the target) on "
        "prompts of each set, held-out / left-out. Plot: "
        "[figures/study_tau_vs_compute.png](figures/study_tau_vs_compute.png).",
        "",
        "| budget | cell | seed | train s | passes | round ms | T=0 held-out | T=0 left-out | DSpark backbone | T=1 tf | T=1 live |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["budget"], r["draft"], -macro(r))):
        lines.append(
            f"| {r['budget']} | {r['cell']} | {r['seed']} | {r['train_seconds']:.0f} | {r['layer_passes_per_round']} | "
            f"{_round_ms(r)} | "
            f"{fmt(r['heldout'].get('draft'))} | {fmt(r['left_out'].get('draft'))} | "
            f"{fmt(r['heldout'].get('backbone'))} | {r['tau_t1_teacher_forced']:.3f} | "
            f"{_live(r)} |"
        )
    lines += ["", "Cut (successive halving: held-out T=0 macro tau, the compute rule):", ""]
    lines += [f"* after {b} steps: {', '.join(names) or 'none'}" for b, names in cut.items()]
    lines += [
        "",
        "Best cell of each kind at the last budget, paired ratios of macro tau (T=0, and T=1 live):",
        "",
    ]
    for key, value in ratios.items():
        if value:
            ci = "{:.3f}-{:.3f}".format(*value["ci95"]) if value["ci95"] else "no interval"
            lines.append(f"* {key} **= {value['ratio']:.3f}** (95% CI {ci}; {value['cells']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", required=True, help="a real-target dataset (bench/real_target.py's)"
    )
    parser.add_argument(
        "--work", type=Path, required=True, help="runs live here; a rerun reuses them"
    )
    parser.add_argument("--budgets", type=int, nargs="+", default=[300, 1200, 4800])
    parser.add_argument(
        "--keep", type=int, nargs="+", default=[3, 1], help="cells per kind carried up"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--final-seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--only", nargs="+", default=None, help="cells of GRID to run")
    parser.add_argument("--max-samples", type=int, default=None, help="samples per evaluation")
    parser.add_argument(
        "--left-out-from",
        type=int,
        default=None,
        help="measure the left-out source from this budget on (default: the second; one budget: it)",
    )
    parser.add_argument(
        "--live",
        type=int,
        default=0,
        help="prompts per set of the last budget's live loop at T=1 (0: none)",
    )
    parser.add_argument(
        "--serve-cost",
        action="store_true",
        help="serve the last budget's drafts in CPU vLLM for their drafting round's cost",
    )
    args = parser.parse_args()

    from pipeline.demo import CONFIG_DIR
    from pipeline.demo.real import REAL_DRAFTS, REAL_LEFT_OUT
    from pipeline.logs import setup_logging

    setup_logging()
    study = Study(
        data=args.data,
        work=args.work,
        left_out=REAL_LEFT_OUT,
        max_samples=args.max_samples,
        serve_cost=args.serve_cost,
        live=args.live,
        # DSpark's base is the paper's loss whatever train-real.yaml now sets.
        base={
            n: (CONFIG_DIR / y, {**o, **PINNED.get(n, {})}) for n, (y, _, o) in REAL_DRAFTS.items()
        },
    )
    grid = tuple(c for c in GRID if args.only is None or c.name in args.only)
    left_from = args.left_out_from or (args.budgets[1] if len(args.budgets) > 1 else 0)
    done = halving(study, grid, args.budgets, args.keep, args.seeds, args.final_seeds, left_from)
    runs, cut = done["runs"], done["cut"]
    last = max(r["budget"] for r in runs)
    best = best_runs(runs, last)
    ratios = {}
    for num, den in (("DSpark", "DFlash"), ("DSpark", "EAGLE-3")):
        if num not in best or den not in best:
            continue
        pair = f"study_{num.lower()}_over_{den.lower().replace('-', '')}"
        for row, temp in (("draft", "T0"), ("live_t1", "T1")):
            for where, tag in (("heldout", ""), ("left_out", "_left_out")):
                value = paired_ratio(best[num][where].get(row), best[den][where].get(row))
                if value:
                    value["cells"] = f"{best[num]['cell']} / {best[den]['cell']}, {last} steps"
                    ratios[f"{pair}_{temp}{tag}"] = value
    FIGURES.mkdir(exist_ok=True)
    plot(runs, FIGURES / "study_tau_vs_compute.png")
    command = public_command(
        "bench/draft_study.py", sys.argv[1:], {"--data": "DATASET", "--work": "WORK"}
    )
    merge_results(
        {
            "study_budgets": sorted({r["budget"] for r in runs}),
            "study_runs": [compact(r) for r in runs],
            "study_cut": {str(b): n for b, n in cut.items()},
            "study_best": {d: r["cell"] for d, r in best.items()},
            **ratios,
        },
        replace=("study_",),
    )
    write_section("bench/draft_study.py", markdown(runs, cut, ratios, command, REAL_LEFT_OUT))
    print(
        json.dumps(
            {"best": {d: (r["cell"], macro(r)) for d, r in best.items()}, **ratios}, indent=2
        )
    )


if __name__ == "__main__":
    main()
