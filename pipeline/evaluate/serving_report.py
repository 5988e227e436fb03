"""The serving section of the evaluation report: tables and the throughput-vs-interactivity plot.

The plot is the field's standard figure: tokens/s per user (interactivity)
on x, aggregate output tokens/s (throughput) on y, one point per concurrency
level, one curve per draft plus the target alone. A curve up and to the right
of the baseline is a draft that pays. matplotlib runs headless (Agg).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.evaluate.serving import BASELINE


def _f(value, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _served(section: dict) -> dict[str, dict]:
    return {n: e for n, e in section["engines"].items() if e.get("served")}


def serving_markdown(section: dict) -> str:
    """Single stream, acceptance and identity per engine; the curve; matched interactivity."""
    out = [
        *_single_stream_table(section),
        *_position_rates(section),
        *_curve_table(section),
        *_matched_interactivity(section),
    ]
    return "\n".join(out)


def _single_stream_table(section: dict) -> list[str]:
    """What was measured, then one row per engine at one request at a time (and one per
    engine that was not served, with why)."""
    out = [
        f"{section['num_prompts']} held-out prompts, up to {section['max_tokens']} tokens each, "
        f"T={section['temperature']}, {section['dtype']}; vLLM's OpenAI server driven by "
        "vllm.benchmarks.serve. tok/s per user: a request's tokens after the first over the "
        "time after its first (mean over requests); ITL: gaps between streamed chunks (a "
        "chunk holds every token a verification round accepted); TPOT: per token.",
        "",
        "### Single stream (one request at a time)",
        "",
        "| engine | tok/s per user | speedup | TTFT p50 ms | ITL p50 / p90 / p99 ms | "
        "TPOT p50 ms | vLLM tau | offline tau | speedup / tau | T=0 identity | start s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in _served(section).items():
        s = e["single_stream"]
        acc = e.get("acceptance") or {}
        out.append(
            f"| {name} | {_f(s['per_user_tok_s'])} | {_f(e.get('single_stream_speedup'), 2)} | "
            f"{_f(s['ttft_ms']['p50'])} | {_f(s['itl_ms']['p50'])} / {_f(s['itl_ms']['p90'])} / "
            f"{_f(s['itl_ms']['p99'])} | {_f(s['tpot_ms']['p50'])} | {_f(acc.get('tau'), 3)} | "
            f"{_f(acc.get('offline_tau'), 3)} | {_f(e.get('speedup_over_tau'), 2)} | "
            f"{_identity(name, e.get('identity'))} | {_f(e['engine_start_s'])} |"
        )
    for name, e in section["engines"].items():
        if not e.get("served"):
            out.append(f"| {name} | not served: {e['reason']} |" + " |" * 9)
    return out


def _identity(name: str, ident: dict | None) -> str:
    """The T=0 identity cell: how many outputs matched the target's alone, and why not."""
    if ident is None:
        return "baseline" if name == BASELINE else "not checked"
    return (
        f"{ident['num_identical']}/{ident['num_prompts']} identical, "
        f"{ident['num_near_tie_flips']} near-tie, {ident['num_real_divergences']} real"
    )


def _position_rates(section: dict) -> list[str]:
    """vLLM's acceptance per drafted position, single stream (nothing without counters)."""
    rates = {
        n: (e.get("acceptance") or {}).get("position_rate") for n, e in _served(section).items()
    }
    rates = {n: r for n, r in rates.items() if r}
    if not rates:
        return []
    k = max(len(r) for r in rates.values())
    out = [
        "",
        "vLLM's acceptance per drafted position (share of rounds accepting position k, single stream):",
        "",
        "| draft | " + " | ".join(f"k={i}" for i in range(1, k + 1)) + " |",
        "|" + "---|" * (k + 1),
    ]
    return out + [f"| {n} | " + " | ".join(f"{x:.3f}" for x in r) + " |" for n, r in rates.items()]


def _curve_table(section: dict) -> list[str]:
    """The concurrency sweep: one row per engine and concurrency."""
    out = [
        "",
        "### Throughput vs interactivity (concurrency sweep)",
        "",
        "| engine | concurrency | tok/s per user | aggregate tok/s | TTFT p50 ms | TPOT p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in _served(section).items():
        for p in e["curve"]:
            out.append(
                f"| {name} | {p['concurrency']} | {_f(p['per_user_tok_s'])} | "
                f"{_f(p['aggregate_tok_s'])} | {_f(p['ttft_ms']['p50'])} | {_f(p['tpot_ms']['p50'])} |"
            )
    return out


def _matched_interactivity(section: dict) -> list[str]:
    """Each draft's speedup over the target alone at matched tok/s per user."""
    drafted = {
        n: e
        for n, e in _served(section).items()
        if n != BASELINE and e.get("matched_interactivity")
    }
    if not drafted:
        return []
    out = [
        "",
        "Speedup at matched interactivity: both curves interpolated at each measured "
        "point's tok/s per user (n/a: a curve does not reach that interactivity; extend "
        "serving.concurrency for more overlap):",
        "",
        "| draft | at point | tok/s per user | no-draft aggregate | draft aggregate | speedup |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in drafted.items():
        for r in e["matched_interactivity"]:
            out.append(
                f"| {name} | {r['point']} | {_f(r['per_user_tok_s'])} | "
                f"{_f(r['baseline_aggregate_tok_s'])} | {_f(r['draft_aggregate_tok_s'])} | "
                f"{_f(r['speedup'], 2)} |"
            )
    return out


def plot_serving(section: dict, path: Path, title: str | None = None) -> Path:
    """Aggregate tok/s against tok/s per user, one curve per engine, points labelled
    with their concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, e in _served(section).items():
        pts = [p for p in e["curve"] if p["per_user_tok_s"]]
        xs = [p["per_user_tok_s"] for p in pts]
        ys = [p["aggregate_tok_s"] for p in pts]
        style = "s--" if name == BASELINE else "o-"
        (line,) = ax.plot(xs, ys, style, label=name)
        for p, x, y in zip(pts, xs, ys, strict=True):
            ax.annotate(
                str(p["concurrency"]), (x, y), textcoords="offset points", xytext=(4, 4),
                fontsize=7, color=line.get_color(),
            )  # fmt: skip
    ax.set_xlabel("interactivity: tokens/s per user")
    ax.set_ylabel("throughput: aggregate output tokens/s")
    ax.set_title(title or "Throughput vs interactivity (labels: requests in flight)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
