"""Corpus ingestion: every configured source -> normalised, deduplicated conversations.

First every source is resolved (format, file list): a configured path that does
not exist is a `ConfigError` naming it, raised before any row is read, so a
typo stops a run before any GPU work. Then no row can stop the run: a damaged
file, an undecodable line or a malformed row becomes a `RowError` (the file,
the line or row, the reason code, the byte offset where there is one), and any
other exception raised while handling a row becomes one too (`unexpected_error`).
Duplicates (equal normalised content, from any source) are kept once, first
occurrence wins, so a sample id names one conversation turn exactly once in a
dataset. docs/corpus.md lists the shapes, the reason codes and the limits.
"""

from __future__ import annotations

import logging
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from pipeline.corpus.config import CorpusConfig, CorpusSourceConfig
from pipeline.corpus.formats import MalformedRow, to_messages
from pipeline.corpus.records import Conversation, RowError, conversation_hash
from pipeline.corpus.sources import RawRow, ResolvedSource
from pipeline.logs import kv

log = logging.getLogger(__name__)

DEFAULT_DOMAIN = "unknown"


@dataclass
class IngestStats:
    rows: int = 0  # records read, error records included
    conversations: int = 0
    duplicates: int = 0
    errors_by_reason: Counter = field(default_factory=Counter)
    default_domain: int = 0  # rows without a domain of their own, tagged with the default
    skipped_parts: Counter = field(default_factory=Counter)  # non-text parts dropped, by type


@dataclass
class Corpus:
    conversations: list[Conversation]
    errors: list[RowError]
    stats: IngestStats

    def by_domain(self) -> Counter:
        return Counter(c.domain for c in self.conversations)


def _tag(value: object) -> str | None:
    """A usable domain tag, or None: a blank, non-string or undecodable value is no tag."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return unicodedata.normalize("NFC", value.strip())


def _domain(row: dict, source: CorpusSourceConfig) -> tuple[str, bool]:
    """(domain, whether it is the default) of a row; see CorpusSourceConfig."""
    if source.domain_column is not None:
        tag = _tag(row.get(source.domain_column))
    elif source.domain:
        return source.domain, False
    else:
        tag = _tag(row.get("domain"))
    return (tag, False) if tag else (source.domain or DEFAULT_DOMAIN, True)


def _text_bytes(value: object, limit: int) -> int:
    """UTF-8 bytes of the strings in a parsed row, counted up to just past `limit`."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) if item.isascii() else len(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, (bytes, bytearray)):
            total += len(item)
        else:
            total += 8
    return total


def resolve_sources(config: CorpusConfig) -> list[ResolvedSource]:
    """Every configured source with its files listed; one ConfigError naming the bad paths."""
    from pipeline.config import ConfigError
    from pipeline.corpus.sources import resolve

    resolved, problems = [], []
    for i, source in enumerate(config.sources):
        try:
            resolved.append(resolve(source))
        except (FileNotFoundError, PermissionError, ValueError) as err:
            problems.append(f"corpus.sources[{i}].path: {err}")
    if problems:
        raise ConfigError("; ".join(problems) + " (fix the path or remove the source)")
    return resolved


def _source_rows(
    config: CorpusConfig, sources: list[ResolvedSource]
) -> Iterator[tuple[str, RawRow, CorpusSourceConfig | None]]:
    """(source name, raw row, source config) for every row; None config for synthetic rows."""
    if config.synthetic is not None:
        from pipeline.corpus.synthetic import generate

        syn = config.synthetic
        for index, conv in enumerate(generate(syn)):
            yield f"synthetic-s{syn.seed}", RawRow(f"synthetic:{syn.seed}#{index}", conv), None
    from pipeline.corpus.sources import read_rows

    for source in sources:
        for raw in read_rows(source, max_row_bytes=config.max_row_bytes):
            yield source.name, raw, source.config


def _conversation(
    name: str,
    raw: RawRow,
    source: CorpusSourceConfig | None,
    config: CorpusConfig,
    stats: IngestStats,
) -> Conversation:
    """The row's conversation, or MalformedRow."""
    if raw.row is None:
        raise MalformedRow(raw.reason or "unparsable_row", raw.detail or "unreadable row")
    if raw.size is None and source is not None:  # parsed rows (Parquet, HF, JSON arrays)
        size = _text_bytes(raw.row, config.max_row_bytes)
        if size > config.max_row_bytes:
            raise MalformedRow(
                "row_too_large",
                f"the row holds over {size} bytes of text, over max_row_bytes {config.max_row_bytes}",
            )
    skipped: Counter = Counter()
    messages = to_messages(raw.row, non_text_parts=config.non_text_parts, skipped=skipped)
    if source is None:
        domain, defaulted = raw.row["domain"], False
    else:
        domain, defaulted = _domain(raw.row, source)
    stats.skipped_parts.update(skipped)
    stats.default_domain += defaulted
    return Conversation(conversation_hash(messages), name, domain, tuple(messages), raw.location)


def load_corpus(config: CorpusConfig) -> Corpus:
    """Read, normalise and deduplicate every configured source."""
    sources = resolve_sources(config)
    conversations: list[Conversation] = []
    errors: list[RowError] = []
    stats = IngestStats()
    seen: set[str] = set()
    for name, raw, source in _source_rows(config, sources):
        stats.rows += 1
        try:
            conv = _conversation(name, raw, source, config, stats)
        except Exception as err:
            if isinstance(err, MalformedRow):
                reason, detail = err.reason, err.detail
            else:  # a row must never stop the run, whatever it trips over
                log.debug("row %s raised", raw.location, exc_info=True)
                reason, detail = "unexpected_error", f"{type(err).__name__}: {err}"
            errors.append(RowError(name, raw.location, reason, detail, raw.byte_offset))
            stats.errors_by_reason[reason] += 1
            continue
        if conv.conversation_id in seen:
            stats.duplicates += 1
            continue
        seen.add(conv.conversation_id)
        conversations.append(conv)
    stats.conversations = len(conversations)
    log.info(
        "corpus loaded %s",
        kv(
            rows=stats.rows,
            conversations=stats.conversations,
            duplicates=stats.duplicates,
            errors=sum(stats.errors_by_reason.values()),
            default_domain=stats.default_domain,
            skipped_parts=sum(stats.skipped_parts.values()),
        ),
    )
    for reason, count in sorted(stats.errors_by_reason.items()):
        log.warning("malformed rows %s", kv(reason=reason, count=count))
    return Corpus(conversations, errors, stats)
