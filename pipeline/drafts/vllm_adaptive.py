"""Adaptive drafting inside vLLM's model runner: the project's vLLM plugin applies it.

The rule and its one setting live in pipeline/drafts/adaptive.py. Here, each
round the model runner asks the drafter for the tokens worth drafting at this
many requests at the running acceptance rates of the rounds vLLM verified;
where that is none, the round skips the drafter altogether (no drafting cost),
and the requests of that batch draft no more. After drafting, the scheduler
gets only the prefix of each request's block the rule keeps, by the DSpark
confidence head's chance (a draft with one) or the rates.

A step that verifies no drafted token (every request's block trimmed to
nothing, or skipped) is then a plain decoding step, and it is run as one: the
target's tokens come from vLLM's plain sampler instead of its rejection sampler
(which, even with nothing to verify, copies the logits and, for a request that
samples, draws a vocabulary-sized recovery distribution), and the engine core
gets no draft lists to apply after a skipped round. Greedy and seeded requests
get the same tokens either way; an unseeded sampled one the same distribution.
It needs vLLM's synchronous scheduling (the CPU build's); with asynchronous
scheduling vLLM is left as it is.
"""

from __future__ import annotations

from pipeline.drafts.adaptive import (
    AcceptanceRate,
    adaptive_requests,
    prefix_lengths,
    worth_drafting,
)


def _rate(drafter) -> AcceptanceRate:
    """The drafter's running acceptance rate per position (made on first use)."""
    most = drafter.speculative_config.num_speculative_tokens
    return drafter.__dict__.setdefault("_dspark_rate", AcceptanceRate(most))


def _live_cap(drafter, num_requests: int, saturation: float) -> int:
    """Before a round: the tokens worth drafting at this many requests at the acceptance
    rates the traffic shows (in place of vLLM's schedule, drawn at the prior chance)."""
    rate = _rate(drafter)
    rate.fade()
    return worth_drafting(rate.rates(), num_requests, saturation)


def _send_lengths(drafter, num_requests: int, saturation: float) -> list[int]:
    """The prefix each request of the latest round sends (its confidence or the rates)."""
    k = drafter.num_speculative_tokens  # this round's (the cap may draft fewer)
    rate = _rate(drafter)
    confidence = getattr(drafter, "_dspark_confidence", None)
    if confidence is not None and confidence.shape[0] >= num_requests:
        chance = confidence[:num_requests].tolist()
    else:
        chance = [rate.rates()[:k]] * num_requests
    return prefix_lengths(chance, num_requests, saturation)


def _patch_base(cls) -> None:
    """Every proposer: remember the batch's request ids and feed back what vLLM accepted."""
    prepare_padded = cls.prepare_next_token_ids_padded
    prepare_cpu = cls.prepare_next_token_ids_cpu

    def feed_back(self, req_ids: list[str], accepted: list[int]) -> None:
        sent = getattr(self, "_dspark_sent", None)
        rate = getattr(self, "_dspark_rate", None)
        if not sent or rate is None:
            return
        for rid, n in zip(req_ids, accepted, strict=False):
            if sent.get(rid) and n >= 0:
                rate.update(sent[rid], n)

    def padded(self, sampled, requests, batch, discard_mask):
        self._dspark_req_ids = list(batch.req_ids)
        next_ids, counts = prepare_padded(self, sampled, requests, batch, discard_mask)
        feed_back(self, self._dspark_req_ids, [c - 1 for c in counts.tolist()])
        return next_ids, counts

    def on_cpu(self, sampled, requests, batch, num_scheduled):
        self._dspark_req_ids = list(batch.req_ids)
        feed_back(self, self._dspark_req_ids, [len(t) - 1 for t in sampled])
        return prepare_cpu(self, sampled, requests, batch, num_scheduled)

    cls.prepare_next_token_ids_padded = padded
    cls.prepare_next_token_ids_cpu = on_cpu


def _holes(drafter, req_ids: list[str]) -> set[str]:
    """The batch's requests whose drafter KV cache misses a round (pruned to the batch)."""
    holes = drafter.__dict__.setdefault("_dspark_holes", set())
    holes.intersection_update(req_ids)
    return holes


def _feed_back(runner, drafter, scheduler_output, sampled_token_ids) -> None:
    """vLLM's pass over the batch that reads which drafted tokens were accepted (the
    patched proposer base feeds them to the rates)."""
    import torch

    if torch.is_tensor(sampled_token_ids):  # vLLM's padded drafter batch (the default)
        drafter.prepare_next_token_ids_padded(
            sampled_token_ids, runner.requests, runner.input_batch, runner.discard_request_mask.gpu
        )
    else:
        drafter.prepare_next_token_ids_cpu(
            sampled_token_ids,
            runner.requests,
            runner.input_batch,
            scheduler_output.num_scheduled_tokens,
        )


def _skip_round(runner, drafter, scheduler_output, sampled_token_ids, req_ids: list[str]):
    """A round where nothing is drafted, without the drafter's cost: its passes
    (even the one that keeps its KV cache) skipped, the verdict of the drafts verified in
    this step (if any) still fed to the rates; the batch's requests never send drafts
    again (their drafter cache now has a hole, and drafting over it would only lower the
    rates the others earn)."""
    import torch

    if scheduler_output.scheduled_spec_decode_tokens:  # a verdict to feed back
        _feed_back(runner, drafter, scheduler_output, sampled_token_ids)
    _holes(drafter, req_ids).update(req_ids)
    drafter._dspark_skipped = True
    return torch.empty(len(req_ids), 0, dtype=torch.int64, device=runner.device)


def _patch_runner(cls) -> None:
    """Adaptive drafting in the model runner: before a round the drafter is asked for the
    tokens worth drafting at the live rates (none: the round is skipped), after it the
    scheduler gets each request's chosen prefix."""
    take = cls._get_draft_token_ids_cpu
    propose = cls.propose_draft_token_ids

    def capped(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        saturation = adaptive_requests()
        drafter = getattr(self, "drafter", None)
        if saturation is None or drafter is None or self.use_async_scheduling:
            return propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        req_ids = list(self.input_batch.req_ids)
        requests = len(scheduler_output.num_scheduled_tokens)  # vLLM's schedule's count
        fresh = len(req_ids) > len(_holes(drafter, req_ids))
        cap = _live_cap(drafter, requests, saturation) if fresh else 0
        scheduler_output.num_spec_tokens_to_schedule = cap
        drafter._dspark_skipped = False
        if cap == 0:
            return _skip_round(self, drafter, scheduler_output, sampled_token_ids, req_ids)
        return propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)

    def trimmed(self):
        drafts, req_ids = take(self)
        saturation = adaptive_requests()
        drafter = getattr(self, "drafter", None)
        if saturation is None or drafter is None or not drafts or self.use_async_scheduling:
            return drafts, req_ids
        keep = _send_lengths(drafter, len(req_ids), saturation)
        holes = _holes(drafter, list(req_ids))
        keep = [0 if rid in holes else n for rid, n in zip(req_ids, keep, strict=False)]
        drafts = [list(d[:n]) for d, n in zip(drafts, keep, strict=False)]
        drafter._dspark_sent = {rid: len(d) for rid, d in zip(req_ids, drafts, strict=False)}
        return drafts, req_ids

    cls._get_draft_token_ids_cpu = trimmed
    cls.propose_draft_token_ids = capped


def _patch_plain_steps(cls) -> None:
    """A step with no drafted token to verify samples as plain decoding does, and a
    skipped round hands the engine core no draft lists (the module docstring)."""
    sample = cls._sample
    take = cls.take_draft_token_ids

    def plain_when_undrafted(self, logits, spec_decode_metadata):
        if (
            spec_decode_metadata is not None
            and spec_decode_metadata.max_spec_len == 0
            and adaptive_requests() is not None
            and not self.use_async_scheduling
        ):
            spec_decode_metadata = None  # this call's sampler only; the step's stays
        return sample(self, logits, spec_decode_metadata)

    def nothing_after_a_skip(self):
        drafter = getattr(self, "drafter", None)
        if getattr(drafter, "_dspark_skipped", False) and not self.use_async_scheduling:
            self._draft_token_req_ids = None
            drafter._dspark_sent = {}  # nothing sent: no verdict to count next step
            return None
        return take(self)

    cls._sample = plain_when_undrafted
    cls.take_draft_token_ids = nothing_after_a_skip


def patch_adaptive(proposer_base, runner) -> None:
    """Patch vLLM's proposer base class and model runner class (once per process: the
    plugin's `register` guards it)."""
    _patch_base(proposer_base)
    _patch_runner(runner)
    _patch_plain_steps(runner)
