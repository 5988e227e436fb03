"""One work unit: render prompts, generate + capture with the target, write the unit's shard.

This is the whole per-unit job, as a plain function over a backend, so it runs
(and is tested) without Ray; the replica actor only calls it. Samples stream
into the shard writer as each batch returns, so a unit's hidden states are
held once, batch by batch, and never travel to the driver.

Multi-turn conversations are processed in rounds: round j answers user turn j
of every conversation that has one, conditioned on the answers regenerated in
rounds < j (`turns="all"`), so one engine batch mixes conversations and turns.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.corpus.records import RowError, sample_id
from pipeline.regenerate.units import WorkUnit
from pipeline.render import (
    answer_budget,
    answer_turns,
    assemble_row,
    prompt_messages,
    render_prompt,
)
from pipeline.shards.schema import Provenance
from pipeline.targets.base import CapturingBackend, GenerationRequest
from pipeline.targets.config import GenerationConfig

if TYPE_CHECKING:
    from pipeline.regenerate.config import PipelineConfig

log = logging.getLogger(__name__)


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
    batch_size: int

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
            batch_size=config.regenerate.batch_size,
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


def regenerate_unit(
    backend: CapturingBackend, tokenizer, unit: WorkUnit, spec: UnitSpec
) -> UnitResult:
    """Regenerate and capture every answer of `unit`; write and close its shard."""
    import torch

    from pipeline.shards.manifest import Dataset
    from pipeline.shards.writer import Sample

    started = time.monotonic()
    result = UnitResult(unit.unit_id, None)
    dataset = Dataset.open(spec.dataset_uri, endpoint_url=spec.endpoint_url)
    writer = dataset.writer(unit.unit_id, spec.provenance)
    regenerated: dict[str, list[str]] = {c.conversation_id: [] for c in unit.conversations}
    wanted = {c.conversation_id: answer_turns(c.messages, spec.turns) for c in unit.conversations}
    dropped: set[str] = set()
    try:
        for round_ in range(max((max(t) + 1 for t in wanted.values() if t), default=0)):
            requests, members = [], {}
            for conv in unit.conversations:
                cid = conv.conversation_id
                if round_ not in wanted[cid]:
                    continue
                sid = sample_id(cid, round_)
                where = f"{conv.location} answer {round_}"
                if cid in dropped:
                    result.errors.append(
                        RowError(
                            conv.source,
                            where,
                            "history_too_long",
                            "an earlier answer of this conversation failed",
                        )
                    )
                    continue
                history = regenerated[cid] if spec.turns == "all" else None
                prompt_ids = render_prompt(
                    tokenizer, prompt_messages(conv.messages, round_, history)
                )
                budget = answer_budget(
                    len(prompt_ids), spec.generation.max_new_tokens, spec.max_model_len
                )
                if budget < spec.min_answer_tokens:
                    result.errors.append(
                        RowError(
                            conv.source,
                            where,
                            "prompt_too_long",
                            f"{len(prompt_ids)} prompt tokens leave {budget} of max_model_len {spec.max_model_len}",
                        )
                    )
                    dropped.add(cid)
                    continue
                requests.append(GenerationRequest(sid, prompt_ids, max_new_tokens=budget))
                members[sid] = conv
            for start in range(0, len(requests), spec.batch_size):
                batch = requests[start : start + spec.batch_size]
                for cap in backend.generate_and_capture(batch, spec.generation):
                    conv = members[cap.request_id]
                    try:
                        row = assemble_row(cap.prompt_ids, cap.output_ids)
                    except ValueError as err:
                        result.errors.append(
                            RowError(
                                conv.source,
                                f"{conv.location} answer {round_}",
                                "empty_answer",
                                str(err),
                            )
                        )
                        dropped.add(conv.conversation_id)
                        continue
                    writer.write(
                        Sample(
                            sample_id=cap.request_id,
                            source=conv.source,
                            domain=conv.domain,
                            input_ids=torch.tensor(row.input_ids, dtype=torch.int32),
                            loss_mask=torch.tensor(row.loss_mask, dtype=torch.uint8),
                            # Shards store bf16 (schema v1); a float32 reference
                            # target rounds here, a bf16 engine is unchanged.
                            hidden_states=cap.hidden_states.to(torch.bfloat16),
                            last_hidden_state=cap.last_hidden_state.to(torch.bfloat16),
                            finish_reason=cap.finish_reason,
                            num_prompt_tokens=row.num_prompt_tokens,
                            num_generated_tokens=row.num_generated_tokens,
                        )
                    )
                    # The next turn sees this answer as text, as a chat client would send it.
                    answer = tokenizer.decode(cap.output_ids, skip_special_tokens=True)
                    regenerated[conv.conversation_id].append(answer)
                    result.num_samples += 1
                    result.num_prompt_tokens += row.num_prompt_tokens
                    result.num_generated_tokens += row.num_generated_tokens
        # A unit whose every answer failed still gets its (zero-row) shard, so
        # it counts as done and a rerun does not redo it.
        result.shard = writer.close()
    except BaseException:
        writer.abort()
        raise
    dataset.write_errors(unit.unit_id, result.errors)
    result.seconds = time.monotonic() - started
    return result
