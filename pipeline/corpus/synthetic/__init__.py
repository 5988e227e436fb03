"""A deterministic multi-domain chat corpus for the toy target, the demo and the tests.

Six domains shaped like the evaluation domains of speculative-decoding papers
(math word problems, code, translation, question answering, summarisation,
open chat). Each domain has its own structure and its own predictability:
translation and summarisation are nearly deterministic given the prompt,
chat is loose. A target trained on it therefore answers with domain structure,
and a draft's acceptance length differs by domain as it does on real models.

Everything derives from the seed: the same spec always yields the same
conversations, in the same order, byte for byte. The "world" (fictional
countries, the toy language's lexicon) derives from a fixed world seed, so
facts stay consistent across corpus seeds and a held-out corpus (another seed)
asks about the same world.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from pydantic import Field, field_validator

from pipeline.config import ConfigModel
from pipeline.corpus.identity import conversation_hash
from pipeline.corpus.synthetic.domains import DOMAINS

Message = dict[str, str]
Conversation = dict[str, object]

# Bump when generated text changes: models trained on the corpus key their caches on it.
CORPUS_VERSION = 1

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant. Answer clearly.",
    "You are a patient tutor.",
)


class SyntheticCorpusConfig(ConfigModel):
    """The synthetic corpus as a config section (`corpus.synthetic`) and as a call argument."""

    num_conversations: int = Field(gt=0)
    seed: int = 0
    # Share of conversations with more than one assistant turn.
    multi_turn_fraction: float = Field(0.3, ge=0.0, le=1.0)
    # Restrict to some domains; empty: all, round-robin so every domain gets its share.
    domains: tuple[str, ...] = ()

    @field_validator("domains")
    @classmethod
    def _known_domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(DOMAINS))
        if unknown:
            raise ValueError(f"unknown domains {unknown}; known: {sorted(DOMAINS)}")
        return value


def conversation_id(messages: list[Message]) -> str:
    """The record's `id`: its content hash, shortened (stable across runs and machines)."""
    return conversation_hash(messages)[:24]


def generate(spec: SyntheticCorpusConfig) -> Iterator[Conversation]:
    """Yield conversations `{"id", "domain", "messages"}` in a deterministic order."""
    domains = list(spec.domains or DOMAINS)
    for index in range(spec.num_conversations):
        # One RNG per conversation: conversation i is the same whatever N is.
        rng = random.Random(f"{spec.seed}:{index}")
        domain = domains[index % len(domains)]
        num_turns = rng.randint(2, 3) if rng.random() < spec.multi_turn_fraction else 1
        messages: list[Message] = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for user, assistant in DOMAINS[domain](rng, num_turns):
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": assistant})
        yield {"id": conversation_id(messages), "domain": domain, "messages": messages}


def write_corpus(spec: SyntheticCorpusConfig, out_dir: str | Path) -> list[Path]:
    """Write `corpus.jsonl` and `corpus.parquet` (same rows) into `out_dir`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(generate(spec))
    jsonl = out / "corpus.jsonl"
    tmp = jsonl.with_suffix(".jsonl.tmp")
    with tmp.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(jsonl)
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema(
        [("id", pa.string()), ("domain", pa.string()), ("messages", pa.list_(message))]
    )
    table = pa.Table.from_pylist(rows, schema=schema).replace_schema_metadata(
        {
            "dspark.corpus": json.dumps(
                {
                    "generator": "synthetic",
                    "seed": spec.seed,
                    "num_conversations": spec.num_conversations,
                }
            )
        }
    )
    parquet = out / "corpus.parquet"
    pq.write_table(table, parquet.with_suffix(".parquet.tmp"), compression="zstd")
    parquet.with_suffix(".parquet.tmp").replace(parquet)
    return [jsonl, parquet]
