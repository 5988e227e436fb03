"""Chat-template rendering: conversations to the token ids the target sees.

The project renders prompts itself and hands token ids to the engine, so the
ids stored with a sample are exactly the ones the target conditioned on.
"""

from __future__ import annotations

from collections.abc import Sequence

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
