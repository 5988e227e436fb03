"""Conversation formats in, one normalised form out.

Accepted row shapes (detected per row, so a mixed file works):

* OpenAI messages: `{"messages": [{"role": "user", "content": "..."}, ...]}`
* ShareGPT: `{"conversations": [{"from": "human", "value": "..."}, ...]}`
* prompt/response pairs: `prompt`+`response`, `prompt`+`completion`,
  `instruction`(+`input`)+`output`, `question`+`answer`.

The normalised form is a list of `{"role", "content"}` with roles system (first
only), then alternating user/assistant starting with user; content is
NFC-normalised and stripped. A conversation may end with a user turn (a prompt
awaiting its answer): regeneration answers every user turn, and the original
assistant turns only shape the sample id. A bare `prompt` column is accepted
for that reason. A row that cannot be brought there raises
`MalformedRow` with a short reason code and a detail, which ingestion turns into
an error record; it never stops the run.
"""

from __future__ import annotations

import unicodedata
from typing import Any

Message = dict[str, str]

ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
}

_PAIR_KEYS = (("prompt", "response"), ("prompt", "completion"), ("question", "answer"))


class MalformedRow(ValueError):
    """A row that is not a usable conversation; `reason` is a stable short code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MalformedRow("content_not_text", f"{where} is {type(value).__name__}, not a string")
    text = unicodedata.normalize("NFC", value).strip()
    if not text:
        raise MalformedRow("empty_content", f"{where} is empty")
    return text


def _from_turns(turns: Any, role_key: str, content_key: str, field: str) -> list[Message]:
    if not isinstance(turns, (list, tuple)):
        raise MalformedRow(
            "not_a_list", f"`{field}` is {type(turns).__name__}, not a list of turns"
        )
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise MalformedRow(
                "bad_turn", f"`{field}[{i}]` is {type(turn).__name__}, not a mapping"
            )
        raw_role = turn.get(role_key)
        role = ROLE_ALIASES.get(str(raw_role).lower()) if raw_role is not None else None
        if role is None:
            raise MalformedRow("unknown_role", f"`{field}[{i}].{role_key}` = {raw_role!r}")
        messages.append(
            {"role": role, "content": _text(turn.get(content_key), f"`{field}[{i}].{content_key}`")}
        )
    return messages


def to_messages(row: dict[str, Any]) -> list[Message]:
    """Detect the row's format and return its normalised messages."""
    if "messages" in row and row["messages"] is not None:
        messages = _from_turns(row["messages"], "role", "content", "messages")
    elif "conversations" in row and row["conversations"] is not None:
        messages = _from_turns(row["conversations"], "from", "value", "conversations")
    elif "instruction" in row and "output" in row:
        prompt = _text(row["instruction"], "`instruction`")
        if isinstance(row.get("input"), str) and row["input"].strip():
            prompt = f"{prompt}\n\n{_text(row['input'], '`input`')}"
        messages = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": _text(row["output"], "`output`")},
        ]
    else:
        for prompt_key, answer_key in _PAIR_KEYS:
            if prompt_key in row and answer_key in row:
                messages = [
                    {"role": "user", "content": _text(row[prompt_key], f"`{prompt_key}`")},
                    {"role": "assistant", "content": _text(row[answer_key], f"`{answer_key}`")},
                ]
                break
        else:
            if "prompt" in row:
                return check_roles([{"role": "user", "content": _text(row["prompt"], "`prompt`")}])
            keys = ", ".join(sorted(map(str, row))) or "none"
            raise MalformedRow(
                "unknown_format",
                f"no `messages`, `conversations` or prompt/response columns (columns: {keys})",
            )
    return check_roles(messages)


def check_roles(messages: list[Message]) -> list[Message]:
    """Optional leading system turn, then user/assistant alternating from a user turn."""
    if not messages:
        raise MalformedRow("empty_conversation", "no turns")
    offset = 1 if messages[0]["role"] == "system" else 0
    body = messages[offset:]
    if not body:
        raise MalformedRow("no_user_turn", "the conversation has only a system turn")
    for i, msg in enumerate(body):
        expected = "user" if i % 2 == 0 else "assistant"
        if msg["role"] != expected:
            raise MalformedRow(
                "roles_do_not_alternate",
                f"turn {i + offset} is {msg['role']!r}, expected {expected!r}",
            )
    return messages
