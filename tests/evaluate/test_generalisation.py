"""Held-out split against a source left out of training: the table, and the guard that
no evaluated sample of the left-out source was trained on."""

from __future__ import annotations

import pytest

from pipeline.evaluate.config import EvalConfig, parse_eval_config
from pipeline.evaluate.generalisation import generalisation, generalisation_table
from pipeline.evaluate.heldout import _check_left_out


def _row(prefix: str, domains: list[str], accepted: int, n: int = 12) -> dict:
    per = {
        "ids": [f"{prefix}{i}" for i in range(n)],
        "domain": [domains[i % len(domains)] for i in range(n)],
        "accepted": [accepted + i % 2 for i in range(n)],
        "rounds": [4] * n,
    }
    taus = {}
    for d in domains:
        rows = [i for i in range(n) if per["domain"][i] == d]
        taus[d] = 1 + sum(per["accepted"][i] for i in rows) / (4 * len(rows))
    return {"offline_t0": {"tau_macro": sum(taus.values()) / len(taus), "per_sample": per}}


def test_each_draft_gets_both_taus_and_their_ratio():
    heldout = {"drafts": {"A": _row("h", ["chat", "code"], 6), "B": _row("h", ["chat", "code"], 4)}}
    left_out = {"drafts": {"A": _row("o", ["qa"], 3), "B": _row("o", ["qa"], 4)}}
    figures = generalisation(heldout, left_out)
    assert set(figures) == {"A", "B"}
    a, b = figures["A"], figures["B"]
    assert a["ratio"][0] == pytest.approx(a["left_out"][0] / a["heldout"][0])
    assert a["ratio"][0] < 0.8 < b["ratio"][0]  # A learned its corpus, B the target
    table = generalisation_table(figures, ["truthfulqa"])
    assert "left-out source (truthfulqa)" in table and table.count("\n") == 4


def _config(split: str) -> EvalConfig:
    return parse_eval_config(
        {
            "target": "toy:trained",
            "out_dir": "x",
            "drafts": [{"name": "a", "path": "p"}],
            "data": {"sources": ["qa"], "split": split},
        },
        "test",
    )


def test_split_all_is_refused_unless_every_draft_left_the_source_out():
    config = _config("all")
    _check_left_out(config, {"a": {"data": {"exclude_sources": ["qa", "other"]}}})
    with pytest.raises(ValueError, match=r"draft 'b' trained on \['qa'\]"):
        _check_left_out(
            config,
            {"a": {"data": {"exclude_sources": ["qa"]}}, "b": {"data": {"exclude_sources": []}}},
        )
    with pytest.raises(ValueError, match="name the source"):
        parse_eval_config(
            {"target": "t", "out_dir": "x", "drafts": [], "data": {"split": "all"}}, "test"
        )
