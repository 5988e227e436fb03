"""Why a corpus row is unusable (`MalformedRow`), and the checks of its values.

Text is NFC-normalised and stripped, and refused when it is not a string, holds a
lone surrogate (it could not be written as UTF-8) or is empty where an empty one
means nothing; tool arguments and definitions are refused when they are not JSON
data or nest deeper than `MAX_NESTING`. Each failure names a stable reason code
that ingestion counts in its error records.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any


class MalformedRow(ValueError):
    """A row that is not a usable conversation; `reason` is a stable short code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _check_unicode(value: str, where: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise MalformedRow(
            "lone_surrogate",
            f"{where} holds a lone surrogate {value[err.start]!r} at character {err.start}",
        ) from None


def clean_text(value: Any, where: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise MalformedRow("content_not_text", f"{where} is {type(value).__name__}, not a string")
    _check_unicode(value, where)
    text = unicodedata.normalize("NFC", value).strip()
    if not text and not allow_empty:
        raise MalformedRow("empty_content", f"{where} is empty")
    return text


# Tool arguments and definitions are walked again by json.dumps and the template's
# `tojson` at render time: deeper than this is an ingest error, not a crash there.
MAX_NESTING = 64


def nesting_depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth > MAX_NESTING:
                break
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def json_value(value: Any, where: str) -> Any:
    """A JSON-able value checked for lone surrogates and nesting."""
    if nesting_depth(value) > MAX_NESTING:
        raise MalformedRow("too_deeply_nested", f"{where} is nested deeper than {MAX_NESTING}")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedRow("lone_surrogate", f"{where} holds a lone surrogate") from None
    except RecursionError:
        raise MalformedRow("too_deeply_nested", f"{where} is nested too deeply") from None
    except (TypeError, ValueError) as err:
        raise MalformedRow("bad_tool_call", f"{where} is not JSON data: {err}") from None
    return value
