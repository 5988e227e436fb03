"""The regeneration stage on Ray: corpus -> work units -> replica actors -> shards -> commit.

The driver plans deterministic units, skips the ones the dataset's latest
version already holds (resume is a listing), and feeds the rest to a pool of
replica actors, at most `max_units_in_flight_per_replica` each (backpressure).
Each actor regenerates a unit and writes its shard itself; only the shard's
small `ShardInfo` comes back. Finished units are published in batches as new
versions (exactly once: a unit's shard name derives from its inputs, and a
version appears only through a create-only manifest put).

Faults: a replica that dies (OOM, node loss, SIGKILL) is restarted by Ray and
its unit goes back in the queue, preferring another replica, up to
`max_unit_attempts`. A driver crash loses only uncommitted units, which the
next run redoes; their shard files are overwritten under the same names.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.corpus.records import RowError
from pipeline.errors import PipelineError
from pipeline.logs import kv
from pipeline.regenerate.config import PipelineConfig
from pipeline.regenerate.unit import UnitResult, UnitSpec
from pipeline.regenerate.units import WorkUnit

log = logging.getLogger(__name__)


class RegenerateError(PipelineError):
    """The run could not finish every unit; what was finished is committed."""


@dataclass
class RunSummary:
    dataset_uri: str
    version: int | None = None
    units_total: int = 0
    units_skipped: int = 0  # already committed by an earlier run
    units_done: int = 0
    units_failed: list[str] = field(default_factory=list)
    samples: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    bytes_written: int = 0
    errors_by_reason: Counter = field(default_factory=Counter)
    retries: int = 0
    seconds: float = 0.0

    def lines(self) -> list[str]:
        rate = self.generated_tokens / self.seconds if self.seconds else 0.0
        out = [
            f"dataset: {self.dataset_uri} (version {self.version if self.version is not None else 'none'})",
            f"units: {self.units_done} done, {self.units_skipped} already committed, "
            f"{len(self.units_failed)} failed, of {self.units_total}; {self.retries} retried",
            f"samples: {self.samples}; tokens: {self.prompt_tokens} prompt + {self.generated_tokens} "
            f"generated ({rate:.1f} generated tok/s)",
            f"bytes written: {self.bytes_written / 1e6:.2f} MB in {self.seconds:.1f} s",
        ]
        if self.errors_by_reason:
            out.append(
                "errors by reason: "
                + ", ".join(f"{r}={n}" for r, n in sorted(self.errors_by_reason.items()))
            )
        if self.units_failed:
            out.append("failed units: " + ", ".join(self.units_failed))
        return out


# --------------------------------------------------------------------------- the replica actor


class RegenerateReplica:
    """A replica actor body: one capturing backend and its tokenizer."""

    def __init__(self, target_config) -> None:
        from transformers import AutoTokenizer

        from pipeline.logs import setup_logging
        from pipeline.targets.resolve import load_target, resolve_model

        setup_logging()
        self.backend = load_target(target_config, capture=True)
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(target_config.model))

    def ready(self) -> int:
        import os

        return os.getpid()

    def regenerate(self, unit: WorkUnit, spec: UnitSpec) -> UnitResult:
        from pipeline.regenerate.unit import regenerate_unit

        return regenerate_unit(self.backend, self.tokenizer, unit, spec)

    def close(self) -> None:
        """Stop the engine and remove its capture spool (ray.kill alone runs no finalizer)."""
        self.backend.close()


# --------------------------------------------------------------------------- provenance


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


def build_provenance(config: PipelineConfig, corpus_version: str):
    """What produced the data: target identity, layers, codec, generation, versions."""
    from transformers import AutoConfig

    from pipeline.shards.schema import Provenance
    from pipeline.targets.identity import tokenizer_hash, weights_revision
    from pipeline.targets.resolve import check_aux_layer_ids, default_aux_layer_ids, resolve_model

    model_dir = resolve_model(config.target.model)
    hf_config = AutoConfig.from_pretrained(model_dir, revision=config.target.revision)
    text_config = getattr(hf_config, "text_config", hf_config)
    num_layers = text_config.num_hidden_layers
    aux = tuple(config.target.aux_layer_ids or default_aux_layer_ids(num_layers))
    check_aux_layer_ids(aux, num_layers, model_dir)
    generation = config.generation.model_dump(mode="json")
    generation.update(
        dtype=config.target.dtype,
        max_model_len=config.target.max_model_len,
        turns=config.regenerate.turns,
        backend=config.target.backend,
    )
    return Provenance(
        target_name=config.target.model,
        target_revision=weights_revision(model_dir, config.target.revision),
        tokenizer_hash=tokenizer_hash(model_dir),
        aux_layer_ids=aux,
        hidden_size=text_config.hidden_size,
        codec=config.output.codec,
        corpus_version=corpus_version,
        code_version=code_version(),
        generation=generation,
    )


def corpus_version(conversations) -> str:
    import hashlib

    h = hashlib.sha256()
    for conv in sorted(conversations, key=lambda c: c.conversation_id):
        h.update(f"{conv.conversation_id}|{conv.domain}|{conv.source}\n".encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------- the driver


def plan(config: PipelineConfig):
    """(corpus, provenance, units) for a config; no Ray, no engine."""
    from pipeline.corpus.ingest import load_corpus
    from pipeline.regenerate.units import num_buckets_for, plan_units, run_fingerprint

    corpus = load_corpus(config.corpus)
    provenance = build_provenance(config, corpus_version(corpus.conversations))
    identity = {
        k: v for k, v in provenance.to_dict().items() if k not in ("code_version", "corpus_version")
    }
    fingerprint = run_fingerprint(
        {"provenance": identity, "min_answer_tokens": config.regenerate.min_answer_tokens}
    )
    buckets = config.regenerate.num_buckets or num_buckets_for(
        len(corpus.conversations), config.regenerate.conversations_per_unit
    )
    return corpus, provenance, plan_units(corpus.conversations, buckets, fingerprint)


def _write_ingest_errors(dataset, errors: list[RowError], corpus_id: str) -> None:
    if errors:
        body = "".join(json.dumps(e.to_dict()) + "\n" for e in errors).encode()
        with dataset.storage.open_write(f"errors/ingest-{corpus_id}.jsonl") as fh:
            fh.write(body)


class _Committer:
    """Publishes finished shards in batches; retries a version race on top of the new latest."""

    def __init__(self, dataset, every_units: int, every_seconds: float) -> None:
        self.dataset, self.every_units, self.every_seconds = dataset, every_units, every_seconds
        self.pending: list[Any] = []
        self.last = time.monotonic()
        self.version: int | None = dataset.latest_version()

    def add(self, info) -> None:
        self.pending.append(info)
        if (
            len(self.pending) >= self.every_units
            or time.monotonic() - self.last >= self.every_seconds
        ):
            self.flush()

    def flush(self) -> None:
        from pipeline.shards.manifest import CommitConflict

        if not self.pending:
            return
        for attempt in range(5):
            try:
                manifest = self.dataset.commit(self.pending)
                break
            except CommitConflict:
                if attempt == 4:
                    raise
                log.warning("commit raced another writer; retrying on the new latest version")
        self.version = manifest.version
        log.info("committed %s", kv(version=manifest.version, new_shards=len(self.pending)))
        self.pending, self.last = [], time.monotonic()


def run_regenerate(config: PipelineConfig, *, show_progress: bool = True) -> RunSummary:
    """Regenerate the configured corpus into the configured dataset; resumable."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    from pipeline.regenerate.replica import close_replicas, init_ray, start_actors
    from pipeline.shards.manifest import Dataset

    started = time.monotonic()
    corpus, provenance, units = plan(config)
    dataset = Dataset.open(config.output.uri, endpoint_url=config.output.endpoint_url)
    summary = RunSummary(dataset.uri, units_total=len(units))
    summary.errors_by_reason.update(e.reason for e in corpus.errors)
    _write_ingest_errors(dataset, corpus.errors, provenance.corpus_version)
    done = dataset.committed_units() if dataset.latest_version() is not None else set()
    queue = deque((u, 1) for u in units if u.unit_id not in done)
    summary.units_skipped = len(units) - len(queue)
    summary.version = dataset.latest_version()
    log.info(
        "plan %s", kv(units=len(units), already_committed=summary.units_skipped, to_do=len(queue))
    )
    if not queue:
        summary.seconds = time.monotonic() - started
        return summary

    spec = UnitSpec(
        dataset_uri=config.output.uri,
        endpoint_url=config.output.endpoint_url,
        provenance=provenance,
        generation=config.generation,
        turns=config.regenerate.turns,
        max_model_len=config.target.max_model_len,
        min_answer_tokens=config.regenerate.min_answer_tokens,
        batch_size=config.regenerate.batch_size,
    )
    committer = _Committer(
        dataset, config.regenerate.commit_every_units, config.regenerate.commit_every_seconds
    )
    progress = _Progress(sum(u.num_answers for u, _ in queue), show_progress)
    init_ray(config.ray)
    actors = start_actors(
        RegenerateReplica, config.target, config.replicas, replica_name_prefix(config)
    )
    per_actor = config.regenerate.max_units_in_flight_per_replica
    in_flight: dict[Any, tuple[WorkUnit, int, int]] = {}  # future -> (unit, attempt, actor index)
    load = Counter()
    failed_on: dict[str, set[int]] = {}
    try:
        while queue or in_flight:
            while queue:
                unit, attempt = queue[0]
                index = _pick_actor(
                    len(actors), load, per_actor, failed_on.get(unit.unit_id, set())
                )
                if index is None:
                    break
                queue.popleft()
                future = actors[index].regenerate.remote(unit, spec)
                in_flight[future] = (unit, attempt, index)
                load[index] += 1
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            future = ready[0]
            unit, attempt, index = in_flight.pop(future)
            load[index] -= 1
            try:
                result: UnitResult = ray.get(future)
            except (RayActorError, RayTaskError) as err:
                failed_on.setdefault(unit.unit_id, set()).add(index)
                if attempt >= config.regenerate.max_unit_attempts:
                    log.error(
                        "unit failed for good %s",
                        kv(unit=unit.unit_id, attempts=attempt, error=type(err).__name__),
                    )
                    summary.units_failed.append(unit.unit_id)
                else:
                    log.warning(
                        "unit will be retried %s",
                        kv(unit=unit.unit_id, attempt=attempt, error=type(err).__name__),
                    )
                    summary.retries += 1
                    queue.append((unit, attempt + 1))
                continue
            committer.add(result.shard)
            summary.units_done += 1
            summary.samples += result.num_samples
            summary.prompt_tokens += result.num_prompt_tokens
            summary.generated_tokens += result.num_generated_tokens
            summary.bytes_written += result.shard.bytes
            summary.errors_by_reason.update(e.reason for e in result.errors)
            progress.update(unit.num_answers, result)
        committer.flush()
    finally:
        try:
            committer.flush()
        finally:
            progress.close()
            close_replicas(actors)
    summary.version = committer.version
    summary.seconds = time.monotonic() - started
    if summary.units_failed:
        raise RegenerateError(
            f"{len(summary.units_failed)} unit(s) failed after {config.regenerate.max_unit_attempts} "
            f"attempts: {', '.join(summary.units_failed)}; the {summary.units_done} finished units are "
            f"committed (version {summary.version}); rerun to retry the rest"
        )
    return summary


def replica_name_prefix(config: PipelineConfig) -> str:
    """Ray actor names of a run's replicas: `<run name>-regenerate-<i>`."""
    return f"{config.name}-regenerate"


def _pick_actor(num: int, load: Counter, limit: int, avoid: set[int]) -> int | None:
    """The least-loaded actor with room, preferring ones this unit has not failed on."""
    candidates = [i for i in range(num) if load[i] < limit]
    if not candidates:
        return None
    fresh = [i for i in candidates if i not in avoid] or candidates
    return min(fresh, key=lambda i: (load[i], i))


class _Progress:
    """A progress bar over answers with samples/s, generated tokens/s and ETA."""

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.started = time.monotonic()
        self.tokens = 0
        self.bar = tqdm(total=total, unit="sample", disable=not enabled, dynamic_ncols=True)

    def update(self, answers: int, result: UnitResult) -> None:
        self.tokens += result.num_generated_tokens
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self.bar.set_postfix_str(f"{self.tokens / elapsed:.0f} tok/s, errors {len(result.errors)}")
        self.bar.update(answers)

    def close(self) -> None:
        self.bar.close()
