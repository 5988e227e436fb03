"""Corpus ingestion: every configured source -> normalised, deduplicated conversations.

Malformed rows become `RowError`s (with the file, the row and the reason) and
the run goes on. Duplicates (equal normalised content, from any source) are
kept once, first occurrence wins, so a sample id names one conversation turn
exactly once in a dataset.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from pipeline.corpus.config import CorpusConfig, CorpusSourceConfig
from pipeline.corpus.formats import MalformedRow, to_messages
from pipeline.corpus.records import Conversation, RowError, conversation_hash
from pipeline.logs import kv

log = logging.getLogger(__name__)


@dataclass
class IngestStats:
    rows: int = 0
    conversations: int = 0
    duplicates: int = 0
    errors_by_reason: Counter = field(default_factory=Counter)


@dataclass
class Corpus:
    conversations: list[Conversation]
    errors: list[RowError]
    stats: IngestStats

    def by_domain(self) -> Counter:
        return Counter(c.domain for c in self.conversations)


def _domain(row: dict, source: CorpusSourceConfig) -> str:
    if source.domain_column is not None:
        value = row.get(source.domain_column)
        if not isinstance(value, str) or not value.strip():
            raise MalformedRow("missing_domain", f"column `{source.domain_column}` is {value!r}")
        return value.strip()
    if source.domain:
        return source.domain
    value = row.get("domain")
    return value.strip() if isinstance(value, str) and value.strip() else "unknown"


def _source_rows(
    config: CorpusConfig,
) -> Iterator[tuple[str, str, dict | None, str | None, CorpusSourceConfig | None]]:
    """(source name, location, row or None, parse error, source config) for every row."""
    if config.synthetic is not None:
        from pipeline.corpus.synthetic import generate

        syn = config.synthetic
        for index, conv in enumerate(generate(syn)):
            yield f"synthetic-s{syn.seed}", f"synthetic:{syn.seed}#{index}", conv, None, None
    from pipeline.corpus.sources import read_rows, source_name

    for source in config.sources:
        name = source_name(source)
        for raw in read_rows(source):
            yield name, raw.location, raw.row, raw.error, source


def load_corpus(config: CorpusConfig) -> Corpus:
    """Read, normalise and deduplicate every configured source."""
    conversations: list[Conversation] = []
    errors: list[RowError] = []
    stats = IngestStats()
    seen: set[str] = set()
    for name, location, row, parse_error, source in _source_rows(config):
        stats.rows += 1
        try:
            if row is None:
                raise MalformedRow("unparsable_row", parse_error or "unreadable")
            messages = to_messages(row)
            domain = _domain(row, source) if source is not None else row["domain"]
        except MalformedRow as err:
            errors.append(RowError(name, location, err.reason, err.detail))
            stats.errors_by_reason[err.reason] += 1
            continue
        conv_id = conversation_hash(messages)
        if conv_id in seen:
            stats.duplicates += 1
            continue
        seen.add(conv_id)
        conversations.append(Conversation(conv_id, name, domain, tuple(messages), location))
    stats.conversations = len(conversations)
    log.info(
        "corpus loaded %s",
        kv(
            rows=stats.rows,
            conversations=stats.conversations,
            duplicates=stats.duplicates,
            errors=sum(stats.errors_by_reason.values()),
        ),
    )
    for reason, count in sorted(stats.errors_by_reason.items()):
        log.warning("malformed rows %s", kv(reason=reason, count=count))
    return Corpus(conversations, errors, stats)
