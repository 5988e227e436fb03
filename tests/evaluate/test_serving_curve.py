"""The serving benchmark's parts that need no engine: which engines a config serves (the
dspark method only where a GPU is), the curve interpolation behind the speedup at matched
interactivity, the plot and tables, and the config's checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.config import ConfigError
from pipeline.drafts.adaptive import ADAPTIVE_ENV, adaptive_schedule
from pipeline.drafts.registry import KINDS
from pipeline.evaluate.config import ServingConfig, parse_eval_config
from pipeline.evaluate.server import BASELINE, Engine, server_command
from pipeline.evaluate.serving import engines_for
from pipeline.evaluate.serving_report import plot_serving, serving_markdown
from pipeline.evaluate.speedups import add_speedups, interpolate, matched_interactivity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "drafts_v0"
EXPORTS = {
    "DFlash": FIXTURES / "dflash" / "export",
    "DSpark": FIXTURES / "dspark" / "export",
    "EAGLE-3": FIXTURES / "eagle3" / "export",
}


def point(c: int, per_user: float, aggregate: float) -> dict:
    pct = {"p50": 1.0, "p90": 2.0, "p99": 3.0}
    return dict(
        concurrency=c, per_user_tok_s=per_user, aggregate_tok_s=aggregate, num_requests=c,
        ttft_ms=pct, itl_ms=pct, tpot_ms=pct,
    )  # fmt: skip


def test_engines_follow_the_exports_and_dspark_needs_a_gpu():
    engines = engines_for(ServingConfig(), EXPORTS)
    assert engines[0] == Engine(BASELINE)
    by_name = {e.name if isinstance(e, Engine) else e["name"]: e for e in engines[1:]}
    assert by_name["DFlash"] == Engine("DFlash", EXPORTS["DFlash"], "dflash", 3)
    assert by_name["EAGLE-3"].method == "eagle3"
    if torch.cuda.is_available():
        assert by_name["DSpark"].method == "dspark"
    else:  # the same config reports it as not served here, saying why
        assert "needs Model Runner V2" in by_name["DSpark"]["reason"]
    only = engines_for(
        ServingConfig(drafts=[dict(name="DFlash", num_speculative_tokens=2)]), EXPORTS
    )
    assert only == [Engine(BASELINE), Engine("DFlash", EXPORTS["DFlash"], "dflash", 2)]
    with pytest.raises(ValueError, match="cannot serve .* a dflash export"):
        engines_for(ServingConfig(drafts=[dict(name="DFlash", method="eagle3")]), EXPORTS)
    with pytest.raises(ValueError, match="no export directory"):
        engines_for(ServingConfig(drafts=[dict(name="DFlash")]), {"DFlash": None})


@pytest.mark.parametrize("cuda", [False, True])
def test_each_kinds_serving_facts_decide_its_engine(cuda, monkeypatch):
    """Per kind, from drafts/registry.py: the method that serves its export, whether vLLM's
    CPU build serves it (else the registry's reason is reported), the server's environment."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    exports = {name: FIXTURES / name / "export" for name in KINDS}
    served = engines_for(ServingConfig(), exports)[1:]
    engines = {e.name if isinstance(e, Engine) else e["name"]: e for e in served}
    for name, kind in KINDS.items():
        if kind.vllm_needs_gpu and not cuda:
            assert engines[name] == {"name": name, "reason": kind.vllm_needs_gpu}
            continue
        engine = engines[name]
        assert engine.method == kind.vllm_method and engine.draft_dir == exports[name]
        args, env = server_command("t", engine, ServingConfig(), port=1, memory=None)
        spec = json.loads(args[args.index("--speculative-config") + 1])
        assert spec["method"] == kind.vllm_method
        assert {k: env.get(k) for k in kind.vllm_env} == dict(kind.vllm_env)
        assert ("VLLM_USE_V2_MODEL_RUNNER" in env) == bool(kind.vllm_env)
    _, plain_env = server_command("t", Engine(BASELINE), ServingConfig(), port=1, memory=None)
    assert "VLLM_USE_V2_MODEL_RUNNER" not in plain_env
    # adaptive drafting reaches the plugin in the server's environment, drafts only
    adaptive = ServingConfig(adaptive_requests=16)
    dflash = engines["dflash"]
    args, env = server_command("t", dflash, adaptive, port=1, memory=None)
    assert env[ADAPTIVE_ENV] == "16.0"
    # and vLLM's own schedule drafts fewer tokens as requests grow, none well before 16
    spec = json.loads(args[args.index("--speculative-config") + 1])
    schedule = spec["num_speculative_tokens_per_batch_size"]
    assert schedule == adaptive_schedule(16, dflash.num_speculative_tokens)
    k = dflash.num_speculative_tokens  # one request: 2/16 = 0.5^3, three tokens at most
    assert schedule[0][::2] == [1, min(k, 3)] and schedule[-1][2] == 0 and schedule[-1][0] < 16
    assert (
        ADAPTIVE_ENV not in server_command("t", Engine(BASELINE), adaptive, port=1, memory=None)[1]
    )


def test_a_served_method_is_one_the_registry_knows():
    with pytest.raises(ConfigError, match="unknown vLLM speculative method 'medusa'; one of"):
        parse_eval_config(
            {
                "drafts": [{"name": "d", "path": "p"}],
                "serving": {"drafts": [{"name": "d", "method": "medusa"}]},
            }
        )


def test_speedup_at_matched_interactivity_interpolates_the_draft_curve():
    base = [point(1, 100.0, 100.0), point(4, 80.0, 320.0), point(16, 40.0, 640.0)]
    draft = [point(1, 200.0, 200.0), point(4, 150.0, 600.0), point(16, 60.0, 960.0)]
    assert interpolate(draft, 150.0) == 600.0
    assert interpolate(draft, 100.0) == pytest.approx(600.0 + (100 - 150) / (60 - 150) * 360)
    assert interpolate(draft, 250.0) is None and interpolate(draft, 50.0) is None
    rows = {r["point"]: r for r in matched_interactivity(base, draft)}
    assert len(rows) == 6
    assert rows["no draft c=1"]["speedup"] == pytest.approx(
        interpolate(draft, 100.0) / 100.0, abs=1e-4
    )
    assert rows["draft c=16"]["speedup"] == pytest.approx(960.0 / interpolate(base, 60.0), abs=1e-4)
    assert (
        rows["no draft c=16"]["speedup"] is None
    )  # 40 tok/s per user: the draft never went so low
    assert rows["draft c=1"]["speedup"] is None  # 200: beyond the baseline's best


def test_speedups_tables_and_plot(tmp_path):
    base = [point(1, 100.0, 100.0), point(4, 80.0, 320.0)]
    draft = [point(1, 180.0, 180.0), point(4, 120.0, 480.0), point(16, 70.0, 900.0)]
    section = {
        "num_prompts": 4, "max_tokens": 32, "temperature": 0.0, "dtype": "float32",
        "engines": {
            BASELINE: dict(served=True, engine_start_s=30.0, single_stream=base[0], curve=base),
            "DFlash": dict(
                served=True, engine_start_s=31.0, single_stream=draft[0], curve=draft,
                acceptance=dict(tau=2.0, position_rate=[0.7, 0.3, 0.1], offline_tau=2.1),
                identity=dict(num_prompts=2, num_identical=1, num_near_tie_flips=1,
                              num_real_divergences=0),
            ),
            "DSpark": dict(served=False, reason="vLLM's dspark method needs a GPU"),
        },
    }  # fmt: skip
    base[0]["per_request"] = {"output_tokens": [32, 32, 20], "latency_s": [0.32, 0.34, 0.2]}
    draft[0]["per_request"] = {"output_tokens": [32, 32, 20], "latency_s": [0.16, 0.2, 0.1]}
    add_speedups(section)
    d = section["engines"]["DFlash"]
    assert d["single_stream_speedup"] == pytest.approx(1.8)
    e2e = d["single_stream_e2e_speedup"]  # total tokens over total time, first token included
    assert e2e["ratio"] == pytest.approx((84 / 0.46) / (84 / 0.86), abs=1e-3)
    assert e2e["ci95"][0] <= e2e["ratio"] <= e2e["ci95"][1]
    assert d["speedup_over_tau"] == pytest.approx(0.9)
    assert "best_speedup_at_matched_interactivity" not in d  # no best over the curve
    # equal requests in flight: only the levels both curves measured (16: the draft only)
    assert d["equal_requests"] == {"1": pytest.approx(1.8), "4": pytest.approx(1.5)}
    base[0]["e2e_tok_s"], draft[0]["e2e_tok_s"] = 97.67, 182.61
    md = serving_markdown(section)
    assert "| DFlash | 182.6 | 1.87 [" in md and "180.0 (1.80)" in md
    assert "not served: vLLM's dspark" in md
    assert "| DFlash | 1.80 | 1.50 |" in md  # the equal-requests table
    assert "1/2 identical, 1 near-tie, 0 real" in md
    png = plot_serving(section, tmp_path / "curve.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_config_checks_name_the_fix():
    base = dict(target="toy:trained", out_dir="x", drafts=[dict(name="a", path="p")])
    with pytest.raises(ConfigError, match="serving.drafts"):
        parse_eval_config({**base, "serving": dict(drafts=[dict(name="b")])})
    with pytest.raises(ConfigError, match="distinct positive"):
        parse_eval_config({**base, "serving": dict(concurrency=[4, 4])})
    with pytest.raises(ConfigError, match="identity.enabled: false"):
        parse_eval_config({**base, "serving": dict(temperature=1.0)})
    ok = parse_eval_config({**base, "serving": dict(temperature=1.0, identity=dict(enabled=False))})
    assert ok.serving.concurrency == [1, 2, 3, 4, 8, 16] and ok.served_drafts() == ["a"]
    assert ok.serving.server_starts == 3 and ok.serving.identity.num_prompts is None
