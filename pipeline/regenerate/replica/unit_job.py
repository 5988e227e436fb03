"""One work unit as a state machine: which request comes next, what each result becomes.

A `UnitJob` knows nothing of engines or threads, so it runs (and is tested)
without vLLM or Ray: the feeder (`feeder.py`) asks it for its first requests,
hands it every finished result, and submits whatever it returns next. A
multi-turn conversation's turn j is requested the moment turn j-1 returns,
conditioned on the regenerated answer (`turns="all"`) or on the corpus'
original history (`turns="last"`, which regenerates the final answer only).
Every captured answer becomes one `PendingSample` (`pending.py`), built by
the write-back. Results arrive in any order; the shard is written in
sample-id order (`writeback.py`), so a retried unit writes the same rows in
the same order.

A row that cannot be used (a prompt that leaves no room for the answer, a
template the tokenizer rejects, an empty answer, an incomplete capture)
becomes that row's error record; the conversation's later turns, which would
condition on it, are recorded as `earlier_answer_failed`; the unit completes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from pipeline.corpus.identity import sample_id
from pipeline.corpus.records import Conversation, RowError
from pipeline.regenerate.replica.pending import PendingSample
from pipeline.regenerate.units import UnitResult, UnitSpec, WorkUnit
from pipeline.render import answer_budget, answer_turns, prompt_messages, render_prompt
from pipeline.targets.base import GenerationRequest, RequestFailure, Result

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class UnitJob:
    """The conversations of one unit, turn by turn (see the module docstring)."""

    def __init__(self, unit: WorkUnit, spec: UnitSpec, tokenizer) -> None:
        self.unit = unit
        self.spec = spec
        self.tokenizer = tokenizer
        self.result = UnitResult(unit.unit_id, None)
        self.started = time.monotonic()
        self._turns = {
            c.conversation_id: answer_turns(c.messages, spec.turns) for c in unit.conversations
        }
        self._answers: dict[str, list[str]] = {c.conversation_id: [] for c in unit.conversations}
        self._in_flight: dict[str, tuple[Conversation, int]] = {}  # request id -> (conv, turn)
        # Per sample id, for error records of rows that fail after this job is done with them.
        self.locations: dict[str, str] = {}  # "file:row answer j"
        self.token_counts: dict[str, tuple[int, int]] = {}  # (prompt, generated)

    @property
    def done(self) -> bool:
        """Every conversation answered or failed: nothing in flight, nothing left to ask."""
        return not self._in_flight

    def first_requests(self) -> list[GenerationRequest]:
        """The first wanted turn of every conversation."""
        out = []
        for conv in self.unit.conversations:
            turns = self._turns[conv.conversation_id]
            if turns:
                request = self._request(conv, turns[0])
                if request is not None:
                    out.append(request)
        return out

    def on_result(self, result: Result) -> tuple[PendingSample | None, list[GenerationRequest]]:
        """The sample a finished request becomes (None if it failed) and the requests that
        follow; the sample's tensors are built by the write-back, not here."""
        conv, turn = self._in_flight.pop(result.request_id)
        if isinstance(result, RequestFailure):
            self._fail(conv, turn, result.reason, result.detail)
            return None, []
        if result.rows is None:
            where = f"{conv.location} answer {turn}"
            raise TypeError(f"{where}: expected a captured generation, got one without rows")
        if not result.output_ids:
            self._fail(conv, turn, "empty_answer", "the target produced no tokens")
            return None, []
        sample = PendingSample(conv.source, conv.domain, result)
        self.token_counts[result.request_id] = (len(result.prompt_ids), len(result.output_ids))
        res = self.result
        res.num_samples += 1
        res.num_prompt_tokens += len(result.prompt_ids)
        res.num_generated_tokens += len(result.output_ids)
        later = [t for t in self._turns[conv.conversation_id] if t > turn]
        if not later:
            return sample, []
        # The next turn sees this answer as text, as a chat client would send it.
        self._answers[conv.conversation_id].append(
            self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        )
        nxt = self._request(conv, later[0])
        return sample, [nxt] if nxt is not None else []

    # ------------------------------------------------------------------ internals

    def _request(self, conv: Conversation, turn: int) -> GenerationRequest | None:
        """The request for answer `turn`, or None (with an error record) if it cannot be made."""
        spec = self.spec
        history = self._answers[conv.conversation_id] if spec.turns == "all" else None
        try:
            prompt_ids = render_prompt(
                self.tokenizer, prompt_messages(conv.messages, turn, history)
            )
        except Exception as err:  # a template or tokenizer error is this row's, not the run's
            self._fail(conv, turn, "render_failed", f"{type(err).__name__}: {err}")
            return None
        budget = answer_budget(len(prompt_ids), spec.generation.max_new_tokens, spec.max_model_len)
        if budget < spec.min_answer_tokens:
            self._fail(
                conv,
                turn,
                "prompt_too_long",
                f"{len(prompt_ids)} prompt tokens leave {budget} of max_model_len {spec.max_model_len}",
            )
            return None
        request = GenerationRequest(sample_id(conv.conversation_id, turn), prompt_ids, budget)
        self._in_flight[request.request_id] = (conv, turn)
        self.locations[request.request_id] = f"{conv.location} answer {turn}"
        return request

    def _fail(self, conv: Conversation, turn: int, reason: str, detail: str) -> None:
        """Record the failed answer and every later wanted turn of the conversation."""
        errors = self.result.errors
        errors.append(RowError(conv.source, f"{conv.location} answer {turn}", reason, detail))
        for later in (t for t in self._turns[conv.conversation_id] if t > turn):
            errors.append(
                RowError(
                    conv.source,
                    f"{conv.location} answer {later}",
                    "earlier_answer_failed",
                    f"answer {turn} of this conversation failed ({reason})",
                )
            )
