"""Conversation formats in, one normalised form out.

Accepted row shapes (detected per row, so a mixed file works; docs/corpus.md has examples):

* OpenAI messages: `{"messages": [{"role": "user", "content": "..."}, ...]}`, with
  `content` a string or a list of parts (`[{"type": "text", "text": ...}]`), the
  `developer` role, assistant `tool_calls` (or the legacy `function_call`), `tool`
  (or legacy `function`) results, and a `tools` column of function definitions.
* ShareGPT: `{"conversations": [{"from": "human", "value": "..."}, ...]}`, also with
  `role`/`content` turns, LLaMA-Factory's `function_call`/`observation` turns and
  its `system` and `tools` columns.
* Speaker groups (the Chit Chat Challenge): `{"messages": [[{"text", "sender"}, ...], ...]}`,
  each inner list one speaker's consecutive utterances; the first speaker is the
  user, the other the assistant, utterances joined with a newline.
* prompt/response pairs: `prompt`+`response`, `prompt`+`completion`,
  `instruction`(+`input`)+`output`, `question`+`answer`; a bare `prompt`.

The normalised form is a list of messages: an optional system message (leading
system/developer turns merged), then exchanges. An exchange is a user turn, any
number of assistant tool-call turns each followed by its tool results, and the
assistant's text answer (only the last exchange may stop before its answer: a
prompt awaiting it). Regeneration answers each exchange once (render.py).

A plain message is exactly `{"role", "content"}` (content NFC-normalised and
stripped), as it always was: conversation hashes, hence sample ids, of plain
conversations do not change. Extra keys appear only where the source has them:
`tool_calls` (`[{"id"?, "type": "function", "function": {"name", "arguments"}}]`,
arguments parsed from JSON when they are JSON) on assistant turns, `tool_call_id`
and `name` on tool turns, `tools` (the definitions) on the first message.

A row that cannot be brought there raises `MalformedRow` with a short reason
code and a detail, which ingestion turns into an error record.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Literal

from pipeline.corpus.row_checks import (
    MAX_NESTING,
    MalformedRow,
    clean_text,
    json_value,
    nesting_depth,
)

Message = dict[str, Any]
NonTextParts = Literal["error", "skip"]

ROLE_ALIASES = {
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system role
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "tool": "tool",
    "function": "tool",  # OpenAI's legacy function result
    "observation": "tool",  # LLaMA-Factory ShareGPT
    "ipython": "tool",  # Llama 3
    "function_call": "function_call",  # LLaMA-Factory ShareGPT: an assistant tool call
}
_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
_PAIR_KEYS = (("prompt", "response"), ("prompt", "completion"), ("question", "answer"))


class _Parser:
    """Normalises the turns of one row; `skipped` counts the non-text parts it dropped."""

    def __init__(self, non_text_parts: NonTextParts, skipped: Counter | None) -> None:
        self.non_text_parts = non_text_parts
        self.skipped = skipped if skipped is not None else Counter()

    def content(self, value: Any, where: str, *, allow_empty: bool = False) -> str:
        if value is None and allow_empty:
            return ""
        if isinstance(value, list):
            # Text parts are joined with "\n" (as vLLM's OpenAI server does); a single
            # text part is the plain string, so it hashes like a plain message.
            texts = []
            for j, part in enumerate(value):
                if isinstance(part, str):
                    texts.append(clean_text(part, f"{where}[{j}]", allow_empty=True))
                    continue
                if not isinstance(part, dict):
                    raise MalformedRow(
                        "content_not_text", f"{where}[{j}] is {type(part).__name__}, not a part"
                    )
                kind = part.get("type", "text" if "text" in part else None)
                if kind in _TEXT_PARTS:
                    texts.append(
                        clean_text(
                            part.get(_TEXT_PARTS[kind]), f"{where}[{j}].text", allow_empty=True
                        )
                    )
                elif self.non_text_parts == "skip":
                    self.skipped[str(kind)] += 1
                else:
                    raise MalformedRow(
                        "non_text_part",
                        f"{where}[{j}] is a {kind!r} part (set corpus.non_text_parts: skip to drop such parts)",
                    )
            value = "\n".join(t for t in texts if t)
        return clean_text(value, where, allow_empty=allow_empty)

    def tool_calls(self, calls: Any, where: str) -> list[dict]:
        if not isinstance(calls, list):
            raise MalformedRow("bad_tool_call", f"{where} is {type(calls).__name__}, not a list")
        return [self.tool_call(call, f"{where}[{k}]") for k, call in enumerate(calls)]

    def tool_call(self, call: Any, where: str) -> dict:
        if not isinstance(call, dict):
            raise MalformedRow("bad_tool_call", f"{where} is {type(call).__name__}, not a mapping")
        # OpenAI nests name/arguments under `function`; Hugging Face's form is flat.
        function = call.get("function") if isinstance(call.get("function"), dict) else call
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise MalformedRow("bad_tool_call", f"{where} has no function name")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            text = clean_text(arguments, f"{where}.arguments", allow_empty=True)
            try:  # templates want the object; a string that is not JSON stays as given
                arguments = json.loads(text) if text else {}
            except (ValueError, RecursionError):
                arguments = text
        arguments = json_value(arguments, f"{where}.arguments")
        out: dict[str, Any] = {}
        if isinstance(call.get("id"), str) and call["id"].strip():
            out["id"] = clean_text(call["id"], f"{where}.id")
        out["type"] = "function"
        out["function"] = {"name": clean_text(name, f"{where}.name"), "arguments": arguments}
        return out

    def turn(self, turn: Any, where: str) -> Message:
        if not isinstance(turn, dict):
            raise MalformedRow("bad_turn", f"{where} is {type(turn).__name__}, not a mapping")
        role_key, content_key = ("from", "value") if "from" in turn else ("role", "content")
        raw_role = turn.get(role_key)
        role = ROLE_ALIASES.get(raw_role.strip().lower()) if isinstance(raw_role, str) else None
        if role is None:
            raise MalformedRow("unknown_role", f"{where}.{role_key} = {raw_role!r}")
        content = turn.get(content_key)
        if role == "function_call":  # the value is the call itself, as JSON
            try:
                call = json.loads(content) if isinstance(content, str) else content
            except (ValueError, RecursionError):
                raise MalformedRow("bad_tool_call", f"{where}.{content_key} is not JSON") from None
            calls = call if isinstance(call, list) else [call]
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": self.tool_calls(calls, f"{where}.{content_key}"),
            }
        if role == "assistant":
            calls = turn.get("tool_calls")
            if not calls and isinstance(turn.get("function_call"), dict):
                calls = [turn["function_call"]]
            if calls:  # [] and null are what exports write for plain turns
                return {
                    "role": "assistant",
                    "content": self.content(content, f"{where}.{content_key}", allow_empty=True),
                    "tool_calls": self.tool_calls(calls, f"{where}.tool_calls"),
                }
        if role == "tool":
            if isinstance(content, (dict, int, float, bool)):  # a structured result
                content = json.dumps(
                    json_value(content, f"{where}.{content_key}"), ensure_ascii=False
                )
            message = {
                "role": "tool",
                "content": self.content(content, f"{where}.{content_key}", allow_empty=True),
            }
            for key in ("tool_call_id", "name"):
                if isinstance(turn.get(key), str) and turn[key].strip():
                    message[key] = clean_text(turn[key], f"{where}.{key}")
            return message
        return {"role": role, "content": self.content(content, f"{where}.{content_key}")}

    def turns(self, turns: Any, field: str) -> list[Message]:
        if not isinstance(turns, (list, tuple)):
            raise MalformedRow(
                "not_a_list", f"`{field}` is {type(turns).__name__}, not a list of turns"
            )
        return [self.turn(turn, f"`{field}[{i}]`") for i, turn in enumerate(turns)]


def _speaker_groups(groups: list, parser: _Parser) -> list[Message]:
    """Speaker groups as alternating user/assistant turns (see the module docstring)."""
    messages: list[Message] = []
    senders: list[object] = []
    for i, group in enumerate(groups):
        where = f"`messages[{i}]`"
        if not isinstance(group, list) or not group:
            raise MalformedRow("bad_turn", f"{where} is not a non-empty list of utterances")
        texts, sender = [], None
        for j, utterance in enumerate(group):
            if not isinstance(utterance, dict):
                raise MalformedRow(
                    "bad_turn", f"{where}[{j}] is {type(utterance).__name__}, not a mapping"
                )
            sender = utterance.get("sender", sender)
            text = parser.content(utterance.get("text"), f"{where}[{j}].text", allow_empty=True)
            if text:
                texts.append(text)
        if not texts:
            continue  # a group of empty utterances says nothing
        if senders and sender == senders[-1]:  # the same speaker again: one turn
            messages[-1]["content"] += "\n" + "\n".join(texts)
            continue
        if sender not in senders[:2] and len(senders) >= 2 and sender is not None:
            raise MalformedRow("unknown_role", f"{where}: a third speaker {sender!r}")
        senders.append(sender)
        role = "user" if len(messages) % 2 == 0 else "assistant"
        messages.append({"role": role, "content": "\n".join(texts)})
    if not messages:
        raise MalformedRow("empty_content", "`messages` holds no text")
    return messages


def _tools(value: Any) -> list[dict] | None:
    """The `tools` column: function definitions, as a list or a JSON string of one."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise MalformedRow("bad_tools", "`tools` is a string that is not JSON") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise MalformedRow("bad_tools", "`tools` is not a list of function definitions")
    if nesting_depth(value) > MAX_NESTING:
        raise MalformedRow("too_deeply_nested", f"`tools` is nested deeper than {MAX_NESTING}")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedRow("lone_surrogate", "`tools` holds a lone surrogate") from None
    except (TypeError, ValueError, RecursionError) as err:
        raise MalformedRow("bad_tools", f"`tools` is not JSON data: {err}") from None
    return value or None


def to_messages(
    row: dict[str, Any],
    *,
    non_text_parts: NonTextParts = "error",
    skipped: Counter | None = None,
) -> list[Message]:
    """Detect the row's format and return its normalised messages."""
    parser = _Parser(non_text_parts, skipped)
    raw_messages = row.get("messages")
    if isinstance(raw_messages, list) and raw_messages and isinstance(raw_messages[0], list):
        messages = _speaker_groups(raw_messages, parser)
    elif raw_messages is not None:
        messages = parser.turns(raw_messages, "messages")
    elif row.get("conversations") is not None:
        messages = parser.turns(row["conversations"], "conversations")
    elif "instruction" in row and "output" in row:
        prompt = clean_text(row["instruction"], "`instruction`")
        if isinstance(row.get("input"), str) and row["input"].strip():
            prompt = f"{prompt}\n\n{clean_text(row['input'], '`input`')}"
        messages = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": clean_text(row["output"], "`output`")},
        ]
    else:
        for prompt_key, answer_key in _PAIR_KEYS:
            if prompt_key in row and answer_key in row:
                messages = [
                    {"role": "user", "content": parser.content(row[prompt_key], f"`{prompt_key}`")},
                    {
                        "role": "assistant",
                        "content": parser.content(row[answer_key], f"`{answer_key}`"),
                    },
                ]
                break
        else:
            if "prompt" in row:
                messages = [{"role": "user", "content": parser.content(row["prompt"], "`prompt`")}]
            elif "text" in row:
                raise MalformedRow(
                    "pre_rendered_text",
                    "a `text` column of already-rendered chat is not accepted: give `messages`; "
                    "prompts are rendered with the target's own template",
                )
            else:
                keys = ", ".join(sorted(map(str, row))) or "none"
                raise MalformedRow(
                    "unknown_format",
                    f"no `messages`, `conversations` or prompt/response columns (columns: {keys})",
                )
    if isinstance(row.get("system"), str) and row["system"].strip():  # LLaMA-Factory column
        messages.insert(0, {"role": "system", "content": clean_text(row["system"], "`system`")})
    messages = check_roles(messages)
    tools = _tools(row.get("tools"))
    if tools is not None:
        messages[0] = {**messages[0], "tools": tools}
    return messages


def is_tool_call(message: Message) -> bool:
    return message["role"] == "assistant" and bool(message.get("tool_calls"))


def check_roles(messages: list[Message]) -> list[Message]:
    """Leading system turns merged into one, then exchanges (see the module docstring)."""
    if not messages:
        raise MalformedRow("empty_conversation", "no turns")
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    if head > 1:  # several system/developer turns: one system message, in order
        merged = "\n\n".join(m["content"] for m in messages[:head])
        messages = [{"role": "system", "content": merged}, *messages[head:]]
        head = 1
    if head == len(messages):
        raise MalformedRow("no_user_turn", "the conversation has only a system turn")
    state = "user"  # what may come next: user | after_user | after_call | after_result
    for i in range(head, len(messages)):
        role, call = messages[i]["role"], is_tool_call(messages[i])
        if role == "system":
            raise MalformedRow("system_turn_not_first", f"turn {i} is a system turn")
        if role == "tool" and state not in ("after_call", "after_result"):
            raise MalformedRow("tool_result_without_call", f"turn {i} is a tool result")
        if state == "after_call" and role != "tool":
            raise MalformedRow(
                "tool_call_without_result", f"turn {i - 1} calls tools; turn {i} is {role!r}"
            )
        if role == "tool":
            state = "after_result"
        elif state == "user":
            if role != "user":
                raise MalformedRow(
                    "roles_do_not_alternate", f"turn {i} is {role!r}, expected 'user'"
                )
            state = "after_user"
        elif role == "user":
            expected = (
                "the answer after the tool results" if state == "after_result" else "'assistant'"
            )
            raise MalformedRow("roles_do_not_alternate", f"turn {i} is 'user', expected {expected}")
        else:  # an assistant turn after a user turn or tool results
            state = "after_call" if call else "user"
    if state == "after_call":
        raise MalformedRow(
            "tool_call_without_result", f"the last turn ({len(messages) - 1}) calls tools"
        )
    return messages
