"""Confidence-head calibration (ECE, AUC per position), temperature scaling, truncation.

DSpark's confidence head predicts, for each drafted position k, whether the
token will be accepted given that positions 1..k-1 were. The events are
therefore conditional: at position k only blocks whose first k-1 drafted
tokens matched count, labelled 1 if token k matched too. Events come from
every anchor of the held-out trajectories (each one a round under some
truncation policy), at temperature 0. A draft served at T > 0 is calibrated
on the events of that temperature instead (`calibration.temperature`): the
live loop's rejection-sampling verdicts per drafted position, where a token
survives with probability min(1, p/q); the head's T=0 calibration does not
transfer (exact matches are rarer than sampled acceptances), so the file
records the temperature and `Calibration.load` refuses another one.

Sequential temperature scaling: one temperature per position, fitted in
position order on that position's conditional events (NLL, a 1-D convex
problem solved by golden-section search over the inverse temperature). By the
chain rule the product of calibrated conditionals is then a calibrated
probability that the whole prefix survives. The fit uses the calibration
half of the held-out split; ECE/AUC are reported on the other half, before and
after, and the temperatures are stored beside the exported draft in
`confidence_calibration.json`.

Truncation: drafting stops at the first position whose calibrated confidence
falls under a threshold; per threshold the report gives tau (fewer tokens per
round) and the verify rate (share of the block the target verifies).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.corpus.identity import unit_interval

if TYPE_CHECKING:
    import torch

    from pipeline.evaluate.offline import AnchorTable

CALIBRATION_FILE = "confidence_calibration.json"


def in_calibration_split(sample_id: str, fraction: float) -> bool:
    """Stable split of the held-out samples (a hash, independent of the train/held-out hash)."""
    return unit_interval(f"calibration:{sample_id}") < fraction


def expected_calibration_error(
    *, probs: torch.Tensor, labels: torch.Tensor, num_bins: int = 10
) -> float:
    """ECE with equal-width bins: sum_b |B|/N * |mean(p in b) - mean(y in b)|."""
    import torch

    if probs.numel() == 0:
        return math.nan
    bins = torch.clamp((probs * num_bins).long(), max=num_bins - 1)
    total = 0.0
    for b in range(num_bins):
        sel = bins == b
        if sel.any():
            gap = probs[sel].float().mean() - labels[sel].float().mean()
            total += float(sel.sum()) / probs.numel() * abs(float(gap))
    return total


def roc_auc(*, scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney, ties get average ranks); nan with one class."""
    import torch

    pos = int(labels.sum())
    neg = int(labels.numel()) - pos
    if pos == 0 or neg == 0:
        return math.nan
    order = torch.argsort(scores.double())
    sorted_scores = scores.double()[order]
    ranks = torch.empty(scores.numel(), dtype=torch.float64)
    i = 0
    while i < len(order):  # average ranks over runs of ties
        j = i
        while j + 1 < len(order) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    rank_sum = float(ranks[labels.bool()].sum())
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


def fit_temperature(*, logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature T minimising the NLL of sigmoid(logits / T); 1.0 without both classes."""
    import torch.nn.functional as F

    if logits.numel() == 0 or labels.all() or not labels.any():
        return 1.0
    z, y = logits.double(), labels.double()

    def nll(scale: float) -> float:
        return float(F.binary_cross_entropy_with_logits(z * scale, y))

    lo, hi = 1e-3, 50.0  # inverse temperature; the NLL is convex in it
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(80):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = nll(b)
    return 1.0 / ((lo + hi) / 2)


@dataclass
class Events:
    """Conditional acceptance events per drafted position (for one set of samples)."""

    logits: list[torch.Tensor]  # n tensors (M_k,) raw confidence logits at position k
    labels: list[torch.Tensor]  # n tensors (M_k,) bool: token k accepted


def conditional_events(tables: list[AnchorTable], num_draft_tokens: int) -> Events:
    """Every anchor's position-k event where positions 1..k-1 were accepted."""
    import torch

    logits: list[list[torch.Tensor]] = [[] for _ in range(num_draft_tokens)]
    labels: list[list[torch.Tensor]] = [[] for _ in range(num_draft_tokens)]
    for tab in tables:
        if tab.confidence_logit is None:
            raise ValueError("calibration needs a draft with a confidence head")
        anchors = torch.arange(tab.start, tab.end - 1)
        acc = tab.accepted[anchors]
        for k in range(num_draft_tokens):
            reached = (acc >= k) & tab.valid[anchors, k]
            logits[k].append(tab.confidence_logit[anchors[reached], k])
            labels[k].append(acc[reached] > k)
    return Events(
        [torch.cat(x) if x else torch.zeros(0) for x in logits],
        [torch.cat(x) if x else torch.zeros(0, dtype=torch.bool) for x in labels],
    )


@dataclass(frozen=True)
class Calibration:
    """Sequential temperature scaling of a confidence head, as stored beside the export."""

    temperatures: tuple[float, ...]  # (n,) one per drafted position
    num_events: tuple[int, ...]  # (n,) calibration events per position
    num_samples: int  # calibration samples
    method: str = "sequential temperature scaling (per position, conditional events)"
    # The sampling temperature of the events (what the draft serves at); files
    # written before the field existed were fitted at 0.
    sampling_temperature: float = 0.0

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., n) logits -> calibrated conditional acceptance probabilities."""
        import torch

        return torch.sigmoid(logits / torch.tensor(self.temperatures, dtype=logits.dtype))

    def save(self, export_dir: str | Path) -> Path:
        """Write `confidence_calibration.json` atomically into the export directory."""
        from pipeline.storage import write_text_atomic

        text = json.dumps(asdict(self), indent=2) + "\n"
        return write_text_atomic(Path(export_dir) / CALIBRATION_FILE, text)

    @classmethod
    def load(cls, export_dir: str | Path, *, temperature: float | None = None) -> Calibration:
        """The stored calibration; with `temperature`, refuse one fitted at another."""
        path = Path(export_dir) / CALIBRATION_FILE
        data = json.loads(path.read_text())
        cal = cls(
            temperatures=tuple(data["temperatures"]),
            num_events=tuple(data["num_events"]),
            num_samples=data["num_samples"],
            method=data["method"],
            sampling_temperature=float(data.get("sampling_temperature", 0.0)),
        )
        if temperature is not None and abs(temperature - cal.sampling_temperature) > 1e-9:
            raise ValueError(
                f"{path}: fitted at sampling temperature {cal.sampling_temperature}, asked for "
                f"{temperature}: refit with calibration.temperature: {temperature}"
            )
        return cal


def fit_calibration(
    events: Events, *, num_samples: int, sampling_temperature: float = 0.0
) -> Calibration:
    temps = tuple(
        fit_temperature(logits=z, labels=y)
        for z, y in zip(events.logits, events.labels, strict=True)
    )
    return Calibration(
        temps,
        tuple(int(z.numel()) for z in events.logits),
        num_samples,
        sampling_temperature=sampling_temperature,
    )


def round_events(rounds: list[tuple[torch.Tensor, int]], num_draft_tokens: int) -> Events:
    """Conditional events of verification rounds (confidence logits (n,), accepted count):
    position k is reached when the first k drafted tokens survived, labelled by whether
    token k did too (the live loop's rounds at T > 0)."""
    import torch

    logits: list[list[float]] = [[] for _ in range(num_draft_tokens)]
    labels: list[list[bool]] = [[] for _ in range(num_draft_tokens)]
    for conf, acc in rounds:
        for k in range(min(acc + 1, num_draft_tokens)):
            logits[k].append(float(conf[k]))
            labels[k].append(acc > k)
    return Events(
        [torch.tensor(x, dtype=torch.float32) for x in logits],
        [torch.tensor(x, dtype=torch.bool) for x in labels],
    )


def calibration_metrics(events: Events, calibration: Calibration | None) -> dict:
    """ECE and AUC per position (raw head, and after scaling when given)."""
    import torch

    out: dict[str, list] = {
        "ece_raw": [],
        "ece_scaled": [],
        "auc": [],
        "accept_rate": [],
        "events": [],
    }
    for k, (z, y) in enumerate(zip(events.logits, events.labels, strict=True)):
        out["events"].append(int(z.numel()))
        out["accept_rate"].append(_r(float(y.float().mean())) if y.numel() else None)
        out["ece_raw"].append(_r(expected_calibration_error(probs=torch.sigmoid(z), labels=y)))
        scaled = math.nan
        if calibration is not None:
            scaled = expected_calibration_error(
                probs=torch.sigmoid(z / calibration.temperatures[k]), labels=y
            )
        out["ece_scaled"].append(_r(scaled))
        out["auc"].append(_r(roc_auc(scores=z, labels=y)))  # scaling is monotone: AUC unchanged
    return out


def _r(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def truncated_lengths(*, confidence: torch.Tensor, threshold: float) -> torch.Tensor:
    """(T,) tokens kept per anchor: up to the first position whose confidence < threshold.

    confidence (T, n) calibrated conditional acceptance probabilities.
    """
    import torch

    below = confidence < threshold  # (T, n)
    n = confidence.shape[1]
    first = torch.where(
        below.any(-1), below.float().argmax(-1), torch.full_like(below[:, 0], n, dtype=torch.long)
    )
    return first.long()


def truncation_sweep(
    tables: list[AnchorTable],
    *,
    calibration: Calibration,
    thresholds: list[float],
    num_draft_tokens: int,
) -> list[dict]:
    """tau and verify rate per threshold (0.0 = no truncation)."""
    from pipeline.evaluate.offline import tau, walk_tables

    rows = []
    for thr in [0.0, *[t for t in thresholds if t > 0]]:
        lens = [
            truncated_lengths(confidence=calibration.apply(tab.confidence_logit), threshold=thr)
            for tab in tables
        ]
        rounds = walk_tables(tables, num_draft_tokens=num_draft_tokens, draft_len=lens)
        verified = float(rounds.draft_len.sum())
        rows.append(
            {
                "threshold": thr,
                "tau": _r(tau(accepted=rounds.accepted)),
                "verify_rate": _r(verified / (num_draft_tokens * max(rounds.num_rounds, 1))),
                "accepted_per_verified_token": _r(
                    float(rounds.accepted.sum()) / verified if verified else math.nan
                ),
                "rounds": rounds.num_rounds,
            }
        )
    return rows
