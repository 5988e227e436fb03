"""The regeneration stage: corpus -> work units -> replicas -> shards -> committed versions.

`plan` reads the corpus and cuts it into deterministic units; the driver
skips the units the dataset's latest version already holds (resume is a
listing, `DatasetSink.on_write_start`) and feeds the rest to a pool of replica
actors, as many units each as it asks for to keep its engine full
(`feeder.py`: requests from all of them share the engine). Each actor
regenerates its units and writes their shards itself; only a shard's small
`ShardInfo` comes back, and the sink publishes finished units in batches as
new versions (exactly once: a unit's shard name derives from its inputs, and
a version appears only through a create-only manifest put).

Faults (`scheduler.py`): a replica that dies is restarted by Ray and its
units go back in the queue, preferring another replica; a hung engine is
killed and restarted; transient errors are retried with backoff, up to
`max_unit_attempts`; deterministic ones fail their unit at once. A driver
crash loses only uncommitted units, which the next run redoes.

`run_local` runs the same plan, feeder, unit jobs and sink in this process
on one backend, without Ray (the toy reference shards and tests use it).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError
from pipeline.logs import kv
from pipeline.regenerate.config import PipelineConfig
from pipeline.regenerate.scheduler import SchedulerLimits, UnitScheduler
from pipeline.regenerate.summary import Progress, RunSummary
from pipeline.regenerate.unit import UnitResult, UnitSpec
from pipeline.regenerate.units import WorkUnit

if TYPE_CHECKING:
    from pipeline.corpus.ingest import Corpus
    from pipeline.shards.schema import Provenance
    from pipeline.shards.sink import DatasetSink

log = logging.getLogger(__name__)


class RegenerateError(PipelineError):
    """The run could not finish every unit; what was finished is committed."""


@dataclass(frozen=True)
class RunPlan:
    corpus: Corpus
    provenance: Provenance
    units: list[WorkUnit]


def plan(config: PipelineConfig) -> RunPlan:
    """The corpus, the provenance and the work units of a config; no Ray, no engine."""
    from pipeline.corpus.ingest import load_corpus
    from pipeline.regenerate.provenance import build_provenance, corpus_version, run_identity
    from pipeline.regenerate.units import num_buckets_for, plan_units, run_fingerprint

    corpus = load_corpus(config.corpus)
    provenance = build_provenance(config, corpus_version(corpus.conversations))
    fingerprint = run_fingerprint(run_identity(provenance, config.regenerate.min_answer_tokens))
    buckets = config.regenerate.num_buckets or num_buckets_for(
        len(corpus.conversations), config.regenerate.conversations_per_unit
    )
    return RunPlan(corpus, provenance, plan_units(corpus.conversations, buckets, fingerprint))


def _start(config: PipelineConfig) -> tuple[RunPlan, DatasetSink, RunSummary, list[WorkUnit]]:
    """Plan, open the sink, record ingestion errors; the units still to do."""
    from pipeline.shards.manifest import Dataset
    from pipeline.shards.sink import DatasetSink

    run = plan(config)
    if not run.corpus.conversations:
        raise RegenerateError(
            f"the corpus has no usable conversation ({run.corpus.stats.rows} rows read, "
            f"{len(run.corpus.errors)} error records, by reason "
            f"{dict(run.corpus.stats.errors_by_reason)}): nothing to regenerate"
        )
    dataset = Dataset.open(config.output.uri, endpoint_url=config.output.endpoint_url)
    sink = DatasetSink(
        dataset,
        run.provenance,
        commit_every_units=config.regenerate.commit_every_units,
        commit_every_seconds=config.regenerate.commit_every_seconds,
    )
    done = sink.on_write_start()
    summary = RunSummary(dataset.uri, version=sink.version, units_total=len(run.units))
    summary.errors_by_reason.update(e.reason for e in run.corpus.errors)
    dataset.write_errors(f"ingest-{run.provenance.corpus_version}", run.corpus.errors)
    todo = [u for u in run.units if u.unit_id not in done]
    summary.units_skipped = len(run.units) - len(todo)
    log.info(
        "plan %s",
        kv(units=len(run.units), already_committed=summary.units_skipped, to_do=len(todo)),
    )
    return run, sink, summary, todo


def run_local(config: PipelineConfig, *, show_progress: bool = False) -> RunSummary:
    """The whole stage in this process on one backend (no Ray); resumable like `run_regenerate`."""
    from transformers import AutoTokenizer

    from pipeline.regenerate.feeder import EngineFeeder
    from pipeline.regenerate.replica import feed_limits
    from pipeline.targets.loader import load_target
    from pipeline.targets.resolve import resolve_model

    started = time.monotonic()
    run, sink, summary, todo = _start(config)
    if todo:
        spec = UnitSpec.from_config(config, run.provenance)
        backend = load_target(config.target, capture=True)
        summary.engine_start_seconds = time.monotonic() - started
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model(config.target.model), revision=config.target.revision
        )
        feeder = EngineFeeder(backend, tokenizer, feed_limits(config.regenerate, backend))
        progress = Progress(sum(u.num_answers for u in todo), show_progress)
        steady = time.monotonic()
        try:
            futures = {feeder.submit_unit(unit, spec): unit for unit in todo}
            for future in as_completed(futures):
                result = future.result()
                sink.on_unit_written(result.shard)
                summary.add(result)
                progress.update(futures[future].num_answers, result)
        except BaseException as err:
            sink.on_write_failed(err)
            raise
        finally:
            progress.close()
            feeder.close()
            backend.close()
        summary.steady_seconds = time.monotonic() - steady
    summary.version = sink.on_write_complete()
    summary.seconds = time.monotonic() - started
    return summary


def run_regenerate(
    config: PipelineConfig, *, show_progress: bool = True, summary_json: str | Path | None = None
) -> RunSummary:
    """Regenerate the configured corpus into the configured dataset on Ray; resumable.

    `summary_json`: also write the summary there (written even when units
    failed, before the error is raised).
    """
    from pipeline.regenerate.pool import close_replicas, init_ray, start_replicas

    started = time.monotonic()
    run, sink, summary, todo = _start(config)
    if not todo:
        summary.seconds = time.monotonic() - started
        if summary_json is not None:
            summary.write_json(summary_json)
        return summary
    spec = UnitSpec.from_config(config, run.provenance)
    init_ray(config.ray)
    engines = time.monotonic()
    actors, ready = start_replicas(
        config.target, config.replicas, config.regenerate, replica_name_prefix(config)
    )
    summary.engine_start_seconds = time.monotonic() - engines
    log.info(
        "replicas ready %s",
        kv(
            replicas=len(actors),
            engine_start_s=round(summary.engine_start_seconds, 1),
            units_in_flight_each=ready[0]["units_wanted"],
            requests_in_flight_each=ready[0]["max_requests_in_flight"],
        ),
    )
    # Rates count from here: every engine is up.
    progress = Progress(sum(u.num_answers for u in todo), show_progress)
    steady = time.monotonic()
    regen = config.regenerate
    scheduler = UnitScheduler(
        actors,
        [info["units_wanted"] for info in ready],
        lambda actor, unit: actor.regenerate.remote(unit, spec),
        SchedulerLimits(
            max_unit_attempts=regen.max_unit_attempts,
            unit_timeout_s=regen.unit_timeout_s,
            replica_stall_timeout_s=regen.replica_stall_timeout_s,
        ),
    )

    def on_done(unit: WorkUnit, result: UnitResult) -> None:
        sink.on_unit_written(result.shard)
        summary.add(result)
        progress.update(unit.num_answers, result)

    try:
        report = scheduler.run(todo, on_done)
        summary.retries = report.retries
        summary.units_failed = sorted(report.failed)
        for unit_id, why in sorted(report.failed.items()):
            log.error("unit failed %s", kv(unit=unit_id, why=why))
        summary.steady_seconds = time.monotonic() - steady
        summary.replica_stats = _replica_stats(actors)
    except BaseException as err:
        sink.on_write_failed(err)
        raise
    finally:
        progress.close()
        close_replicas(actors)
    summary.version = sink.on_write_complete()
    summary.seconds = time.monotonic() - started
    if summary_json is not None:
        summary.write_json(summary_json)
    if summary.units_failed:
        raise RegenerateError(
            f"{len(summary.units_failed)} unit(s) failed: {', '.join(summary.units_failed)} "
            f"(reasons in the log); the {summary.units_done} finished units are committed "
            f"(version {summary.version}); rerun to retry the rest"
        )
    return summary


def _replica_stats(actors: list[Any]) -> list[dict[str, Any]]:
    """Each replica's feeder counters (best effort: a dead replica reports nothing)."""
    import ray

    out = []
    for actor in actors:
        try:
            out.append(ray.get(actor.stats.remote(), timeout=30))
        except Exception:  # a replica that died at the end has no counters to give
            out.append({})
    return out


def replica_name_prefix(config: PipelineConfig) -> str:
    """Ray actor names of a run's replicas: `<run name>-regenerate-<i>`."""
    return f"{config.name}-regenerate"
