"""Offline tau equals vLLM's at temperature 0, within the stated tolerance (a real engine each).

vLLM's CPU build serves the DSpark draft's DFlash backbone export (its
dspark method needs Triton); the offline walk runs the same weights without
the heads on the trajectories vLLM produced. Stated tolerance: 3% relative
(pipeline/evaluate/vllm.py says what may differ and why).
"""

from __future__ import annotations

import pytest

from pipeline.evaluate.config import parse_eval_config
from pipeline.evaluate.run import run_evaluation

pytestmark = pytest.mark.slow


def test_offline_tau_matches_vllm_counters(dspark_run, tmp_path):
    config = parse_eval_config(
        dict(
            target="toy:trained",
            out_dir=str(tmp_path),
            drafts=[dict(name="DSpark", path=str(dspark_run))],
            calibration=dict(enabled=False),
            vllm=dict(draft="DSpark", num_prompts=6, max_tokens=160, tolerance=0.03),
        )
    )
    v = run_evaluation(config).report["vllm"]
    print(v)
    assert v["method"] == "dflash" and v["draft_dir"].endswith("export")  # the DFlash backbone
    assert v["vllm_num_drafts"] > 50 and v["generated_tokens"] > 100
    assert v["vllm_tau"] > 1.0  # the draft does get tokens accepted
    assert v["relative_gap"] <= 0.03 and v["within_tolerance"]
    # Per-position acceptance (share of rounds accepting >= k) agrees too.
    for a, b in zip(v["vllm_position_rate"], v["offline_position_rate"], strict=True):
        assert abs(a - b) <= 0.05


def test_eagle3_offline_tau_matches_vllm_counters(eagle3_run, tmp_path):
    """vLLM's eagle3 method serves the EAGLE-3 export; the offline step-by-step drafting
    of the same weights accepts what vLLM accepted, within the same tolerance."""
    config = parse_eval_config(
        dict(
            target="toy:trained",
            out_dir=str(tmp_path),
            drafts=[dict(name="EAGLE-3", path=str(eagle3_run))],
            vllm=dict(draft="EAGLE-3", num_prompts=6, max_tokens=160, tolerance=0.03),
        )
    )
    v = run_evaluation(config).report["vllm"]
    print(v)
    assert v["method"] == "eagle3" and v["draft_dir"].endswith("export")
    assert v["vllm_num_drafts"] > 20 and v["generated_tokens"] > 100 and v["vllm_tau"] > 1.0
    assert v["relative_gap"] <= 0.03 and v["within_tolerance"]
    for a, b in zip(v["vllm_position_rate"], v["offline_position_rate"], strict=True):
        assert abs(a - b) <= 0.05
