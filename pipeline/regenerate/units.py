"""What the driver and a replica say to each other: a unit of work, how to do it, what came of it.

The driver sends a replica `regenerate(unit, spec)` (a Ray call, or a direct
call on the feeder in `run_local`) and gets a `UnitResult` back. These three
types are the only regeneration code both sides import besides the job's
config (`config.py`); see the package docstring for the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.corpus.records import Conversation, RowError
from pipeline.shards.schema import Provenance
from pipeline.targets.config import GenerationConfig

if TYPE_CHECKING:
    from pipeline.regenerate.config import PipelineConfig


@dataclass(frozen=True)
class WorkUnit:
    unit_id: str  # "u<bucket>-<digest>": the shard's name
    bucket: int
    conversations: tuple[Conversation, ...]  # sorted by partition key, then id

    @property
    def num_answers(self) -> int:
        return sum(c.num_answers for c in self.conversations)


@dataclass(frozen=True)
class UnitSpec:
    """Everything a replica needs to turn a unit into a shard (same for every unit of a run)."""

    dataset_uri: str
    endpoint_url: str | None
    provenance: Provenance
    generation: GenerationConfig
    turns: str
    max_model_len: int
    min_answer_tokens: int

    @classmethod
    def from_config(cls, config: PipelineConfig, provenance: Provenance) -> UnitSpec:
        return cls(
            dataset_uri=config.output.uri,
            endpoint_url=config.output.endpoint_url,
            provenance=provenance,
            generation=config.generation,
            turns=config.regenerate.turns,
            max_model_len=config.target.max_model_len,
            min_answer_tokens=config.regenerate.min_answer_tokens,
        )


@dataclass
class UnitResult:
    unit_id: str
    shard: Any | None  # ShardInfo once written
    num_samples: int = 0
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    errors: list[RowError] = field(default_factory=list)
    seconds: float = 0.0
