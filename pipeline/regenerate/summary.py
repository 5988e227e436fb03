"""What a regeneration run reports: the end-of-run summary and the live progress bar."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.regenerate.unit import UnitResult


@dataclass
class RunSummary:
    dataset_uri: str
    version: int | None = None
    units_total: int = 0
    units_skipped: int = 0  # already committed by an earlier run
    units_done: int = 0
    units_failed: list[str] = field(default_factory=list)
    samples: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    bytes_written: int = 0
    errors_by_reason: Counter = field(default_factory=Counter)
    retries: int = 0
    seconds: float = 0.0

    def add(self, result: UnitResult) -> None:
        """Count one finished unit."""
        self.units_done += 1
        self.samples += result.num_samples
        self.prompt_tokens += result.num_prompt_tokens
        self.generated_tokens += result.num_generated_tokens
        self.bytes_written += result.shard.bytes
        self.errors_by_reason.update(e.reason for e in result.errors)

    def lines(self) -> list[str]:
        rate = self.generated_tokens / self.seconds if self.seconds else 0.0
        out = [
            f"dataset: {self.dataset_uri} (version {self.version if self.version is not None else 'none'})",
            f"units: {self.units_done} done, {self.units_skipped} already committed, "
            f"{len(self.units_failed)} failed, of {self.units_total}; {self.retries} retried",
            f"samples: {self.samples}; tokens: {self.prompt_tokens} prompt + {self.generated_tokens} "
            f"generated ({rate:.1f} generated tok/s)",
            f"bytes written: {self.bytes_written / 1e6:.2f} MB in {self.seconds:.1f} s",
        ]
        if self.errors_by_reason:
            out.append(
                "errors by reason: "
                + ", ".join(f"{r}={n}" for r, n in sorted(self.errors_by_reason.items()))
            )
        if self.units_failed:
            out.append("failed units: " + ", ".join(self.units_failed))
        return out


class Progress:
    """A progress bar over answers with generated tokens/s and errors so far."""

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.started = time.monotonic()
        self.tokens = 0
        self.errors = 0
        self.bar = tqdm(total=total, unit="sample", disable=not enabled, dynamic_ncols=True)

    def update(self, answers: int, result: UnitResult) -> None:
        self.tokens += result.num_generated_tokens
        self.errors += len(result.errors)
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self.bar.set_postfix_str(f"{self.tokens / elapsed:.0f} tok/s, errors {self.errors}")
        self.bar.update(answers)

    def close(self) -> None:
        self.bar.close()
