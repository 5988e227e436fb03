"""Chat-template rendering: conversations to the token ids the target sees, and loss masks.

The project renders prompts itself and hands token ids to the engine, so the
ids stored with a sample are exactly the ones the target conditioned on.

Multi-turn: answer j is regenerated given the *regenerated* answers 0..j-1
(`turns="all"`), as the target would see its own earlier answers in serving;
the history goes back in as text and is re-rendered by the template, like a
chat client does. `turns="last"` regenerates only the final answer, given the
original history. Each answer is one row whose loss mask covers exactly the
regenerated tokens, end-of-turn token included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Message = dict[str, str]


def render_prompt(tokenizer, messages: Sequence[Message]) -> list[int]:
    """Token ids of `messages` followed by the assistant generation prompt.

    `messages` must end with a user (or system) turn: the target answers next.
    """
    if not messages:
        raise ValueError("cannot render an empty conversation")
    if messages[-1]["role"] == "assistant":
        raise ValueError("the prompt must not end with an assistant turn (that is the answer)")
    encoded = tokenizer.apply_chat_template(
        list(messages), tokenize=True, add_generation_prompt=True, return_dict=True
    )
    return list(encoded["input_ids"])


def first_prompt(messages: Sequence[Message]) -> list[Message]:
    """The messages before the first assistant turn."""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            return list(messages[:i])
    return list(messages)


def user_turn_positions(messages: Sequence[Message]) -> list[int]:
    """Index in `messages` of each user turn (answer j follows user turn j)."""
    return [i for i, m in enumerate(messages) if m["role"] == "user"]


def answer_turns(messages: Sequence[Message], turns: str) -> list[int]:
    """Which answers (0-based) a conversation contributes rows for."""
    count = len(user_turn_positions(messages))
    if turns == "all":
        return list(range(count))
    if turns == "last":
        return [count - 1] if count else []
    raise ValueError(f"turns must be 'all' or 'last', got {turns!r}")


def prompt_messages(
    messages: Sequence[Message], turn: int, regenerated: Sequence[str] | None
) -> list[Message]:
    """The messages answer `turn` is conditioned on.

    With `regenerated` (the texts of answers 0..turn-1), earlier assistant turns
    are replaced by them; with None the original history is kept.
    """
    positions = user_turn_positions(messages)
    if not 0 <= turn < len(positions):
        raise ValueError(
            f"turn {turn} out of range: the conversation has {len(positions)} user turns"
        )
    history = list(messages[: positions[turn] + 1])
    if regenerated is None:
        return history
    if len(regenerated) < turn:
        raise ValueError(f"answer {turn} needs {turn} regenerated answers, got {len(regenerated)}")
    out: list[Message] = []
    answer = 0
    for message in history:
        if message["role"] == "assistant":
            out.append({"role": "assistant", "content": regenerated[answer]})
            answer += 1
        else:
            out.append(message)
    return out


@dataclass(frozen=True)
class RenderedRow:
    input_ids: list[int]  # prompt + regenerated answer
    loss_mask: list[int]  # 1 on the answer's tokens (end-of-turn included), 0 on the prompt
    num_prompt_tokens: int
    num_generated_tokens: int


def assemble_row(prompt_ids: Sequence[int], output_ids: Sequence[int]) -> RenderedRow:
    """One training row from a prompt and the target's answer to it."""
    if not output_ids:
        raise ValueError("the target produced no tokens")
    ids = list(prompt_ids) + list(output_ids)
    mask = [0] * len(prompt_ids) + [1] * len(output_ids)
    return RenderedRow(ids, mask, len(prompt_ids), len(output_ids))


def answer_budget(num_prompt_tokens: int, max_new_tokens: int, max_model_len: int) -> int:
    """Tokens the answer may use: the configured limit, capped by the context left."""
    return min(max_new_tokens, max_model_len - num_prompt_tokens)
