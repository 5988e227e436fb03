"""What corpus reading and ingestion yield: raw rows, normalised conversations, error records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.corpus.identity import sample_id

# A normalised message: {"role", "content"}, plus "tool_calls" (assistant), "tool_call_id" /
# "name" (tool) and "tools" (first message only) where the source has them; see formats.py.
Message = dict[str, Any]


@dataclass(frozen=True)
class Conversation:
    conversation_id: str  # identity.conversation_hash(messages): equal content, equal id
    source: str  # corpus name (config `name`, else the path)
    domain: str
    messages: tuple[Message, ...]
    location: str  # where it came from, e.g. "data/chat.jsonl:17"

    @property
    def num_answers(self) -> int:
        """How many assistant turns regeneration produces (one per user turn)."""
        return sum(m["role"] == "user" for m in self.messages)

    def sample_ids(self) -> list[str]:
        return [sample_id(self.conversation_id, t) for t in range(self.num_answers)]


@dataclass(frozen=True)
class RowError:
    """A row that ingestion (or a later stage) could not use, with the reason."""

    source: str
    location: str  # file and row, e.g. "data/chat.jsonl:17"
    reason: str  # stable short code, e.g. "roles_do_not_alternate" (docs/corpus.md lists them)
    detail: str
    # Offset in the (decompressed) file of the line's first byte, or for a damaged file of
    # the point the reader reached; None where there is no byte stream (Parquet, HF rows).
    byte_offset: int | None = None

    def to_dict(self) -> dict[str, str | int]:
        out: dict[str, str | int] = {
            "source": self.source,
            "location": self.location,
            "reason": self.reason,
            "detail": self.detail,
        }
        if self.byte_offset is not None:
            out["byte_offset"] = self.byte_offset
        return out


@dataclass(frozen=True)
class RawRow:
    location: str  # "path:line" (JSONL) or "path#row" (Parquet, HF, JSON arrays)
    row: dict[str, Any] | None  # None when the row (or the file) could not be read
    reason: str | None = None  # the error code when `row` is None
    detail: str | None = None
    byte_offset: int | None = None  # first byte of the line (JSONL)
    size: int | None = None  # bytes of the raw line, when the reader measured it


@dataclass
class ReadProgress:
    """How far the reader of one file got, for the record of a file it cannot finish."""

    rows: int = 0  # lines (JSONL) or rows (Parquet) read
    offset: int = 0  # bytes read (decompressed, for .gz/.zst)
