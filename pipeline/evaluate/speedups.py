"""Speedups read off the serving curves (the `serving:` section's per-draft figures).

Single stream: end to end (first token included, total tokens over total
time) with the draft over without, with a paired bootstrap interval over the
prompts: the headline; the decode-only rate per user beside it. At equal
requests in flight: aggregate throughput with the draft over without, at each
level both engines measured. At matched interactivity: the draft curve's
aggregate throughput interpolated at each measured point's tokens/s per user,
over the baseline's there, only where both curves span that point (no best
over the curve: a point on a steep stretch of one curve says little).
"""

from __future__ import annotations

from typing import Any

from pipeline.evaluate.server import BASELINE


def interpolate(curve: list[dict], x: float) -> float | None:
    """Aggregate tok/s of `curve` at `x` tokens/s per user (linear between its points);
    None outside the range the curve measured."""
    pts = sorted((p["per_user_tok_s"], p["aggregate_tok_s"]) for p in curve if p["per_user_tok_s"])
    if not pts or not pts[0][0] <= x <= pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[0][1]  # a single point, x equal to it


def matched_interactivity(baseline: list[dict], drafted: list[dict]) -> list[dict]:
    """At each measured point of either curve (its tokens/s per user), both curves'
    aggregate tok/s there (interpolated) and their ratio; None where a curve does not
    reach that interactivity (a sweep that stops too early leaves no overlap)."""
    rows = []
    for source, curve in (("no draft", baseline), ("draft", drafted)):
        for p in curve:
            x = p["per_user_tok_s"]
            if not x:
                continue
            b, d = interpolate(baseline, x), interpolate(drafted, x)
            rows.append(
                {
                    "point": f"{source} c={p['concurrency']}",
                    "per_user_tok_s": x,
                    "baseline_aggregate_tok_s": None if b is None else round(b, 3),
                    "draft_aggregate_tok_s": None if d is None else round(d, 3),
                    "speedup": None if b is None or d is None else round(d / b, 4),
                }
            )
    return sorted(rows, key=lambda r: -r["per_user_tok_s"])


def equal_requests(baseline: list[dict], drafted: list[dict]) -> dict[str, float | None]:
    """{requests in flight: aggregate tok/s with the draft over without} at every level
    both curves measured."""
    base = {p["concurrency"]: p["aggregate_tok_s"] for p in baseline}
    out = {}
    for p in drafted:
        b, d = base.get(p["concurrency"]), p["aggregate_tok_s"]
        if p["concurrency"] in base:
            out[str(p["concurrency"])] = round(d / b, 4) if b and d else None
    return out


def e2e_speedup(base: dict, drafted: dict) -> dict | None:
    """End-to-end tokens/s with the draft over without, one request in flight, with a
    paired bootstrap interval over the prompts (both engines served the same prompts)."""
    from pipeline.evaluate.uncertainty import paired_rate_ratio

    a, b = drafted.get("per_request"), base.get("per_request")
    if not a or not b or len(a["latency_s"]) != len(b["latency_s"]):
        return None
    point, lo, hi = paired_rate_ratio(
        (a["output_tokens"], a["latency_s"]), (b["output_tokens"], b["latency_s"])
    )
    return {"ratio": round(point, 4), "ci95": [round(lo, 4), round(hi, 4)]}


def add_speedups(section: dict[str, Any]) -> None:
    """Each served draft's speedups over the baseline, written into its entry."""
    base = section["engines"].get(BASELINE)
    if not base:
        return
    for name, entry in section["engines"].items():
        if name == BASELINE or not entry.get("served"):
            continue
        b, d = base["single_stream"]["per_user_tok_s"], entry["single_stream"]["per_user_tok_s"]
        single = round(d / b, 4) if b and d else None
        entry["single_stream_speedup"] = single
        entry["single_stream_e2e_speedup"] = e2e_speedup(
            base["single_stream"], entry["single_stream"]
        )
        tau = (entry.get("acceptance") or {}).get("tau")
        # How much of the acceptance length turns into speed (1.0: drafting is free).
        entry["speedup_over_tau"] = round(single / tau, 4) if single and tau else None
        entry["matched_interactivity"] = matched_interactivity(base["curve"], entry["curve"])
        entry["equal_requests"] = equal_requests(base["curve"], entry["curve"])
