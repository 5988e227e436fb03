"""Every draft kind the trainer knows has a drafter, and an unknown kind is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from draft_specs import tiny_spec

from pipeline.evaluate.drafters.load import LoadedDraft
from pipeline.evaluate.drafters.registry import DRAFTERS, make_drafter
from pipeline.train.drafts.registry import KINDS


def test_every_training_kind_has_a_drafter():
    assert set(DRAFTERS) == set(KINDS)


def test_an_unknown_kind_is_named():
    draft = LoadedDraft(None, tiny_spec(kind="medusa"), Path("somewhere"), None, None)
    with pytest.raises(ValueError, match="somewhere: no drafter for draft kind 'medusa'"):
        make_drafter("m", draft)
