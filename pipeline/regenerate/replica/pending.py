"""A regenerated answer on its way to its shard: the one sample type a unit emits.

A `PendingSample` is the answer's tokens plus its captured rows handle
(`targets/base.py: CapturedRows`, in memory or in the engine's spool). It
is plain data: the write-back builds it (`build`: the tensors from the
rows, the loss mask, bf16) in its encode workers, in the replica's process
or in its own, never on the engine's thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.render import assemble_row

if TYPE_CHECKING:
    from pipeline.shards.writer import Sample
    from pipeline.targets.base import Generation


@dataclass(frozen=True)
class PendingSample:
    """One answer whose row is not built yet (see the module docstring)."""

    source: str
    domain: str
    generation: Generation  # its `rows` holds the captured states

    @property
    def sample_id(self) -> str:
        return self.generation.request_id

    @property
    def nbytes(self) -> int:
        """Host memory its rows hold until built (counted against the capture bound)."""
        return self.generation.rows.nbytes

    def build(self) -> Sample:
        """The shard row: tokens, loss mask, bf16 tensors, facts (RuntimeError: the
        engine left positions unwritten)."""
        import numpy as np
        import torch

        from pipeline.shards.writer import Sample

        gen = self.generation
        states = gen.rows.states()
        row = assemble_row(gen.prompt_ids, gen.output_ids)
        return Sample(
            sample_id=gen.request_id,
            source=self.source,
            domain=self.domain,
            # numpy, as the writer keeps them (a tensor would cost a conversion each way)
            input_ids=np.asarray(row.input_ids, dtype=np.int32),
            loss_mask=np.asarray(row.loss_mask, dtype=np.uint8),
            # Shards store bf16 (schema v1); a float32 reference target rounds
            # here, a bf16 engine's tensors pass unchanged.
            hidden_states=states.hidden_states.to(torch.bfloat16),
            last_hidden_state=states.last_hidden_state.to(torch.bfloat16),
            finish_reason=gen.finish_reason,
            num_prompt_tokens=row.num_prompt_tokens,
            num_generated_tokens=row.num_generated_tokens,
        )
