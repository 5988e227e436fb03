"""Acceptance length at temperature > 0: the live loop with standard rejection sampling.

Above temperature 0 the target's output is random, so the shards' greedy
answers say nothing about which drafted tokens survive; the loop must run.
Each round the draft samples n tokens left to right from q (its own
previous sample feeds the Markov head, or EAGLE-3's next step), the target scores prompt + committed
tokens + drafted tokens in one forward pass (the committed prefix from its
KV cache, cropped to the committed length after each verdict, as a serving
engine's is), and drafted token k survives
with probability min(1, p_k(d_k) / q_k(d_k)); at the first rejection the
target's token comes from the residual norm(max(0, p_k - q_k)), and if all
survive the bonus comes from p_{n+1}. The emitted sequence is then
distributed exactly as the target's own samples (Leviathan et al. 2023;
tested statistically in tests/evaluate/test_sampling.py).

The same forward pass yields the target's features of every committed
position, which the next round's draft reads as context. Features are
rounded to the dtype the shards store (bf16), as the draft saw in training.
Temperature 0 is the same loop with argmax on both sides; its tau must equal
the offline walk's on the same trajectory. `live_report` runs the loop over
prompts and reports tau per domain, in the offline walk's report format.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from pipeline.drafts.drafter import Drafter
    from pipeline.shards.reader import TrainingSample

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 60.0


@dataclass
class Verdict:
    """Result of verifying one batch of drafted blocks (N blocks, n slots)."""

    accepted: torch.Tensor  # (N,) int64 drafted tokens kept
    next_token: torch.Tensor  # (N,) int64 the target's token after them (correction or bonus)


def rejection_sample(
    *,
    draft_tokens: torch.Tensor,  # (N, n) int64 tokens the draft sampled
    draft_probs: torch.Tensor,  # (N, n, V) q_k: the distribution each token was sampled from
    target_probs: torch.Tensor,  # (N, n+1, V) p_k given the drafted prefix; row n = bonus
    generator: torch.Generator | None = None,
) -> Verdict:
    """Standard speculative rejection sampling; the output is distributed as the target's."""
    import torch

    n = draft_tokens.shape[1]
    idx = draft_tokens[..., None]
    p = target_probs[:, :n].gather(-1, idx).squeeze(-1)  # (N, n)
    q = draft_probs.gather(-1, idx).squeeze(-1)  # (N, n)
    u = torch.rand(p.shape, generator=generator, dtype=p.dtype)
    keep = u * q < p  # u < p/q without dividing (q > 0: the draft sampled the token)
    accepted = torch.cumprod(keep.long(), dim=-1).sum(-1)  # (N,)
    rows = torch.arange(draft_tokens.shape[0])
    p_at = target_probs[rows, accepted]  # (N, V): p at the first rejection, or the bonus row
    q_at = torch.zeros_like(p_at)
    rejected = accepted < n
    q_at[rejected] = draft_probs[rows[rejected], accepted[rejected]]
    residual = (p_at - q_at).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    # p == q leaves no residual mass; a rejection then has probability 0, so fall back to p.
    dist = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_at)
    next_token = torch.multinomial(dist, 1, generator=generator).squeeze(-1)
    return Verdict(accepted=accepted, next_token=next_token)


class HFVerifier:
    """The target as the live loop needs it: probabilities and captured features of a sequence.

    Wraps the reference backend (`pipeline.targets.hf_backend.HFTarget`); aux
    ids follow the capture convention (HF `hidden_states[k]`, k < L).
    """

    def __init__(self, model_dir: str, aux_layer_ids: Sequence[int], dtype: str = "float32"):
        from pipeline.targets.config import TargetConfig
        from pipeline.targets.hf_backend import HFTarget

        self.target = HFTarget(
            TargetConfig(
                model=str(model_dir), backend="hf", dtype=dtype, aux_layer_ids=list(aux_layer_ids)
            ),
            str(model_dir),
        )
        self.aux_layer_ids = tuple(aux_layer_ids)
        self.eos_ids = self.target.eos_ids

    def reading(self, aux_layer_ids: Sequence[int]) -> HFVerifier:
        """This verifier (the same loaded target) handing out the features of
        `aux_layer_ids`: each draft gets the layers it was trained on."""
        view = copy.copy(self)
        view.aux_layer_ids = tuple(aux_layer_ids)
        return view

    def new_cache(self):
        """An empty KV cache for `forward`: one per decoded sequence."""
        from transformers import DynamicCache

        return DynamicCache(config=self.target.model.config)

    def forward(self, ids: list[int], cache=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (T, V) fp32, features (T, k*H)) of the positions of `ids` that `cache`
        does not hold yet (every position without a cache); `cache` then holds all of them.

        A cache turns a round's cost from the whole sequence into the drafted block:
        on a 30-layer target with a 49k vocabulary the full pass is ~100x the work.
        """
        import torch

        start = cache.get_seq_length() if cache is not None else 0
        with torch.no_grad():
            out = self.target.model(
                input_ids=torch.tensor([ids[start:]]),
                past_key_values=cache,
                use_cache=cache is not None,
                output_hidden_states=True,
            )
        feats = torch.cat([out.hidden_states[k][0] for k in self.aux_layer_ids], dim=-1)
        return out.logits[0].float(), feats


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    import torch

    if temperature <= 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


@dataclass
class LiveRun:
    """One prompt decoded speculatively."""

    output: list[int]  # generated tokens
    accepted: list[int]  # accepted drafted tokens per round
    finish_reason: str  # "stop" | "length"
    # (n,) confidence logits of each round's drafted tokens (a confidence head only)
    confidence: list[torch.Tensor] = field(default_factory=list)


def live_decode(
    *,
    drafter: Drafter,
    verifier: HFVerifier,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    feature_dtype: str = "bfloat16",
) -> LiveRun:
    """Speculative decoding of one prompt (see the module docstring)."""
    import torch

    fdt = getattr(torch, feature_dtype)
    n = drafter.num_draft_tokens
    cache = verifier.new_cache()
    logits, feats = verifier.forward(prompt, cache)
    first = torch.multinomial(_probs(logits[-1:], temperature), 1, generator=generator)
    seq = list(prompt) + [int(first)]
    # Invariant: `cache` and `features` hold every committed position but the anchor
    # (the last token of `seq`), so a round feeds the anchor and the drafted block.
    features = feats.to(fdt)
    output, accepted_log, confidence_log = [int(first)], [], []
    while output[-1] not in verifier.eos_ids and len(output) < max_new_tokens:
        ctx = torch.cat([features, features.new_zeros(1, features.shape[1])])
        blocks = drafter.propose(
            torch.tensor(seq), ctx, temperature=temperature, generator=generator
        )
        drafted = blocks.tokens[0].tolist()
        logits, feats = verifier.forward(seq + drafted, cache)  # positions anchor .. anchor+n
        p = _probs(logits[: n + 1], temperature)[None]  # (1, n+1, V)
        q = (
            blocks.probs
            if blocks.probs is not None
            else torch.nn.functional.one_hot(blocks.tokens, p.shape[-1]).float()
        )
        verdict = rejection_sample(
            draft_tokens=blocks.tokens, draft_probs=q, target_probs=p, generator=generator
        )
        acc = int(verdict.accepted[0])
        new = drafted[:acc] + [int(verdict.next_token[0])]
        accepted_log.append(acc)
        if blocks.confidence_logit is not None:
            confidence_log.append(blocks.confidence_logit[0].detach())
        # Stop at end of turn or the token limit, as a serving engine truncates its output.
        for tok in new:
            seq.append(tok)
            output.append(tok)
            if tok in verifier.eos_ids or len(output) >= max_new_tokens:
                break
        features = torch.cat([features, feats[: acc + 1].to(fdt)])[: len(seq) - 1]
        if (rejected := cache.get_seq_length() - (len(seq) - 1)) > 0:
            cache.crop(-rejected)  # drop the rejected drafted positions
    finish = "stop" if output[-1] in verifier.eos_ids else "length"
    return LiveRun(output, accepted_log, finish, confidence_log)


def live_calibration_events(
    *,
    drafter: Drafter,
    verifier: HFVerifier,
    samples: Sequence[TrainingSample],
    temperature: float,
    max_new_tokens: int,
    seed: int,
):
    """calibration.Events of the live loop at `temperature` over the prompts of `samples`:
    every round's confidence logits against its rejection-sampling verdicts."""
    import torch

    from pipeline.evaluate.calibration import round_events

    rounds = []
    generator = torch.Generator().manual_seed(seed)
    for s in samples:
        run = live_decode(
            drafter=drafter,
            verifier=verifier,
            prompt=s.input_ids[: s.num_prompt_tokens].tolist(),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generator=generator,
        )
        rounds.extend(zip(run.confidence, run.accepted, strict=True))
    return round_events(rounds, drafter.num_draft_tokens)


def live_report(
    *,
    drafter: Drafter,
    verifier: HFVerifier,
    samples: Sequence[TrainingSample],
    temperature: float,
    max_new_tokens: int,
    seed: int,
    samples_per_prompt: int = 1,
) -> dict:
    """tau of the live loop per domain at `temperature` over the prompts of `samples`.

    Each prompt is decoded `samples_per_prompt` times (fresh draws; run `r` of
    sample `s` is recorded as `s#r`), so the bootstrap pairs the same runs
    across drafts."""
    import torch

    from pipeline.evaluate.offline import AcceptanceReport, tau
    from pipeline.evaluate.uncertainty import PerSample, macro_tau_interval

    accepted: dict[str, list[int]] = {}
    runs = PerSample([], [], [], [])
    generator = torch.Generator().manual_seed(seed)
    shown = time.monotonic()
    for i, s in enumerate(samples):
        if time.monotonic() - shown > PROGRESS_EVERY_S:  # a long loop shows it is moving
            log.info("live T=%s decoding prompt %d/%d", temperature, i + 1, len(samples))
            shown = time.monotonic()
        for r in range(samples_per_prompt):
            run = live_decode(
                drafter=drafter,
                verifier=verifier,
                prompt=s.input_ids[: s.num_prompt_tokens].tolist(),
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                generator=generator,
            )
            accepted.setdefault(s.domain, []).extend(run.accepted)
            runs.ids.append(f"{s.sample_id}#{r}")
            runs.domain.append(s.domain)
            runs.accepted.append(sum(run.accepted))
            runs.rounds.append(len(run.accepted))
    taus = {d: tau(accepted=torch.tensor(v)) for d, v in sorted(accepted.items()) if v}
    every = torch.tensor([a for v in accepted.values() for a in v])
    return AcceptanceReport(
        num_draft_tokens=drafter.num_draft_tokens,
        tau=tau(accepted=every),
        tau_macro=sum(taus.values()) / len(taus) if taus else float("nan"),
        tau_full_rounds=float("nan"),
        tau_by_domain=taus,
        rounds_by_domain={d: len(v) for d, v in sorted(accepted.items())},
        position_acceptance=[],
        position_counts=[],
        num_rounds=int(every.numel()),
        num_samples=len(samples),
        per_sample=runs,
        tau_macro_ci95=macro_tau_interval(runs),
        extra={"samples_per_prompt": samples_per_prompt},
    ).to_dict()
