"""Chat-template rendering: conversations to the token ids the target sees, and loss masks.

The project renders prompts itself and hands token ids to the engine, so the
ids stored with a sample are exactly the ones the target conditioned on.

Multi-turn: answer j is regenerated given the *regenerated* answers 0..j-1
(`turns="all"`), as the target would see its own earlier answers in serving;
the history goes back in as text and is re-rendered by the template, like a
chat client does. `turns="last"` regenerates only the final answer, given the
original history. Each answer is one row whose loss mask covers exactly the
regenerated tokens, end-of-turn token included.

Tools: answer j is the assistant's text answer of exchange j (formats.py), so
its prompt ends with the exchange's user turn or, in an agentic exchange, with
its last tool result; assistant tool-call turns and tool results are context,
kept as the source has them (they are not regenerated: the target's own calls
would need the tools run again). They go through the target's template when it
renders tools (probed once per template), else as text in a fixed form
(`tools_as_text`). docs/corpus.md says more.

Control tokens: the template's own markup is tokenized as always, but text from
the corpus never becomes a special or added token. Content that holds the text
of one (`<|im_end|>` in a user message) has that text swapped for a placeholder
before the template runs and tokenized as plain text after. Assistant turns may
still hold the non-special added tokens a target writes itself (`<think>`,
`<tool_call>` in Qwen3), which their templates read; no content of any role can
produce a special token. A conversation with no such text takes the same path as
before, one render and one tokenizer call, so its ids are unchanged.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

# Placeholders: characters of a private-use plane, protected themselves, so every
# placeholder in a rendered prompt is one of ours.
_OPEN, _CLOSE = "\U000f0000", "\U000f0001"
_PLACEHOLDER = re.compile(f"{_OPEN}(\\d+){_CLOSE}")
_PROBE = "dspark_probe_7f3a"


def _has_tools(messages: Sequence[Message]) -> bool:
    return bool(messages[0].get("tools")) or any(
        m["role"] == "tool" or m.get("tool_calls") for m in messages
    )


def tools_as_text(messages: Sequence[Message]) -> list[Message]:
    """Tool turns as plain messages, for templates that do not render tools.

    Deterministic and close to what tool-trained models see (Hermes/Qwen tags):
    the definitions join the system message as `# Tools` + `<tools>` (one JSON
    object per line); a tool-call turn's content is followed by one
    `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` per call;
    consecutive tool results become one user turn of
    `<tool_response>\n...\n</tool_response>` blocks.
    """
    out: list[Message] = []
    tools = messages[0].get("tools")
    rest = list(messages)
    if tools:
        block = "# Tools\n\n<tools>\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        block += "\n</tools>"
        if messages[0]["role"] == "system":
            out.append({"role": "system", "content": f"{messages[0]['content']}\n\n{block}"})
            rest = rest[1:]
        else:
            out.append({"role": "system", "content": block})
            rest[0] = {k: v for k, v in rest[0].items() if k != "tools"}
    results: list[str] | None = None  # the open run of tool results
    for message in rest:
        if message["role"] == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if results is None:
                results = [block]
                out.append({"role": "user", "content": ""})
            else:
                results.append(block)
            out[-1]["content"] = "\n".join(results)
            continue
        results = None
        if message.get("tool_calls"):
            calls = "\n".join(
                "<tool_call>\n"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                    ensure_ascii=False,
                )
                + "\n</tool_call>"
                for c in message["tool_calls"]
            )
            text = f"{message['content']}\n{calls}" if message["content"] else calls
            out.append({"role": "assistant", "content": text})
        else:
            out.append(message)
    return out


class _Renderer:
    """What rendering needs to know about one tokenizer, worked out once."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.template = tokenizer.chat_template
        added = dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        special = {t.content for t in added.values() if t.special}
        special |= set(getattr(tokenizer, "all_special_tokens", []))
        # Added tokens made only of whitespace (code tokenizers have runs of spaces)
        # are text, not control tokens: they are left alone.
        every = {t.content for t in added.values() if t.content.strip()} | special
        self.special, self.every = self._pattern(special), self._pattern(every)
        self.control_ids = {i for i, t in added.items() if t.content in every}
        self.control_ids |= set(getattr(tokenizer, "all_special_ids", []))
        self._supports_tools: bool | None = None
        self._plain = None

    @staticmethod
    def _pattern(strings: set[str]) -> re.Pattern:
        strings = {s for s in strings if s} | {_OPEN, _CLOSE}
        return re.compile("|".join(re.escape(s) for s in sorted(strings, key=len, reverse=True)))

    @property
    def supports_tools(self) -> bool:
        """Whether the template renders tool definitions, tool calls and tool results."""
        if self._supports_tools is None:
            probe = [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {"name": f"{_PROBE}_call", "arguments": {}},
                        }
                    ],
                },
                {"role": "tool", "content": f"{_PROBE}_result"},
            ]
            tools = [
                {
                    "type": "function",
                    "function": {
                        "name": f"{_PROBE}_tool",
                        "description": "probe",
                        "parameters": {"type": "object", "properties": {}},
                    },
                }
            ]
            try:
                text = self.tokenizer.apply_chat_template(
                    probe, tools=tools, tokenize=False, add_generation_prompt=True
                )
            except Exception:  # a template that rejects tool turns does not support them
                text = ""
            self._supports_tools = all(
                f"{_PROBE}_{part}" in text for part in ("call", "result", "tool")
            )
        return self._supports_tools

    def _protect(self, value: Any, pattern: re.Pattern, originals: list[str]) -> Any:
        """`value` with every protected string in it swapped for a placeholder."""
        if isinstance(value, str):
            if not pattern.search(value):
                return value

            def swap(match: re.Match) -> str:
                originals.append(match.group(0))
                return f"{_OPEN}{len(originals) - 1}{_CLOSE}"

            return pattern.sub(swap, value)
        if isinstance(value, dict):
            return {k: self._protect(v, pattern, originals) for k, v in value.items()}
        if isinstance(value, list):
            return [self._protect(v, pattern, originals) for v in value]
        return value

    def _protect_message(self, message: Message, originals: list[str]) -> Message:
        pattern = self.special if message["role"] == "assistant" else self.every
        content = message.get("content")
        if len(message) == 2 and isinstance(content, str):  # a plain message: the hot path
            if not pattern.search(content):
                return message
            return {"role": message["role"], "content": self._protect(content, pattern, originals)}
        return {
            k: v if k == "role" else self._protect(v, pattern, originals)
            for k, v in message.items()
        }

    def _template_ids(self, text: str) -> list[int]:
        """Token ids of rendered template text, added and special tokens included.

        A fast tokenizer's Rust backend directly, when the wrapper would only
        call it: its `__call__` costs ~60 us of Python a prompt beside ~25 of
        tokenizing (measured on the trained toy's prompts), and every request a
        replica admits is rendered on the engine's host core. The wrapper turns
        truncation and padding off and sets `encode_special_tokens` to its
        `split_special_tokens` before encoding; a backend in any other state
        (set by its owner) goes through the wrapper, which restores that state.
        """
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if (
            backend is not None
            and backend.truncation is None
            and backend.padding is None
            and backend.encode_special_tokens
            == bool(getattr(self.tokenizer, "split_special_tokens", False))
        ):
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _plain_ids(self, text: str) -> list[int]:
        """Token ids of `text` as text: no added token matches, special or not."""
        if self._plain is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is not None:
                from tokenizers import Tokenizer

                spec = json.loads(backend.to_str())
                spec["added_tokens"] = []
                self._plain = Tokenizer.from_str(json.dumps(spec)).encode
            else:  # a slow tokenizer: transformers splits special tokens itself

                def encode(s: str, add_special_tokens: bool = False):
                    ids = self.tokenizer(s, add_special_tokens=False, split_special_tokens=True)
                    return type("Encoding", (), {"ids": ids["input_ids"]})

                self._plain = encode
        ids = list(self._plain(text, add_special_tokens=False).ids)
        if self.control_ids.intersection(ids):
            raise ValueError(f"the tokenizer has no plain-text tokenization of {text!r}")
        return ids

    def render(self, messages: Sequence[Message]) -> list[int]:
        tools = messages[0].get("tools")
        if _has_tools(messages):
            if self.supports_tools:
                messages = [{k: v for k, v in messages[0].items() if k != "tools"}, *messages[1:]]
            else:
                messages, tools = tools_as_text(messages), None
        originals: list[str] = []
        safe = [self._protect_message(m, originals) for m in messages]
        if tools:
            tools = self._protect(tools, self.every, originals)
        text = self.tokenizer.apply_chat_template(
            safe, tools=tools, tokenize=False, add_generation_prompt=True
        )
        if not originals:  # the common case: exactly what the template tokenizes to
            return self._template_ids(text)
        pieces, ids, pos = [], [], 0
        for match in _PLACEHOLDER.finditer(text):
            pieces.append((text[pos : match.start()], None))
            pieces.append((None, originals[int(match.group(1))]))
            pos = match.end()
        pieces.append((text[pos:], None))
        template_texts = [t for t, _ in pieces if t]
        encoded = iter(
            self.tokenizer(template_texts, add_special_tokens=False)["input_ids"]
            if template_texts
            else []
        )
        for template_text, original in pieces:
            if original is not None:
                ids += self._plain_ids(original)
            elif template_text:
                ids += next(encoded)
        return ids


_RENDERERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _renderer(tokenizer) -> _Renderer:
    renderer = _RENDERERS.get(tokenizer)
    if renderer is None or renderer.template != tokenizer.chat_template:
        renderer = _RENDERERS[tokenizer] = _Renderer(tokenizer)
    return renderer


def render_prompt(tokenizer, messages: Sequence[Message]) -> list[int]:
    """Token ids of `messages` followed by the assistant generation prompt.

    `messages` must end with a user, tool (or system) turn: the target answers
    next. Text from the messages never yields control tokens (module docstring).
    """
    if not messages:
        raise ValueError("cannot render an empty conversation")
    if messages[-1]["role"] == "assistant":
        raise ValueError("the prompt must not end with an assistant turn (that is the answer)")
    return _renderer(tokenizer).render(messages)


def first_prompt(messages: Sequence[Message]) -> list[Message]:
    """The messages answer 0 is conditioned on (those before the first text answer)."""
    positions = answer_positions(messages)
    return list(messages[: positions[0] + 1]) if positions else list(messages)


def user_turn_positions(messages: Sequence[Message]) -> list[int]:
    """Index in `messages` of each user turn (answer j follows user turn j)."""
    return [i for i, m in enumerate(messages) if m["role"] == "user"]


def answer_positions(messages: Sequence[Message]) -> list[int]:
    """Index of the last message of each answer's prompt.

    That is user turn j, or in an agentic exchange the last tool result after it:
    the assistant's text answer comes next.
    """
    positions: list[int] = []
    for i, message in enumerate(messages):
        if message["role"] == "user":
            positions.append(i)
        elif message["role"] == "tool" and positions:
            positions[-1] = i
    return positions


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

    With `regenerated` (the texts of answers 0..turn-1), earlier text answers
    are replaced by them; tool-call turns and tool results stay the original's.
    With None the original history is kept.
    """
    positions = answer_positions(messages)
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
        if message["role"] == "assistant" and not message.get("tool_calls"):
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
