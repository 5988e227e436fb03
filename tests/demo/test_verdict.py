"""The demo's line on DSpark against DFlash says only what its held-out samples support."""

from __future__ import annotations

import pytest

from pipeline.demo.verdict import TRAILS_WHY, comparison_line

DOMAINS = ("chat", "code", "math")


def _row(accepted_per_round: list[float]) -> dict:
    """An offline_t0 entry: per domain, samples of 10 rounds accepting the given means."""
    ids, domain, accepted, rounds = [], [], [], []
    for d in DOMAINS:
        for i, a in enumerate(accepted_per_round):
            ids.append(f"{d}-{i}")
            domain.append(d)
            accepted.append(round(10 * a))
            rounds.append(10)
    macro = 1.0 + sum(accepted) / sum(rounds)
    per_sample = {"ids": ids, "domain": domain, "accepted": accepted, "rounds": rounds}
    return {"offline_t0": {"tau_macro": macro, "per_sample": per_sample}}


def _report(dspark: list[float], dflash: list[float], eagle3: list[float] | None = None) -> dict:
    drafts = {"DSpark": _row(dspark), "DFlash": _row(dflash)}
    if eagle3 is not None:
        drafts["EAGLE-3"] = _row(eagle3)
    return {"drafts": drafts}


def test_a_trailing_dspark_gets_its_budget_and_the_measured_reason():
    line = comparison_line(_report([0.9, 1.0, 1.1, 1.0], [1.5, 1.6, 1.4, 1.5]), steps=100)
    assert line.startswith("DFlash leads after 100 training steps each (macro tau 2.50)")
    assert "DSpark 2.00 (ratio 1.25, 95% CI" in line  # 2.5 / 2.0
    assert f"DSpark trails: {TRAILS_WHY}" in line and "\n" not in line


def test_a_lead_is_stated_only_when_its_interval_clears_one():
    lead = comparison_line(_report([2.0, 2.1, 1.9, 2.0], [1.0, 1.1, 0.9, 1.0]), steps=300)
    assert lead.startswith("DSpark leads after 300 training steps each")
    assert "trails" not in lead
    # Higher point estimate, but the samples disagree: no order is claimed.
    mixed = comparison_line(_report([2.0, 0.2, 2.2, 0.1], [1.0, 1.2, 0.9, 1.1]), steps=100)
    assert mixed.startswith("DSpark has the highest macro tau")
    assert "not told apart from DFlash" in mixed and "does not rank them" in mixed
    assert "leads" not in mixed


def test_a_domain_with_one_sample_is_named_as_why_there_is_no_interval():
    report = _report([1.0, 1.1], [0.5, 0.6])
    for row in report["drafts"].values():  # one sample per domain: no stratified bootstrap
        ps = row["offline_t0"]["per_sample"]
        for key in ps:
            ps[key] = ps[key][::2]
    line = comparison_line(report, steps=150)
    assert "DSpark has the highest macro tau" in line and "no interval against DFlash" in line
    assert "fewer than 2 held-out samples" in line and "leads" not in line


def test_the_leader_of_three_drafts_is_named_with_a_ratio_over_each():
    line = comparison_line(
        _report([1.0, 1.1, 0.9, 1.0], [0.5, 0.6, 0.4, 0.5], eagle3=[1.5, 1.6, 1.4, 1.5]),
        steps=150,
    )
    assert line.startswith("EAGLE-3 leads after 150 training steps each (macro tau 2.50) over ")
    assert "DSpark 2.00 (ratio 1.25" in line and "DFlash 1.50 (ratio 1.67" in line
    assert "DSpark trails" in line


@pytest.mark.parametrize("drop", ["DSpark", "DFlash"])
def test_no_line_without_both_drafts(drop):
    report = _report([1.0, 1.0], [1.0, 1.0])
    del report["drafts"][drop]
    assert comparison_line(report, steps=100) is None  # one row: nothing to rank


def test_the_real_demo_gives_its_own_reason_for_a_trailing_dspark():
    from pipeline.demo.real import REAL_TRAILS_WHY

    line = comparison_line(
        _report([0.9, 1.0, 1.1, 1.0], [1.5, 1.6, 1.4, 1.5]),
        steps=150,
        trails_why=REAL_TRAILS_WHY,
    )
    assert REAL_TRAILS_WHY in line and TRAILS_WHY not in line
    assert "after 150 training steps each" in line
