"""Adaptive drafting's bookkeeping in vLLM's model runner (pipeline/drafts/vllm_adaptive.py).

The runner and drafter here are stand-ins with the few attributes the patches
read: what is checked is which of vLLM's paths a round takes. That a served
engine's outputs stay plain decoding's with rounds trimmed and skipped is
tests/drafts/test_export.py's (a real CPU vLLM engine).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.drafts import vllm_adaptive
from pipeline.drafts.adaptive import ADAPTIVE_ENV


def test_requests_whose_drafter_missed_a_round_are_remembered_while_they_run():
    """A skipped round leaves a hole in its requests' drafter KV cache: they are kept
    from sending drafts for as long as they are in the batch, and forgotten after."""
    drafter = SimpleNamespace()
    vllm_adaptive._holes(drafter, ["a", "b"]).update(["a", "b"])
    assert vllm_adaptive._holes(drafter, ["a", "b", "c"]) == {"a", "b"}
    assert vllm_adaptive._holes(drafter, ["b", "c"]) == {"b"}  # a finished; c is fresh
    assert vllm_adaptive._holes(drafter, ["a", "c"]) == set()  # an id back is a new request


class _Runner:
    """vLLM's model runner as far as the plain-step patch sees it."""

    use_async_scheduling = False

    def __init__(self):
        self.drafter = SimpleNamespace(_dspark_skipped=False, _dspark_sent={"a": 2})
        self._draft_token_req_ids = ["a"]
        self.calls = []

    def _sample(self, logits, spec_decode_metadata):
        self.calls.append("rejection" if spec_decode_metadata is not None else "plain")

    def take_draft_token_ids(self):
        return "drafts"


@pytest.fixture
def runner(monkeypatch):
    class Patched(_Runner):
        pass

    vllm_adaptive._patch_plain_steps(Patched)
    monkeypatch.setenv(ADAPTIVE_ENV, "16")
    return Patched()


def test_a_step_with_nothing_to_verify_samples_as_plain_decoding(runner, monkeypatch):
    nothing, some = SimpleNamespace(max_spec_len=0), SimpleNamespace(max_spec_len=2)
    runner._sample(None, nothing)
    runner._sample(None, some)
    runner._sample(None, None)
    assert runner.calls == ["plain", "rejection", "plain"]
    runner.use_async_scheduling = True  # vLLM's own path where the patch does not apply
    runner._sample(None, nothing)
    monkeypatch.delenv(ADAPTIVE_ENV)  # adaptive drafting off: vLLM's own path
    runner.use_async_scheduling = False
    runner._sample(None, nothing)
    assert runner.calls[3:] == ["rejection", "rejection"]


def test_a_skipped_round_hands_the_engine_no_drafts_and_no_stale_sends(runner):
    assert runner.take_draft_token_ids() == "drafts"
    runner.drafter._dspark_skipped = True
    assert runner.take_draft_token_ids() is None
    assert runner._draft_token_req_ids is None
    # The next step verifies nothing of this round: no earlier send may be counted then.
    assert runner.drafter._dspark_sent == {}


class _Drafter:
    def __init__(self):
        self.fed = []

    def prepare_next_token_ids_padded(self, *args):
        self.fed.append("padded")

    def prepare_next_token_ids_cpu(self, *args):
        self.fed.append("cpu")


def test_a_skipped_round_feeds_back_only_drafts_it_verified():
    import torch

    runner = SimpleNamespace(
        requests={},
        input_batch=None,
        discard_request_mask=SimpleNamespace(gpu=None),
        device="cpu",
    )
    drafter = _Drafter()
    verified = SimpleNamespace(scheduled_spec_decode_tokens={"a": [5, 6]})
    none = SimpleNamespace(scheduled_spec_decode_tokens={})
    sampled = torch.zeros(2, 1, dtype=torch.int64)
    out = vllm_adaptive._skip_round(runner, drafter, verified, sampled, ["a", "b"])
    assert drafter.fed == ["padded"] and tuple(out.shape) == (2, 0)
    vllm_adaptive._skip_round(runner, drafter, none, sampled, ["a", "b"])
    assert drafter.fed == ["padded"]  # nothing verified: no pass over the batch
    assert drafter._dspark_skipped and vllm_adaptive._holes(drafter, ["a", "b"]) == {"a", "b"}
