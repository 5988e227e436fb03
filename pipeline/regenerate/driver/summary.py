"""What a regeneration run reports: the end-of-run summary and the live progress bar."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.regenerate.units import UnitResult


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
    seconds: float = 0.0  # the whole call: planning, engine start, work, commits
    engine_start_seconds: float = 0.0  # until every replica's engine was up
    steady_seconds: float = 0.0  # from every engine up to the last unit written
    replica_stats: list[dict] = field(default_factory=list)

    def add(self, result: UnitResult) -> None:
        """Count one finished unit."""
        self.units_done += 1
        self.samples += result.num_samples
        self.prompt_tokens += result.num_prompt_tokens
        self.generated_tokens += result.num_generated_tokens
        self.bytes_written += result.shard.bytes
        self.errors_by_reason.update(e.reason for e in result.errors)

    @property
    def generated_tok_s(self) -> float:
        """Steady-state generated tokens/s (engine start excluded)."""
        return self.generated_tokens / self.steady_seconds if self.steady_seconds else 0.0

    @property
    def captured_tok_s(self) -> float:
        """Steady-state tokens/s whose hidden states were stored (prompt + generated)."""
        tokens = self.prompt_tokens + self.generated_tokens
        return tokens / self.steady_seconds if self.steady_seconds else 0.0

    def to_dict(self) -> dict:
        """The summary as JSON-ready data (`regenerate --summary-json`)."""
        return {
            "dataset_uri": self.dataset_uri,
            "version": self.version,
            "units": {
                "total": self.units_total,
                "done": self.units_done,
                "already_committed": self.units_skipped,
                "failed": list(self.units_failed),
                "retries": self.retries,
            },
            "samples": self.samples,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "bytes_written": self.bytes_written,
            "errors_by_reason": dict(sorted(self.errors_by_reason.items())),
            "seconds": round(self.seconds, 3),
            "engine_start_seconds": round(self.engine_start_seconds, 3),
            "steady_seconds": round(self.steady_seconds, 3),
            "generated_tok_s": round(self.generated_tok_s, 1),
            "captured_tok_s": round(self.captured_tok_s, 1),
            "replicas": self.replica_stats,
        }

    def write_json(self, path) -> None:
        import json
        from pathlib import Path

        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def lines(self) -> list[str]:
        out = [
            f"dataset: {self.dataset_uri} (version {self.version if self.version is not None else 'none'})",
            f"units: {self.units_done} done, {self.units_skipped} already committed, "
            f"{len(self.units_failed)} failed, of {self.units_total}; {self.retries} retried",
            f"samples: {self.samples}; tokens: {self.prompt_tokens} prompt + {self.generated_tokens} "
            "generated",
        ]
        if self.steady_seconds:
            out.append(
                f"engine start: {self.engine_start_seconds:.1f} s; then {self.steady_seconds:.1f} s "
                f"at {self.generated_tok_s:.0f} generated tok/s, {self.captured_tok_s:.0f} "
                "captured tok/s"
            )
        out.append(
            f"bytes written: {self.bytes_written / 1e6:.2f} MB in {self.seconds:.1f} s in all"
        )
        if self.errors_by_reason:
            out.append(
                "errors by reason: "
                + ", ".join(f"{r}={n}" for r, n in sorted(self.errors_by_reason.items()))
            )
        if self.units_failed:
            out.append("failed units: " + ", ".join(self.units_failed))
        return out


class Progress:
    """A progress bar over answers with generated tokens/s and errors so far.

    Started once every engine is up, so its rate is the steady-state rate.
    """

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
