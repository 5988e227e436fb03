"""The serving benchmark on the toy target: vLLM's OpenAI server without and with a DFlash
export, each started twice, alternated, at concurrency 1 and 4, every figure of the report
present (two real engines).

Run it under the heavy lock: `flock /tmp/dspark-heavy.lock python -m pytest -q
tests/evaluate/test_serving.py`.
"""

from __future__ import annotations

import json

import pytest

from pipeline.evaluate.config import parse_eval_config
from pipeline.evaluate.run import run_evaluation
from pipeline.evaluate.serving import BASELINE

pytestmark = pytest.mark.slow


def _percentiles(d: dict) -> None:
    assert set(d) == {"p50", "p90", "p99"}
    assert 0 < d["p50"] <= d["p90"] <= d["p99"]


def test_serving_benchmark_reports_speed_acceptance_and_identity(dflash_run, tmp_path):
    config = parse_eval_config(
        dict(
            target="toy:trained",
            out_dir=str(tmp_path),
            drafts=[dict(name="DFlash", path=str(dflash_run))],
            calibration=dict(enabled=False),
            serving=dict(
                num_prompts=4,
                max_tokens=24,
                concurrency=[1, 4],
                ignore_eos=True,
                dtype="float32",  # the toy drafts are fp32; bf16 is emulated on this CPU
                enforce_eager=True,
                max_model_len=512,
                identity=dict(num_prompts=2),
                server_starts=2,
            ),
        )
    )
    result = run_evaluation(config)
    s = result.report["serving"]
    assert set(s["engines"]) == {BASELINE, "DFlash"}
    for e in s["engines"].values():
        assert e["served"] and len(e["engine_start_s"]) == 2 and min(e["engine_start_s"]) > 0
        single = e["single_stream"]
        # end to end: the per-prompt means over the two starts, each start's rate beside
        assert len(single["e2e_tok_s_per_start"]) == 2 and single["e2e_tok_s"] > 0
        tokens, latency = single["per_request"]["output_tokens"], single["per_request"]["latency_s"]
        assert len(tokens) == len(latency) == 4
        assert single["e2e_tok_s"] == pytest.approx(sum(tokens) / sum(latency), rel=1e-3)
        assert single["concurrency"] == 1 and single["num_requests"] >= 4
        assert single["output_tokens"] == single["num_requests"] * 24  # ignore_eos
        assert single["per_user_tok_s"] > 0
        for key in ("ttft_ms", "itl_ms", "tpot_ms"):
            _percentiles(single[key])
        assert [p["concurrency"] for p in e["curve"]] == [1, 4]
        c4 = e["curve"][1]
        assert c4["num_requests"] == 8 and c4["aggregate_tok_s"] > 0 and c4["per_user_tok_s"] > 0
    d = s["engines"]["DFlash"]
    assert d["method"] == "dflash" and d["num_speculative_tokens"] == 3
    acc = d["acceptance"]
    assert acc["num_rounds"] > 0 and 1.0 <= acc["tau"] <= 4.0
    assert len(acc["position_rate"]) == 3 and all(0 <= r <= 1 for r in acc["position_rate"])
    # Beside vLLM's: the offline tau on the same prompts, from the draft's own columns.
    assert result.report["drafts"]["DFlash"]["aux_layer_ids"] == [1, 3]
    assert acc["offline_tau"] is not None and acc["offline_tau"] >= 1.0
    ident = d["identity"]
    assert ident["num_prompts"] == 2 and ident["ok"] and ident["num_real_divergences"] == 0
    assert d["single_stream_speedup"] > 0 and d["speedup_over_tau"] > 0
    e2e = d["single_stream_e2e_speedup"]
    assert e2e["ci95"][0] <= e2e["ratio"] <= e2e["ci95"][1]
    assert set(d["equal_requests"]) == {"1", "4"} and all(
        v > 0 for v in d["equal_requests"].values()
    )
    rows = d["matched_interactivity"]
    assert len(rows) == 4 and {r["point"] for r in rows} >= {"no draft c=1", "draft c=4"}
    assert all(r["speedup"] is None or r["speedup"] > 0 for r in rows)
    assert "best_speedup_at_matched_interactivity" not in d  # no best over the curve
    # the control: the plain engine's second start against its first, in fp32 identical
    control = s["engines"][BASELINE]["identity_control"]
    assert control["num_prompts"] == 2 and control["num_identical"] == 2
    # The report: the plot and the tables beside the tau tables.
    assert result.plots["throughput vs interactivity"].stat().st_size > 10_000
    md = result.markdown_path.read_text()
    assert "## Serving speed" in md and "Throughput vs interactivity" in md
    assert json.loads(result.json_path.read_text())["serving"]["engines"]["DFlash"]["served"]
    assert "at equal requests in flight" in md
    for start in (0, 1):
        assert (tmp_path / "serving" / f"DFlash-start{start}.log").exists()
