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
from pathlib import Path

from pipeline.corpus.config import CorpusConfig, CorpusSourceConfig
from pipeline.corpus.formats import MalformedRow, to_messages
from pipeline.corpus.identity import conversation_hash
from pipeline.corpus.mixture import SourceCount, select
from pipeline.corpus.records import Conversation, RowError
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
    near_duplicates: int = 0
    # Per source: available, quota, selected, near-duplicates, weight, licence (mixture.py).
    by_source: dict[str, SourceCount] = field(default_factory=dict)


@dataclass
class Corpus:
    conversations: list[Conversation]
    errors: list[RowError]
    stats: IngestStats

    def by_domain(self) -> Counter:
        return Counter(c.domain for c in self.conversations)

    def licences(self) -> dict[str, str]:
        """Source name -> licence, for every source that states one (provenance)."""
        return {n: c.licence for n, c in sorted(self.stats.by_source.items()) if c.licence}


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


def _all_sources(config: CorpusConfig) -> list[CorpusSourceConfig]:
    """The configured sources, then the self-prompt file as one more source."""
    sp = config.self_prompts
    if sp is None:
        return list(config.sources)
    own = CorpusSourceConfig(
        path=sp.path,
        name=sp.name,
        format="jsonl",
        domain=sp.domain,
        weight=sp.weight,
        licence="written by the target (the target's licence applies)",
    )
    return [*config.sources, own]


def resolve_sources(config: CorpusConfig) -> list[ResolvedSource]:
    """Every configured source with its files listed; one ConfigError naming the bad paths."""
    from pipeline.config import ConfigError
    from pipeline.corpus.sources import resolve

    resolved, problems = [], []
    sp = config.self_prompts
    if sp is not None and not Path(sp.path).exists():
        raise ConfigError(
            f"corpus.self_prompts.path: {sp.path}: no such file (`dspark-targets regenerate` "
            "samples it first; or run `dspark-targets self-prompts --config C`)"
        )
    for i, source in enumerate(_all_sources(config)):
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


def windows(messages: list, max_exchanges: int | None) -> list[list]:
    """The conversation cut into consecutive windows of at most `max_exchanges` exchanges
    (a leading system message heads each); itself when shorter or when None."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    body = messages[len(system) :]
    starts = [i for i, m in enumerate(body) if m["role"] == "user"]
    if max_exchanges is None or len(starts) <= max_exchanges:
        return [messages]
    cuts = [0, *starts[max_exchanges::max_exchanges], len(body)]
    return [system + body[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def _source_counts(
    config: CorpusConfig, sources: list[ResolvedSource], stats: IngestStats
) -> dict[str, float]:
    """Every source's weight by name, in config order (synthetic first); their counts made."""
    weights: dict[str, float] = {}
    if config.synthetic is not None:
        weights[f"synthetic-s{config.synthetic.seed}"] = 1.0
        stats.by_source[f"synthetic-s{config.synthetic.seed}"] = SourceCount(licence="generated")
    for source in sources:
        if source.name in weights:
            from pipeline.config import ConfigError

            raise ConfigError(
                f"corpus.sources: two sources are named {source.name!r}; give each a `name`"
            )
        weights[source.name] = source.config.weight
        stats.by_source[source.name] = SourceCount(
            weight=source.config.weight, licence=source.config.licence
        )
    return weights


def _conversations(
    name: str,
    raw: RawRow,
    source: CorpusSourceConfig | None,
    config: CorpusConfig,
    stats: IngestStats,
) -> list[Conversation]:
    """The row's conversation (or its windows), or MalformedRow."""
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
    row = raw.row
    if source is not None and source.prompt_column is not None:
        if source.prompt_column not in row:
            raise MalformedRow(
                "unknown_format", f"no `{source.prompt_column}` column (prompt_column)"
            )
        row = {"prompt": row[source.prompt_column]}
    messages = to_messages(row, non_text_parts=config.non_text_parts, skipped=skipped)
    if source is None:
        domain, defaulted = raw.row["domain"], False
    else:
        domain, defaulted = _domain(raw.row, source)
    stats.skipped_parts.update(skipped)
    stats.default_domain += defaulted
    parts = windows(messages, source.max_exchanges if source is not None else None)
    if len(parts) == 1:
        return [
            Conversation(conversation_hash(messages), name, domain, tuple(messages), raw.location)
        ]
    return [
        Conversation(conversation_hash(part), name, domain, tuple(part), f"{raw.location}/w{k}")
        for k, part in enumerate(parts)
    ]


def load_corpus(config: CorpusConfig) -> Corpus:
    """Read, normalise and deduplicate every configured source."""
    sources = resolve_sources(config)
    by_source: dict[str, list[Conversation]] = {}
    errors: list[RowError] = []
    stats = IngestStats()
    weights, seen = _source_counts(config, sources, stats), set()
    for name, raw, source in _source_rows(config, sources):
        stats.rows += 1
        try:
            convs = _conversations(name, raw, source, config, stats)
        except Exception as err:
            if isinstance(err, MalformedRow):
                reason, detail = err.reason, err.detail
            else:  # a row must never stop the run, whatever it trips over
                log.debug("row %s raised", raw.location, exc_info=True)
                reason, detail = "unexpected_error", f"{type(err).__name__}: {err}"
            errors.append(RowError(name, raw.location, reason, detail, raw.byte_offset))
            stats.errors_by_reason[reason] += 1
            continue
        for conv in convs:
            if conv.conversation_id in seen:
                stats.duplicates += 1
                continue
            seen.add(conv.conversation_id)
            by_source.setdefault(name, []).append(conv)
    conversations = select(
        {name: by_source.get(name, []) for name in weights},
        weights,
        size=config.size,
        seed=config.mixture_seed,
        near_duplicates=config.near_duplicates,
        counts=stats.by_source,
    )
    stats.conversations = len(conversations)
    stats.near_duplicates = sum(c.near_duplicates for c in stats.by_source.values())
    log.info(
        "corpus loaded %s",
        kv(
            rows=stats.rows,
            conversations=stats.conversations,
            duplicates=stats.duplicates,
            near_duplicates=stats.near_duplicates,
            errors=sum(stats.errors_by_reason.values()),
            default_domain=stats.default_domain,
            skipped_parts=sum(stats.skipped_parts.values()),
        ),
    )
    for name, count in stats.by_source.items():
        if count.quota is not None and count.selected < count.quota:
            log.warning(
                "corpus source short of its share %s",
                kv(
                    source=name,
                    quota=count.quota,
                    selected=count.selected,
                    available=count.available,
                ),
            )
    for reason, count in sorted(stats.errors_by_reason.items()):
        log.warning("malformed rows %s", kv(reason=reason, count=count))
    return Corpus(conversations, errors, stats)
