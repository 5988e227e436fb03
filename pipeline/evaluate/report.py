"""The evaluation report: JSON (the record), a Markdown table (for people), PNG plots.

Plots: tau per domain for every draft in the config (drafts without a
checkpoint, e.g. a baseline the project cannot train yet, appear as "n/a"
so their absence is visible), conditional acceptance per drafted
position, and, with a `serving:` section, throughput against interactivity
(pipeline/evaluate/serving_report.py). matplotlib runs headless (Agg) and is imported only here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _ci(interval) -> str:
    if not interval or interval[0] is None:
        return "n/a"
    return f"{interval[0]:.2f}-{interval[1]:.2f}"


def write_json(report: dict, path: Path) -> Path:
    from pipeline.storage import write_text_atomic

    return write_text_atomic(path, json.dumps(report, indent=2) + "\n")


def domains_of(report: dict) -> list[str]:
    found: set[str] = set()
    for entry in report["drafts"].values():
        found |= set((entry.get("offline_t0") or {}).get("tau_by_domain", {}))
    return sorted(found)


def t0_caveat(report: dict) -> str | None:
    """The warning a T=0 table carries when the data makes its tau teacher-forced agreement."""
    data = report["data"]
    if data.get("t0_measure", "acceptance") == "acceptance":
        return None
    return (
        "T=0 tau below is teacher-forced agreement with the stored answers, not acceptance "
        f"(data.report_as_teacher_forced): {'; '.join(data.get('t0_inexact', []))}."
    )


def tau_table(report: dict) -> str:
    """Markdown: one row per draft, tau per domain, macro and pooled (T=0, offline, exact)."""
    domains = domains_of(report)
    head = ["draft", *domains, "**macro**", "macro 95% CI", "pooled", "full rounds", "rounds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, entry in report["drafts"].items():
        off = entry.get("offline_t0")
        if not off:
            note = entry.get("note") or "not available"
            lines.append(f"| {name} | " + " | ".join(["n/a"] * (len(head) - 2)) + f" | {note} |")
            continue
        cells = [_fmt(off["tau_by_domain"].get(d)) for d in domains]
        lines.append(
            f"| {name} | "
            + " | ".join(
                [
                    *cells,
                    f"**{_fmt(off['tau_macro'])}**",
                    _ci(off.get("tau_macro_ci95")),
                    _fmt(off["tau"]),
                    _fmt(off["tau_full_rounds"]),
                ]
            )
            + f" | {off['num_rounds']} |"
        )
    return "\n".join(lines)


def markdown(report: dict, plots: dict[str, Path]) -> str:
    out = [
        *_t0_section(report),
        *_position_table(report),
        *_calibration_sections(report),
        *_live_section(report),
        *_vllm_section(report),
        *_serving_section(report),
    ]
    if plots:
        out += ["", "## Plots", ""] + [f"* {k}: `{p}`" for k, p in plots.items()]
    return "\n".join(out) + "\n"


def _t0_section(report: dict) -> list[str]:
    """The title, what the figures are, and the T=0 tau table (with its caveat)."""
    data = report["data"]
    caveat = t0_caveat(report)
    t0 = (
        "## Temperature 0 (exact, offline walk of the target's greedy trajectory)"
        if caveat is None
        else "## Temperature 0 (offline walk: teacher-forced agreement, not acceptance)"
    )
    return [
        f"# Acceptance length against {report['target']}",
        "",
        f"{data['num_samples']} held-out samples of {data['uri']} (version {data['version']}, "
        f"held-out fraction {data['heldout_fraction']}). tau = 1 + accepted drafted tokens per "
        "verification round, pooled over rounds; macro = mean over domains; intervals: "
        "stratified bootstrap over samples (pipeline/evaluate/uncertainty.py).",
        "",
        t0,
        "",
        *([caveat, ""] if caveat else []),
        tau_table(report),
        "",
    ]


def _position_table(report: dict) -> list[str]:
    """Conditional acceptance per drafted position at T=0, one row per draft."""
    out = ["### Conditional acceptance per drafted position (T=0)", ""]
    n_max = max(
        (
            len(e["offline_t0"]["position_acceptance"])
            for e in report["drafts"].values()
            if e.get("offline_t0")
        ),
        default=0,
    )
    out.append("| draft | " + " | ".join(f"k={k}" for k in range(1, n_max + 1)) + " |")
    out.append("|" + "---|" * (n_max + 1))
    for name, entry in report["drafts"].items():
        if entry.get("offline_t0"):
            rates = entry["offline_t0"]["position_acceptance"]
            out.append(f"| {name} | " + " | ".join(_fmt(r) for r in rates) + " |")
    return out


def _calibration_sections(report: dict) -> list[str]:
    """Per draft with a confidence head: its calibration per position and truncation sweep."""
    out: list[str] = []
    for name, entry in report["drafts"].items():
        cal = entry.get("calibration")
        if not cal:
            continue
        out += [
            "",
            f"### Confidence head of {name}: calibration (held-out eval half) and truncation",
            "",
            "| position | events | accept rate | ECE raw | ECE scaled | AUC | temperature |",
            "|---|---|---|---|---|---|---|",
        ]
        m = cal["metrics"]
        for k in range(len(m["events"])):
            out.append(
                f"| {k + 1} | {m['events'][k]} | {_fmt(m['accept_rate'][k])} | {_fmt(m['ece_raw'][k])} | "
                f"{_fmt(m['ece_scaled'][k])} | {_fmt(m['auc'][k])} | {_fmt(cal['temperatures'][k])} |"
            )
        out += [
            "",
            "| threshold | tau | verify rate | accepted / verified token | rounds |",
            "|---|---|---|---|---|",
        ]
        for row in entry.get("truncation", []):
            out.append(
                f"| {row['threshold']} | {_fmt(row['tau'])} | {_fmt(row['verify_rate'])} | "
                f"{_fmt(row['accepted_per_verified_token'])} | {row['rounds']} |"
            )
    return out


def _live_section(report: dict) -> list[str]:
    """T>0: the live loop's tau per draft and temperature (nothing when it did not run)."""
    live = {n: e["live"] for n, e in report["drafts"].items() if e.get("live")}
    if not live:
        return []
    out = ["", "## Temperature > 0 (live loop, rejection sampling, HF reference target)", ""]
    out += [
        "| draft | temperature | tau | macro | macro 95% CI | rounds | prompts x runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in live.items():
        for temp, r in runs.items():
            out.append(
                f"| {name} | {temp} | {_fmt(r['tau'])} | {_fmt(r['tau_macro'])} | "
                f"{_ci(r.get('tau_macro_ci95'))} | {r['num_rounds']} | "
                f"{r['num_samples']} x {r.get('samples_per_prompt', 1)} |"
            )
    return out


def _vllm_section(report: dict) -> list[str]:
    """The vLLM cross-check against the offline walk (nothing when it did not run)."""
    if not report.get("vllm"):
        return []
    v = report["vllm"]
    return [
        "",
        "## vLLM cross-check (T=0)",
        "",
        f"vLLM `{v['method']}` with {v['draft_dir']}: tau {v['vllm_tau']:.3f} over "
        f"{v['vllm_num_drafts']} rounds; offline walk of the same trajectories: tau "
        f"{v['offline_tau']:.3f} over {v['offline_rounds']} rounds. Relative gap "
        f"{v['relative_gap']:.4f} (tolerance {v['tolerance']}; last-round bound "
        f"{v['end_effect_bound']:.3f}): **{'within' if v['within_tolerance'] else 'OUTSIDE'} tolerance**.",
    ]


def _serving_section(report: dict) -> list[str]:
    """The serving benchmark's tables (nothing when it did not run)."""
    if not report.get("serving"):
        return []
    from pipeline.evaluate.serving_report import serving_markdown

    return [
        "",
        "## Serving speed (vLLM, with and without the drafts)",
        "",
        serving_markdown(report["serving"]),
    ]


def _acceptance(entry: dict, temperature: str | None) -> dict | None:
    """The T=0 offline result (temperature None) or the live result at that temperature."""
    if temperature is None:
        return entry.get("offline_t0")
    return (entry.get("live") or {}).get(temperature)


def plot_tau_by_domain(report: dict, path: Path, temperature: str | None = None) -> Path:
    """Bars of tau per domain and the macro average (with its interval) for every draft."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = [*domains_of(report), "macro"]
    names = list(report["drafts"])
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(domains)), 4.2))
    for i, name in enumerate(names):
        res = _acceptance(report["drafts"][name], temperature)
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(domains))]
        if not res:
            for x in xs:
                ax.text(x, 1.02, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
            ax.bar(xs, [0] * len(xs), width, label=f"{name} (n/a)")
            continue
        vals = [res["tau_by_domain"].get(d) for d in domains[:-1]] + [res["tau_macro"]]
        ax.bar(xs, [v or 0 for v in vals], width, label=name)
        ci = res.get("tau_macro_ci95")
        if ci and ci[0] is not None:
            macro = res["tau_macro"]
            ax.errorbar(
                xs[-1],
                macro,
                yerr=[[macro - ci[0]], [ci[1] - macro]],
                fmt="none",
                ecolor="black",
                capsize=2,
                lw=0.8,
            )
    ax.set_xticks(range(len(domains)), domains)
    ax.set_ylabel("tau (tokens / verification round)")
    label = "T=0 (exact, offline)" if temperature is None else f"T={temperature} (live loop)"
    ax.set_title(f"Acceptance length per domain, {label}, target {report['target']}")
    ax.axhline(1.0, color="grey", lw=0.6)
    # Below the axes, so the legend never covers a bar.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(len(names), 5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_position_acceptance(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, entry in report["drafts"].items():
        off = entry.get("offline_t0")
        if off:
            rates = off["position_acceptance"]
            ax.plot(
                range(1, len(rates) + 1),
                [r if r is not None else float("nan") for r in rates],
                "o-",
                label=name,
            )
    ax.set_xlabel("drafted position k")
    ax.set_ylabel("P(accept k | accepted 1..k-1)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Conditional acceptance per block position, T=0")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(report: dict, out_dir: Path) -> tuple[Path, Path, dict[str, Path]]:
    """report.json, report.md and the plots in `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = {
        "tau per domain": plot_tau_by_domain(report, out_dir / "tau_by_domain.png"),
        "acceptance per position": plot_position_acceptance(
            report, out_dir / "acceptance_by_position.png"
        ),
    }
    temps = sorted({t for e in report["drafts"].values() for t in (e.get("live") or {})})
    for temp in temps:
        plots[f"tau per domain, T={temp}"] = plot_tau_by_domain(
            report, out_dir / f"tau_by_domain_t{temp}.png", temperature=temp
        )
    if report.get("serving"):
        from pipeline.evaluate.serving_report import plot_serving

        plots["throughput vs interactivity"] = plot_serving(
            report["serving"], out_dir / "serving_curve.png"
        )
    report = {**report, "plots": {k: str(p) for k, p in plots.items()}}
    json_path = write_json(report, out_dir / "report.json")
    md_path = out_dir / "report.md"
    md_path.write_text(markdown(report, plots))
    return json_path, md_path, plots
