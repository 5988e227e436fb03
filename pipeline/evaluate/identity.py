"""The T=0 identity check of speculative serving: with and without a draft, the same output.

Speculative decoding is lossless at temperature 0 in exact arithmetic, but a
bf16 verification pass computes several positions at once and can flip a
near-tie of the target's logits, after which the two outputs go their own
(equally valid) ways. So a difference alone proves nothing; where it starts
does. At the first divergent position the target's logits are recomputed in
fp32 by transformers over the shared prefix: if both tokens are within
`tolerance` of the best logit there, it is a near-tie flip; otherwise the
draft changed what the target would say, and `check_identity` raises
`IdentityMismatch` naming the prompt, the position and both tokens.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.errors import PipelineError

STOPPED = -1  # the token of an output that ended without an EOS where the other went on


class IdentityMismatch(PipelineError):
    """A draft changed the target's greedy output beyond a near-tie flip (the CLI
    prints the message and exits 1; the report is written first)."""


@dataclass(frozen=True)
class Divergence:
    prompt_index: int
    position: int  # index into the generated tokens
    plain_token: int
    draft_token: int
    top_token: int  # the target's fp32 argmax after the shared prefix
    gap: float  # best logit minus the lower of the two tokens' logits (fp32)
    near_tie: bool


@dataclass
class IdentityReport:
    num_prompts: int
    num_identical: int
    tolerance: float
    divergences: list[Divergence]

    @property
    def ok(self) -> bool:
        return all(d.near_tie for d in self.divergences)

    def to_dict(self) -> dict:
        return {
            "num_prompts": self.num_prompts,
            "num_identical": self.num_identical,
            "num_near_tie_flips": sum(d.near_tie for d in self.divergences),
            "num_real_divergences": sum(not d.near_tie for d in self.divergences),
            "tolerance": self.tolerance,
            "ok": self.ok,
            "divergences": [{**asdict(d), "gap": round(d.gap, 4)} for d in self.divergences],
        }

    def message(self, draft: str) -> str:
        bad = [d for d in self.divergences if not d.near_tie]
        lines = [
            f"the draft {draft!r} changed the target's greedy output on {len(bad)} of "
            f"{self.num_prompts} prompts (beyond near-ties of {self.tolerance} logits):"
        ]
        for d in bad:
            where = f"  prompt {d.prompt_index}, generated token {d.position}: "
            if not math.isfinite(d.gap):
                lines.append(where + "one output stopped without an EOS where the other went on")
                continue
            lines.append(
                where + f"plain {d.plain_token}, with draft {d.draft_token}; the target's fp32 "
                f"argmax is {d.top_token} and the farther token is {d.gap:.3f} logits below it"
            )
        return "\n".join(lines)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first generated token where `a` and `b` differ; None if one is a prefix
    of the other (a length difference alone is an early stop, checked by the caller)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None


class TargetLogits:
    """The target's next-token logits in fp32 (transformers), loaded once on first use."""

    def __init__(self, target_dir: str | Path):
        self.target_dir = str(target_dir)
        self._model = None

    def __call__(self, tokens: list[int]):
        import torch

        if self._model is None:
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(
                self.target_dir, dtype=torch.float32
            ).eval()
        with torch.no_grad():
            out = self._model(torch.tensor([tokens]), use_cache=False)
        return out.logits[0, -1].float()  # (V,)


def check_identity(
    *,
    prompts: list[list[int]],
    plain: list[list[int]],
    drafted: list[list[int]],
    logits: TargetLogits,
    tolerance: float,
    eos_token_ids: tuple[int, ...] = (),
) -> IdentityReport:
    """Compare greedy outputs without (`plain`) and with a draft (`drafted`), prompt by
    prompt (module docstring). A length difference without a differing token counts
    as a divergence at the shorter end unless the shorter output ended on an EOS token."""
    divergences = []
    identical = 0
    for i, (prompt, a, b) in enumerate(zip(prompts, plain, drafted, strict=True)):
        if a == b:
            identical += 1
            continue
        pos = first_divergence(a, b)
        if pos is None:  # one output stopped where the other went on
            shorter = a if len(a) < len(b) else b
            if shorter and shorter[-1] in eos_token_ids:
                identical += 1  # it stopped on an EOS token the other also produced
                continue
            pos = len(shorter)
            row = logits(list(prompt) + list(a[:pos]))
            x = a[pos] if pos < len(a) else STOPPED
            y = b[pos] if pos < len(b) else STOPPED
            divergences.append(Divergence(i, pos, x, y, int(row.argmax()), float("inf"), False))
            continue
        row = logits(list(prompt) + list(a[:pos]))
        top = int(row.argmax())
        gap = float(row[top] - min(row[a[pos]], row[b[pos]]))
        divergences.append(Divergence(i, pos, a[pos], b[pos], top, gap, gap < tolerance))
    return IdentityReport(len(prompts), identical, tolerance, divergences)


def require_identity(report: IdentityReport, draft: str) -> None:
    """Raise `IdentityMismatch` (its message names each real divergence) unless `report` is ok."""
    if not report.ok:
        raise IdentityMismatch(report.message(draft))
