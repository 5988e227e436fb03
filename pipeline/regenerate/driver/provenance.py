"""What produced a regeneration's data: the one place a `Provenance` is built from a config.

Every writer of real shards (the Ray run, the in-process run the toy
reference shards use, the benchmarks) goes through `build_provenance`, so a
dataset's manifest, its shards and its unit ids all describe the target,
layers, template, generation parameters and code the same way.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.corpus.records import Conversation
    from pipeline.regenerate.config import PipelineConfig
    from pipeline.shards.schema import Provenance


def code_version() -> str:
    """Package version, plus the git commit when running from a checkout."""
    from pipeline import __version__

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+g{commit}" if commit else __version__


def corpus_version(conversations: Iterable[Conversation]) -> str:
    """Digest of a corpus snapshot: which conversations, with which domain and source."""
    h = hashlib.sha256()
    for conv in sorted(conversations, key=lambda c: c.conversation_id):
        h.update(f"{conv.conversation_id}|{conv.domain}|{conv.source}\n".encode())
    return h.hexdigest()[:16]


def generation_record(config: PipelineConfig) -> dict[str, Any]:
    """The generation facts stored in provenance: sampling, dtype, context, turns, backend."""
    record = config.generation.model_dump(mode="json")
    record.update(
        dtype=config.target.dtype,
        max_model_len=config.target.max_model_len,
        turns=config.regenerate.turns,
        backend=config.target.backend,
    )
    return record


def build_provenance(
    config: PipelineConfig, corpus_version: str, corpus_sources: dict[str, str] | None = None
) -> Provenance:
    """Target identity (weights, tokenizer/template), layers, codec, generation, versions."""
    from pipeline.shards.schema import Provenance
    from pipeline.targets.identity import tokenizer_hash, weights_revision
    from pipeline.targets.resolve import resolve_model, target_shape

    model_dir = resolve_model(config.target.model)
    shape = target_shape(model_dir, config.target.revision, config.target.aux_layer_ids)
    return Provenance(
        target_name=config.target.model,
        target_revision=weights_revision(model_dir, config.target.revision),
        tokenizer_hash=tokenizer_hash(model_dir),
        aux_layer_ids=shape.aux_layer_ids,
        hidden_size=shape.hidden_size,
        codec=config.output.codec,
        corpus_version=corpus_version,
        code_version=code_version(),
        generation=generation_record(config),
        corpus_sources=dict(corpus_sources or {}),
    )


def run_identity(provenance: Provenance, min_answer_tokens: int) -> dict[str, Any]:
    """Everything that determines a unit's output, for the unit-id fingerprint.

    Code and corpus versions (and the corpus' licences) are left out: a new commit or a
    grown corpus must not change the ids of units whose members and settings are unchanged.
    """
    identity = {
        k: v
        for k, v in provenance.to_dict().items()
        if k not in ("code_version", "corpus_version", "corpus_sources")
    }
    return {"provenance": identity, "min_answer_tokens": min_answer_tokens}
