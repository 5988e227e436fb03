"""Adaptive drafting: how many drafted tokens each request sends for verification.

One number sets it (`ADAPTIVE_ENV`, `serving.adaptive_requests`): the requests
in flight at which verifying one more token costs as much as generating one.
Each round every request sends only the longest prefix of its block whose
chance of being accepted whole is at least `requests in flight / that number`
(`prefix_lengths`), so from that many requests on nothing is sent. The chance
is the DSpark confidence head's, or the running per-position acceptance rate
(`AcceptanceRate`) of the rounds vLLM verified. vLLM's own batch-size
schedule (`adaptive_schedule`) asks the drafter for the tokens worth drafting
by the same rule at the prior chance, so a busy engine drafts fewer tokens
and, where nothing would be sent, none (the drafter then runs only the pass
that keeps its KV cache). The project's vLLM plugin applies the rule inside the
engine twice a round (vllm_adaptive.py): before drafting, the tokens the
drafter makes at this many requests (`worth_drafting` at the live acceptance
rates in place of the schedule's prior, so the cap follows the traffic), and
after, the prefix each request sends.
"""

from __future__ import annotations

import os

ADAPTIVE_ENV = "DSPARK_TARGETS_ADAPTIVE_REQUESTS"
# The chance a drafted token is accepted before any round was verified: the
# `AcceptanceRate` prior, and the chance vLLM's schedule is drawn for.
PRIOR_CHANCE = 0.5
# What drafting a token costs beside verifying it, in verifications: the plugin
# weighs only verification (the drafting is paid when it chooses), vLLM's schedule
# both (it chooses before drafting).
DRAFTING_COST = 1.0


def adaptive_requests() -> float | None:
    """`ADAPTIVE_ENV` as a number (None: unset, adaptive drafting off)."""
    raw = os.environ.get(ADAPTIVE_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ValueError(f"{ADAPTIVE_ENV}={raw!r}: give the number of requests in flight (> 0)")
    return value


class AcceptanceRate:
    """Running conditional acceptance per drafted position (the chance position k is
    accepted once the positions before it were), from the rounds vLLM verified. It
    starts at `PRIOR_CHANCE`, and every drafting round its evidence fades toward that
    prior by `decay`, so a position it stopped sending is tried again later."""

    def __init__(self, k: int, decay: float = 0.98) -> None:
        self.tried = [2.0] * k
        self.hits = [2.0 * PRIOR_CHANCE] * k
        self.decay = decay

    def update(self, sent: int, accepted: int) -> None:
        """One verified round: `sent` tokens drafted, the first `accepted` of them kept."""
        for pos in range(min(accepted + 1, sent, len(self.tried))):
            self.tried[pos] += 1
            self.hits[pos] += pos < accepted

    def fade(self) -> None:
        """One drafting round passed: old evidence weighs `decay` as much."""
        d = self.decay
        self.tried = [d * t + (1 - d) * 2.0 for t in self.tried]
        self.hits = [d * h + (1 - d) * 2.0 * PRIOR_CHANCE for h in self.hits]

    def rates(self) -> list[float]:
        return [h / t for h, t in zip(self.hits, self.tried, strict=True)]


def worth_drafting(chance: list[float], requests: int, saturation: float) -> int:
    """Tokens worth drafting per request at `requests` in flight, position k accepted with
    `chance[k]` once those before it were: the rule's prefix with a token costing its
    drafting as well as its verification (`DRAFTING_COST`: this is decided before
    drafting), at most `len(chance)`."""
    return prefix_lengths([chance], requests * (1 + DRAFTING_COST), saturation)[0]


def adaptive_schedule(saturation: float, num_speculative_tokens: int) -> list[list[int]]:
    """vLLM's own batch-size schedule (`num_speculative_tokens_per_batch_size`) for the
    same rule at the prior chance, a token costing its drafting too (`DRAFTING_COST`):
    at each number of requests in flight vLLM asks the drafter only for the tokens worth
    drafting and sending at that chance (fewer as the load grows: EAGLE-3 runs fewer
    passes, DFlash/DSpark fill fewer block slots), none from where even one is not (the
    drafter then runs only the pass that keeps its KV cache); the plugin trims each
    request's block further by its own chance, weighing verification only. Ranges of
    equal K, the last carried on by vLLM to its largest batch."""
    k = num_speculative_tokens
    out: list[list[int]] = []
    requests = 1
    while True:
        n = worth_drafting([PRIOR_CHANCE] * k, requests, saturation)
        if out and out[-1][2] == n:
            out[-1][1] = requests
        else:
            out.append([requests, requests, n])
        if n == 0:
            return out
        requests += 1


def prefix_lengths(chance: list[list[float]], requests: float, saturation: float) -> list[int]:
    """Per request, the drafted tokens to send: the longest prefix whose chance of being
    accepted whole is at least `requests / saturation` (so none from `saturation`
    requests in flight on, where a verified token costs a generated one's compute)."""
    threshold = requests / saturation
    out = []
    for row in chance:
        whole, n = 1.0, 0
        for c in row:
            whole *= c
            if whole < threshold:
                break
            n += 1
        out.append(n)
    return out
