"""Drafts written before training and evaluation were restructured still load and draft
the same tokens (tests/fixtures/drafts_v0, made by its make.py on the old code).

Each kind (dspark in the anchor layout, dflash in the fill-in layout, eagle3) loads
from its run directory (checkpoints/latest), from the checkpoint itself and from
its speculators export; T=0 blocks at every anchor, the confidence logits and one
seeded live proposal must equal what the old code drafted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from draft_specs import drafted

from pipeline.drafts.load import load_draft, make_drafter

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "drafts_v0"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture(scope="module")
def random_target():
    from pipeline.targets.resolve import resolve_model

    return resolve_model("toy:random")


@pytest.fixture(scope="module")
def sample():
    return torch.load(FIXTURE / "sample.pt", weights_only=True)


def _same(got: dict, want: dict) -> None:
    assert got["tokens"] == want["tokens"]
    assert got["live_tokens"] == want["live_tokens"]
    if want["confidence_logit"] is None:
        assert got["confidence_logit"] is None
    else:
        torch.testing.assert_close(
            torch.tensor(got["confidence_logit"]),
            torch.tensor(want["confidence_logit"]),
            atol=1e-4,
            rtol=0,
        )


@pytest.mark.parametrize("kind", ["dspark", "dflash", "eagle3"])
def test_old_checkpoints_and_exports_draft_as_before(kind, random_target, sample):
    run = FIXTURE / kind
    checkpoint = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    for where, path in (
        ("checkpoint", run),
        ("checkpoint", checkpoint),
        ("export", run / "export"),
    ):
        draft = load_draft(path, target_dir=random_target)
        assert draft.spec.kind == kind
        _same(drafted(make_drafter(kind, draft), sample), EXPECTED[kind][where])
    if kind == "dspark":
        draft = load_draft(run, target_dir=random_target)
        backbone = make_drafter(kind, draft, use_heads=False)
        _same(drafted(backbone, sample), EXPECTED[kind]["backbone"])
