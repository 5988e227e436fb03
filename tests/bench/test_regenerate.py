"""bench/regenerate.py's baseline: one engine-core placement for the whole run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # its own imports (results_file); appended: tests/regenerate/
# is the package `regenerate` here, so the bench loads under a name of its own
_spec = importlib.util.spec_from_file_location("bench_regenerate", BENCH / "regenerate.py")
bench_regenerate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_regenerate)
pick_placement = bench_regenerate.pick_placement


def _round(host_s: float, workers_s: float, c_s: float) -> dict:
    tokens = 1000
    by = {
        "host": {"a_s": host_s, "a_cpu_loop_s": 1.0},
        "workers": {"a_s": workers_s, "a_cpu_loop_s": 2.0},
    }
    best = "host" if host_s < workers_s else "workers"
    r = {
        "a_host_s": host_s,
        "a_host_tok_s": tokens / host_s,
        "a_workers_s": workers_s,
        "a_workers_tok_s": tokens / workers_s,
        "a_by_placement": by,
        "a_placement": best,
        **by[best],
        "a_generated_tokens": tokens,
        "c_generated_tokens": tokens,
        "c_prompt_tokens": 0,
        "c_s": c_s,
    }
    r["P1"] = (tokens / c_s) / (tokens / r["a_s"])
    return r


def test_the_baseline_keeps_the_placement_with_the_higher_median_in_every_round():
    # host is faster in two rounds of three, and so in the median; round 1's noise
    # makes workers the faster there, which a per-round pick would credit to (a)
    rounds = [_round(10.0, 11.0, 11.0), _round(12.0, 9.0, 11.0), _round(10.0, 11.0, 11.0)]
    picked = pick_placement(rounds)
    assert [r["a_placement"] for r in picked] == ["host"] * 3
    assert [r["a_s"] for r in picked] == [10.0, 12.0, 10.0]
    assert [r["a_cpu_loop_s"] for r in picked] == [1.0, 1.0, 1.0]  # the placement's own figures
    assert picked[1]["P1"] == round(12.0 / 11.0, 3)
    assert picked[1]["P1_round_best"] == round(9.0 / 11.0, 3)
