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


def _figures() -> dict:
    spread = {"median": 0.9, "min": 0.8, "max": 1.0}
    return {"trained": {k: spread for k in ("a_tok_s", "c_tok_s", "c_captured_tok_s", "P1")}}


def test_a_last_turns_run_keeps_its_own_keys_and_leaves_the_all_turns_figures(
    tmp_path, monkeypatch
):
    import argparse
    import json

    import results_file

    results_json = tmp_path / "results.json"
    earlier = {
        "P1": 0.959,
        "regen_P1": 0.959,
        "regen_trained_P1": 0.816,
        "regen_bench_load_average": 0.1,
        "other": 1,
    }
    results_json.write_text(json.dumps(earlier))
    monkeypatch.setattr(results_file, "RESULTS_JSON", results_json)
    sections = []
    monkeypatch.setattr(
        bench_regenerate, "write_markdown", lambda results, *a: sections.append(results)
    )
    last = argparse.Namespace(turns="last")
    bench_regenerate.record_toys(_figures(), {}, last, 0.5)
    after = json.loads(results_json.read_text())
    assert after["regen_last_trained_P1"] == 0.9
    assert after["regen_last_trained_P1_range"] == [0.8, 1.0]
    assert {k: after[k] for k in earlier} == earlier  # the all-turns run's figures stay
    assert bench_regenerate.last_turns(last, _figures()) == "trained last turns"

    # an all-turns run replaces the all-turns figures and keeps the last-turns ones
    bench_regenerate.record_toys(_figures(), {}, argparse.Namespace(turns=None), 0.5)
    after = json.loads(results_json.read_text())
    assert after["regen_trained_P1"] == 0.9
    assert after["regen_last_trained_P1"] == 0.9
    assert "regen_P1" not in after and after["other"] == 1
