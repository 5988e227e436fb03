"""How much of a draft's acceptance survives prompts from a source it never saw.

Two evaluations of the same drafts: the held-out split of the training mixture
(the left-out source excluded) and every sample of the source left out of
training (`data.split: all`). A draft's generalisation ratio is its macro tau on
the left-out source over its macro tau on the held-out split; the interval
resamples each side on its own (different samples: nothing to pair), stratified
by domain. A draft that learned its corpus' templates instead of the target
scores well on the first and falls on the second: the ratio says so.
"""

from __future__ import annotations

import math

from pipeline.evaluate.uncertainty import PerSample, macro_tau_interval, unpaired_ratio_interval


def _tau(row: dict | None) -> tuple[float, float, float] | None:
    """(macro tau, lo, hi) of an offline T=0 row, or None."""
    if not row or not row.get("per_sample"):
        return None
    lo, hi = macro_tau_interval(PerSample.from_dict(row["per_sample"]))
    return row["tau_macro"], lo, hi


def generalisation(heldout: dict, left_out: dict) -> dict[str, dict]:
    """Per draft of both reports: held-out and left-out macro tau (T=0) with intervals,
    and the ratio left-out / held-out with its interval."""
    out: dict[str, dict] = {}
    for name, h in heldout.get("drafts", {}).items():
        o = left_out.get("drafts", {}).get(name) or {}
        a, b = (h or {}).get("offline_t0"), o.get("offline_t0")
        if _tau(a) is None or _tau(b) is None:
            continue
        ratio = unpaired_ratio_interval(
            PerSample.from_dict(b["per_sample"]), PerSample.from_dict(a["per_sample"])
        )
        out[name] = {"heldout": _tau(a), "left_out": _tau(b), "ratio": ratio}
    return out


def _fmt(value: tuple[float, float, float]) -> str:
    point, lo, hi = value
    ci = "" if math.isnan(lo) else f" [{lo:.2f}-{hi:.2f}]"
    return f"{point:.2f}{ci}"


def generalisation_table(figures: dict[str, dict], left_out_sources: list[str]) -> str:
    """Held-out split | left-out source | ratio, one row per draft (95% intervals)."""
    name = ", ".join(left_out_sources)
    head = ("draft", "held-out split", f"left-out source ({name})", "ratio")
    rows = [head] + [
        (draft, _fmt(f["heldout"]), _fmt(f["left_out"]), _fmt(f["ratio"]))
        for draft, f in figures.items()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "macro acceptance length at T=0 (95% bootstrap intervals); ratio = left-out / held-out"
    ]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
