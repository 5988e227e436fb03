"""The vLLM plugin's version pin and its refusals (serving itself: tests/drafts/test_export.py,
where the plugin serves a DSpark export with its heads in CPU vLLM)."""

from __future__ import annotations

import logging

import pytest

from pipeline.drafts import vllm_plugin
from pipeline.drafts.vllm_plugin import SUPPORTED_VLLM, require_support, supports


def test_the_pin_is_the_installed_vllm():
    import vllm

    assert supports(vllm.__version__) and vllm.__version__ in SUPPORTED_VLLM
    assert supports("0.32.0+cpu")  # a local build tag changes nothing
    assert not supports("0.33.0") and not supports(None)


def test_an_unknown_vllm_is_refused_in_one_line():
    with pytest.raises(RuntimeError) as err:
        require_support("0.99.1")
    message = str(err.value)
    assert "\n" not in message and "0.99.1" in message and "0.32.0" in message


def test_on_an_unknown_vllm_the_plugin_patches_nothing(monkeypatch, caplog):
    import vllm
    from vllm.v1.spec_decode.dflash import DFlashProposer

    before = DFlashProposer.__dict__.get("_sample_draft_tokens")
    monkeypatch.setattr(vllm, "__version__", "0.99.1")
    with caplog.at_level(logging.WARNING, logger=vllm_plugin.__name__):
        assert vllm_plugin.register() is False
    assert DFlashProposer.__dict__.get("_sample_draft_tokens") is before
    lines = [r.getMessage() for r in caplog.records if r.name == vllm_plugin.__name__]
    assert len(lines) == 1 and "0.99.1" in lines[0] and "DFlash backbone" in lines[0]


def test_heads_on_an_unknown_vllm_are_refused(monkeypatch, tmp_path):
    import json

    import vllm

    (tmp_path / "config.json").write_text(json.dumps({"dspark_heads": {"file": "h"}}))
    monkeypatch.setattr(vllm, "__version__", "0.99.1")
    with pytest.raises(RuntimeError, match="not 0.99.1"):
        vllm_plugin.ServedHeads.from_draft_dir(str(tmp_path), d2t=None, device="cpu", dtype=None)


def test_registering_twice_patches_once():
    from vllm.v1.spec_decode.dflash import DFlashProposer

    assert vllm_plugin.register() is True
    patched = DFlashProposer._sample_draft_tokens
    assert vllm_plugin.register() is True
    assert DFlashProposer._sample_draft_tokens is patched
