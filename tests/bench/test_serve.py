"""bench/serve.py's figures from a serving section: the headline keys the issues name."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from serve import figures_of, keep_raw  # noqa: E402

from pipeline.evaluate.serving import BASELINE  # noqa: E402


def _engine(e2e, equal, **extra):
    single = {
        "per_user_tok_s": 10.0,
        "e2e_tok_s": 9.0,
        "e2e_tok_s_per_start": [8.9, 9.1],
        "ttft_ms": {"p50": 5.0},
        "tpot_ms": {"p50": 90.0},
    }
    return dict(
        served=True,
        method="dflash",
        single_stream=single,
        single_stream_e2e_speedup=e2e,
        single_stream_speedup=1.1,
        speedup_over_tau=0.8,
        equal_requests=equal,
        curve=[],
        **extra,
    )


def test_the_headline_is_the_best_end_to_end_ratio_and_its_interval_low():
    section = {
        "num_prompts": 64,
        "max_tokens": 128,
        "temperature": 0.0,
        "dtype": "bfloat16",
        "concurrency": [1, 16],
        "server_starts": 3,
        "engines": {
            BASELINE: {**_engine(None, None), "identity_control": {"num_identical": 64}},
            "DSpark": _engine({"ratio": 1.4, "ci95": [1.3, 1.5]}, {"1": 1.3, "16": 0.98}),
            "EAGLE-3": _engine({"ratio": 1.6, "ci95": [1.2, 1.9]}, {"1": 1.5, "16": 1.01}),
            "DFlash": {"served": False, "reason": "not exported"},
        },
    }
    f = figures_of(section, "real_serve_")
    assert f["real_serve_e2e_best"] == 1.6 and f["real_serve_e2e_best_ci_low"] == 1.2
    assert f["real_serve_e2e_best_draft"] == "EAGLE-3"
    assert f["real_serve_e2e_dspark"] == {"ratio": 1.4, "ci95": [1.3, 1.5]}
    assert f["real_serve_e2e_eagle3"] == {"ratio": 1.6, "ci95": [1.2, 1.9]}
    assert "real_serve_e2e_eagle_3" not in f  # one key per figure
    assert f["real_serve_c16_min"] == 0.98  # the worst draft at 16 requests in flight
    assert f["real_serve_identity_control"] == {"num_identical": 64}
    assert f["real_serve_dflash_not_served"] == "not exported"
    assert f["real_serve_settings"]["server_starts"] == 3
    assert "CPUs " in f["real_serve_host"]


def test_the_raw_report_and_log_tails_are_kept(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "DSpark-start0.log").write_text("\n".join(f"line {i}" for i in range(500)))
    out = tmp_path / "kept"
    keep_raw({"engines": {}}, logs, out)
    kept = (out / "DSpark-start0.log").read_text().splitlines()
    assert len(kept) == 200 and kept[-1] == "line 499"
    assert (out / "serving.json").read_text().startswith("{")
