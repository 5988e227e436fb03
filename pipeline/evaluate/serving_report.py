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
        *_equal_requests(section),
        *_matched_interactivity(section),
    ]
    return "\n".join(out)


def _single_stream_table(section: dict) -> list[str]:
    """What was measured, then one row per engine at one request at a time (and one per
    engine that was not served, with why)."""
    out = [
        f"{section['num_prompts']} held-out prompts, up to {section['max_tokens']} tokens each, "
        f"T={section['temperature']}, {section['dtype']}; vLLM's OpenAI server driven by "
        f"vllm.benchmarks.serve; every engine started {section.get('server_starts', 1)} times, "
        "alternated. End to end: total output tokens over total request time, first token "
        "included (per prompt, the mean over the starts; speedup with a paired bootstrap "
        "95% interval over the prompts). Decode-only: a request's tokens after the first "
        "over the time after its first (mean over requests). ITL: gaps between streamed "
        "chunks (a chunk holds every token a verification round accepted); TPOT: per token.",
        "",
        "### Single stream (one request at a time)",
        "",
        "| engine | e2e tok/s | e2e speedup [95% CI] | e2e tok/s per start | decode-only tok/s "
        "per user (speedup) | TTFT p50 ms | TPOT p50 ms | vLLM tau | offline tau | "
        "T=0 identity | start s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in _served(section).items():
        s = e["single_stream"]
        acc = e.get("acceptance") or {}
        e2e = e.get("single_stream_e2e_speedup") or {}
        ci = e2e.get("ci95")
        speedup = f"{_f(e2e.get('ratio'), 2)}" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")
        starts = (
            e["engine_start_s"] if isinstance(e["engine_start_s"], list) else [e["engine_start_s"]]
        )
        out.append(
            f"| {name} | {_f(s.get('e2e_tok_s'))} | {speedup if e2e else '-'} | "
            f"{' / '.join(_f(x) for x in s.get('e2e_tok_s_per_start', []))} | "
            f"{_f(s['per_user_tok_s'])} ({_f(e.get('single_stream_speedup'), 2)}) | "
            f"{_f(s['ttft_ms']['p50'])} | {_f(s['tpot_ms']['p50'])} | {_f(acc.get('tau'), 3)} | "
            f"{_f(acc.get('offline_tau'), 3)} | "
            f"{_identity(name, e.get('identity'), e.get('identity_control'))} | "
            f"{' / '.join(_f(x) for x in starts)} |"
        )
    for name, e in section["engines"].items():
        if not e.get("served"):
            out.append(f"| {name} | not served: {e['reason']} |" + " |" * 9)
    return out


def _identity(name: str, ident: dict | None, control: dict | None = None) -> str:
    """The T=0 identity cell: how many outputs matched the target's alone, and why not
    (the plain engine: its second start against its first, the control)."""
    if ident is None and control is None:
        return "baseline" if name == BASELINE else "not checked"
    ident = ident or control
    cell = (
        f"{ident['num_identical']}/{ident['num_prompts']} identical, "
        f"{ident['num_near_tie_flips']} near-tie, {ident['num_real_divergences']} real"
    )
    return f"control: {cell}" if control is not None and name == BASELINE else cell


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


def _equal_requests(section: dict) -> list[str]:
    """Each draft's aggregate throughput over the target alone's at equal requests in flight."""
    drafted = {
        n: e["equal_requests"]
        for n, e in _served(section).items()
        if n != BASELINE and e.get("equal_requests")
    }
    if not drafted:
        return []
    levels = sorted({int(c) for row in drafted.values() for c in row})
    out = [
        "",
        "Aggregate tok/s with the draft over without, at equal requests in flight (first start):",
        "",
        "| draft | " + " | ".join(f"{c} in flight" for c in levels) + " |",
        "|" + "---|" * (len(levels) + 1),
    ]
    return out + [
        f"| {n} | " + " | ".join(_f(row.get(str(c)), 2) for c in levels) + " |"
        for n, row in drafted.items()
    ]


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
        "point's tok/s per user, only where both curves span it (n/a: one does not reach "
        "that interactivity; extend serving.concurrency for more overlap):",
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
