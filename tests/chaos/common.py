"""What every chaos test shares: a small regeneration, and the exactly-once check.

The runs use the transformers backend in this process (`run_local`): the same
planning, unit jobs, write-back, commit sink and storage as a Ray run, so a
fault in storage, the disk or the driver meets production code; replica
faults run on a real local Ray (test_replicas.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from reliability import record

from pipeline.corpus.ingest import load_corpus
from pipeline.regenerate.config import PipelineConfig, parse_config
from pipeline.table.inspection import verify_dataset
from pipeline.table.reader import ShardReader


def run_config(
    uri: str,
    *,
    num_conversations: int = 24,
    num_buckets: int = 6,
    seed: int = 11,
    endpoint_url: str | None = None,
    max_new_tokens: int = 24,
    target: dict | None = None,
    sources: list | None = None,
    **regenerate: object,
) -> PipelineConfig:
    """A small regeneration of the synthetic corpus on the toy target (hf backend)."""
    return parse_config(
        {
            "name": "chaos",
            "target": {
                "model": "toy:trained",
                "backend": "hf",
                "max_model_len": 512,
                **(target or {}),
            },
            "corpus": {
                "synthetic": {"num_conversations": num_conversations, "seed": seed},
                "sources": sources or [],
            },
            "generation": {"max_new_tokens": max_new_tokens},
            "output": {"uri": uri, "endpoint_url": endpoint_url},
            "regenerate": {"num_buckets": num_buckets, "commit_every_units": 1, **regenerate},
        },
        "chaos",
    )


def expected_ids(config: PipelineConfig) -> set[str]:
    corpus = load_corpus(config.corpus)
    return {sid for conv in corpus.conversations for sid in conv.sample_ids()}


@dataclass
class Outcome:
    """What a chaos test found at the end; `publish` records it (reliability.py)."""

    committed: int
    lost: int
    duplicated: int
    verify_ok: bool
    versions: int
    extra: dict = field(default_factory=dict)


def exactly_once(uri: str, expected: set[str], *, endpoint_url: str | None = None) -> Outcome:
    """Every expected sample committed exactly once, and `verify` clean on the latest version."""
    reader = ShardReader(uri, prefetch=0, endpoint_url=endpoint_url)
    ids = [s.sample_id for s in reader]
    report = verify_dataset(uri, endpoint_url=endpoint_url)
    outcome = Outcome(
        committed=len(ids),
        lost=len(expected - set(ids)),
        duplicated=len(ids) - len(set(ids)),
        verify_ok=report.ok,
        versions=reader.version,
    )
    assert report.ok, report.to_text()
    assert outcome.duplicated == 0, "a sample is committed twice"
    assert set(ids) == expected, (
        f"{outcome.lost} samples lost, {len(set(ids) - expected)} unexpected"
    )
    return outcome


class Timer:
    def __init__(self) -> None:
        self.started = time.monotonic()

    @property
    def seconds(self) -> float:
        return round(time.monotonic() - self.started, 1)


def publish(
    case: str,
    fault: str,
    outcome: Outcome,
    *,
    rows: int,
    faults: int,
    seconds: float,
    result: str,
    **extra: object,
) -> None:
    """One row of the chaos table."""
    record(
        "chaos",
        case,
        fault=fault,
        faults_survived=faults,
        rows_tried=rows,
        samples_committed=outcome.committed,
        samples_lost=outcome.lost,
        samples_duplicated=outcome.duplicated,
        verify="clean" if outcome.verify_ok else "FAILED",
        result=result,
        seconds=seconds,
        **extra,
    )
