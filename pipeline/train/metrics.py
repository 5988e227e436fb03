"""What a training run records: one JSON row per step, and a summary at the end.

`<out_dir>/metrics.jsonl`: per step the loss and its parts, learning rate,
gradient norm, samples and tokens, and from `loss.block_stats` the accuracy
per block position and the teacher-forced acceptance lengths. Everything a
step sums over its batch travels as one vector (`step_sums`), so N workers
all-reduce it once and rank 0 writes the row of the global batch.
`<out_dir>/summary.json`: steps completed and the held-out figures
(`heldout_metrics`: the same statistics, teacher-forced, on the held-out split).

A resumed run first drops the rows written after its checkpoint
(`MetricsLog.truncate`), so the file continues the same curve.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.storage import write_text_atomic

if TYPE_CHECKING:
    import torch

    from pipeline.train.loss import LossParts
    from pipeline.train.packing import TrainBatch

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
_SUMS = 8  # ce, tv, bce, weight, kl, samples, tokens, outside; then BlockStats.vector()


def step_sums(
    *,
    batch: TrainBatch,
    parts: LossParts,
    weight: torch.Tensor,  # scalar: the batch's summed slot weight
    first_offset: int,
) -> torch.Tensor:
    """(8 + 3B + 3,) float32: the sums of one step's batch, all-reduced as one vector."""
    import torch

    from pipeline.train.loss import block_stats

    stats = block_stats(
        match=parts.match, valid=batch.valid, tv=parts.tv, first_offset=first_offset
    )
    return torch.cat(
        [
            torch.stack(
                [parts.ce_sum, parts.tv_sum, parts.bce_sum, weight.detach(), parts.kl_sum]
            ).float(),
            torch.tensor(
                [batch.num_samples, batch.num_tokens], dtype=torch.float32, device=weight.device
            ),
            (weight.new_zeros(()) if parts.outside is None else parts.outside)
            .detach()
            .float()
            .reshape(1),
            stats.vector().float(),
        ]
    )


def step_row(
    sums: torch.Tensor,
    *,
    step: int,
    lr: float,
    grad_norm: float,
    epoch: int,
    seconds: float,
    loss_weights: tuple[float, float, float, float],  # ce, tv, bce, kl
    block_size: int,
    first_offset: int,
    micro_batches: int = 1,
    peak_memory_gb: float | None = None,
) -> dict[str, Any]:
    """The metrics.jsonl row of a step from its (all-reduced) `step_sums`."""
    from pipeline.train.loss import BlockStats, summarize

    ce, tv, bce, wsum, kl, samples, tokens, outside = (float(x) for x in sums[:_SUMS])
    wsum = max(wsum, 1e-8)
    ce_w, tv_w, bce_w, kl_w = loss_weights
    row = {
        "step": step,
        "lr": lr,
        "loss": (ce_w * ce + tv_w * tv + bce_w * bce + kl_w * kl) / wsum,
        "ce": ce / wsum,
        "tv": tv / wsum,
        "bce": bce / wsum,
        "kl": kl / wsum,
        "grad_norm": grad_norm,
        "samples": int(samples),
        "tokens": int(tokens),
        "epoch": epoch,
        "seconds": seconds,
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "micro_batches": micro_batches,
        # Slots whose token a reduced draft vocabulary lacks (CE masked; 0 for a full one).
        "ce_outside": int(outside),
    }
    if peak_memory_gb is not None:
        row["peak_memory_gb"] = peak_memory_gb
    stats = BlockStats.from_vector(sums[_SUMS:].cpu(), block_size)
    row.update(summarize(stats=stats, first_offset=first_offset))
    return row


class MetricsLog:
    """`<out_dir>/metrics.jsonl`, appended by rank 0."""

    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir) / METRICS_FILE

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def truncate(self, step: int) -> None:
        """Drop rows past `step` (written after the checkpoint a run resumes from)."""
        if not self.path.exists():
            return
        rows = [
            line
            for line in self.path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] <= step
        ]
        write_text_atomic(self.path, "".join(r + "\n" for r in rows))


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every step's row of the run in `out_dir` ([] before the first step)."""
    return MetricsLog(out_dir).read()


def write_summary(out_dir: str | Path, *, steps: int, heldout: dict[str, float]) -> Path:
    text = json.dumps({"steps": steps, "heldout": heldout}, indent=2)
    return write_text_atomic(Path(out_dir) / SUMMARY_FILE, text)


def read_summary(out_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(out_dir) / SUMMARY_FILE).read_text())


def heldout_metrics(objective, batches: Iterable[TrainBatch]) -> dict[str, float]:
    """Accuracy per block position and teacher-forced tau of the draft of `objective`
    (a DraftObjective) over `batches` ({} without batches), plus the number of samples."""
    import torch

    from pipeline.train.loss import BlockStats, block_stats, summarize

    total: torch.Tensor | None = None
    count = 0
    spec = objective.model.spec
    with torch.no_grad():
        for batch in batches:
            parts = objective(batch)
            vec = block_stats(
                match=parts.match, valid=batch.valid, tv=parts.tv, first_offset=spec.first_offset
            ).vector()
            total = vec if total is None else total + vec
            count += batch.num_samples
    if total is None:
        return {}
    stats = BlockStats.from_vector(total.cpu(), spec.block_size)
    result = summarize(stats=stats, first_offset=spec.first_offset)
    result["samples"] = count
    return result


def peak_memory_gb(device) -> float | None:
    """Peak accelerator memory allocated so far (GB); None on the CPU."""
    if device.type != "cuda":
        return None
    import torch

    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
