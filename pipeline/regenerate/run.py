"""The regeneration stage: corpus -> work units -> replicas -> shards -> committed versions.

`_start` takes the dataset's writer lease and plans against its latest
version (regenerate/driver/worklist.py): units hold only the samples no version has
yet, so a rerun has nothing to do and a grown corpus adds units of new
conversations only. The driver feeds the units to a pool of replica
actors, as many units each as it asks for to keep its engine full
(`replica/feeder.py`: requests from all of them share the engine). Each actor
regenerates its units and writes their shards itself; only a shard's small
`ShardInfo` comes back, and the sink publishes finished units in batches as
new versions (exactly once per sample: the commit refuses a version that
would list a sample id twice, and a version appears only through a
create-only manifest put).

Faults (`driver/scheduler.py`): a replica that dies is restarted by Ray and its
units go back in the queue, preferring another replica; a hung engine is
killed and restarted; transient errors are retried with backoff, up to
`max_unit_attempts`; deterministic ones fail their unit at once. A driver
crash loses only uncommitted units, which the next run redoes; each attempt
writes a file of its own (attempt-unique, create-only names), and the files
no version names are gc's.

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
from pipeline.regenerate.driver.partition import unit_inputs
from pipeline.regenerate.driver.scheduler import SchedulerLimits, UnitScheduler
from pipeline.regenerate.driver.summary import Progress, RunSummary
from pipeline.regenerate.units import UnitResult, UnitSpec, WorkUnit

if TYPE_CHECKING:
    from pipeline.corpus.ingest import Corpus
    from pipeline.shards.schema import Provenance
    from pipeline.table.sink import DatasetSink

log = logging.getLogger(__name__)


class RegenerateError(PipelineError):
    """The run could not finish every unit; what was finished is committed."""


@dataclass(frozen=True)
class RunPlan:
    corpus: Corpus
    provenance: Provenance
    units: list[WorkUnit]


def _start(
    config: PipelineConfig,
    *,
    refresh: bool = False,
    lease_wait_s: float = 0.0,
    show_progress: bool = False,
) -> tuple[RunPlan, DatasetSink, RunSummary, list[WorkUnit]]:
    """Take the writer lease, plan against the latest version, open the sink; the units to do.

    Planning is per sample (regenerate/driver/worklist.py): units hold only samples no
    version has yet (`refresh`: also changed ones; removed ones are tombstoned).
    """
    from pipeline.regenerate.driver.worklist import plan_against
    from pipeline.table.dataset import Dataset
    from pipeline.table.lease import WriteSession
    from pipeline.table.sink import DatasetSink

    if config.corpus.self_prompts is not None:  # before the lease: it runs the target once
        from pipeline.regenerate.driver.self_prompts import ensure_self_prompts

        ensure_self_prompts(config.corpus.self_prompts, config.target, show_progress=show_progress)
    dataset = Dataset.open(config.output.uri, endpoint_url=config.output.endpoint_url)
    mode = "refresh" if refresh else "regenerate"
    session = WriteSession(dataset, owner=f"{config.name} {mode}").start(wait_s=lease_wait_s)
    try:
        planned = plan_against(config, dataset, refresh=refresh)
        if not planned.corpus.conversations:
            raise RegenerateError(
                f"the corpus has no usable conversation ({planned.corpus.stats.rows} rows read, "
                f"{len(planned.corpus.errors)} error records, by reason "
                f"{dict(planned.corpus.stats.errors_by_reason)}): nothing to regenerate"
            )
    except BaseException:
        session.close()
        raise
    if planned.note:
        log.warning("%s", planned.note)  # before any engine starts
    run = RunPlan(planned.corpus, planned.provenance, planned.units)
    sink = DatasetSink(
        dataset,
        run.provenance,
        commit_every_units=config.regenerate.commit_every_units,
        commit_every_seconds=config.regenerate.commit_every_seconds,
        session=session,
        replaced=planned.diff.replaced,
        tombstones=planned.diff.tombstones,
        new_lineage=planned.new_lineage,
        num_buckets=planned.num_buckets,
    )
    sink.on_write_start()
    sink.expected = {u.unit_id for u in run.units}
    todo = list(run.units)
    summary = RunSummary(
        dataset.uri,
        version=sink.version,
        units_total=len(todo) + planned.num_committed_shards,
    )
    summary.units_skipped = planned.num_committed_shards
    summary.errors_by_reason.update(e.reason for e in run.corpus.errors)
    dataset.write_errors(f"ingest-{run.provenance.corpus_version}", run.corpus.errors)
    log.info(
        "plan %s",
        kv(
            mode=mode,
            version=planned.parent_version,
            samples=planned.diff.line(),
            units=len(todo),
            already_committed_shards=planned.num_committed_shards,
        ),
    )
    if not refresh and (planned.diff.changed or planned.diff.removed):
        log.warning(
            "%d changed and %d removed samples are left as they are; `refresh` applies them",
            len(planned.diff.changed),
            len(planned.diff.removed),
        )
    if not todo:  # nothing to regenerate; tombstones or a new lineage still commit
        summary.version = sink.on_write_complete()
    return run, sink, summary, todo


def run_local(
    config: PipelineConfig,
    *,
    show_progress: bool = False,
    refresh: bool = False,
    lease_wait_s: float = 0.0,
) -> RunSummary:
    """The whole stage in this process on one backend (no Ray); resumable like `run_regenerate`."""
    from transformers import AutoTokenizer

    from pipeline.regenerate.replica.actor import feed_limits
    from pipeline.regenerate.replica.feeder import EngineFeeder
    from pipeline.regenerate.replica.writeback_process import start_writeback
    from pipeline.targets.loader import load_target
    from pipeline.targets.resolve import resolve_model

    started = time.monotonic()
    run, sink, summary, todo = _start(
        config, refresh=refresh, lease_wait_s=lease_wait_s, show_progress=show_progress
    )
    if todo:
        spec = UnitSpec.from_config(config, run.provenance)
        backend = load_target(config.target, capture=True)
        summary.engine_start_seconds = time.monotonic() - started
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model(config.target.model), revision=config.target.revision
        )
        regen = config.regenerate
        writeback = start_writeback(regen.writeback, spill_above_bytes=regen.spill_above_bytes)
        feeder = EngineFeeder(
            backend,
            tokenizer,
            feed_limits(regen, backend.max_concurrency),
            writeback=writeback,
        )
        planned = planned_samples(todo, regen.turns)
        progress = Progress(sum(planned.values()), show_progress)
        steady = time.monotonic()
        try:
            futures = {feeder.submit_unit(unit, spec): unit for unit in todo}
            for future in as_completed(futures):
                result = future.result()
                unit = futures[future]
                sink.on_unit_written(result.shard, unit_inputs(unit, config.regenerate.turns))
                summary.add(result)
                progress.update(planned[unit.unit_id], result)
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
    config: PipelineConfig,
    *,
    show_progress: bool = True,
    summary_json: str | Path | None = None,
    refresh: bool = False,
    lease_wait_s: float = 0.0,
) -> RunSummary:
    """Regenerate the configured corpus into the configured dataset on Ray; resumable.

    `summary_json`: also write the summary there (written even when units
    failed, before the error is raised). `refresh`: also regenerate changed
    samples and tombstone removed ones (regenerate/refresh.py).
    """
    started = time.monotonic()
    run, sink, summary, todo = _start(
        config, refresh=refresh, lease_wait_s=lease_wait_s, show_progress=show_progress
    )
    if not todo:
        _finish(summary, started, summary_json)
        return summary
    spec = UnitSpec.from_config(config, run.provenance)
    actors, ready = _start_replicas(config, sink, summary)
    _regenerate_units(config, spec, todo, actors, ready, sink, summary, show_progress)
    summary.version = sink.on_write_complete()
    _finish(summary, started, summary_json)
    if summary.units_failed:
        raise RegenerateError(
            f"{len(summary.units_failed)} unit(s) failed: {', '.join(summary.units_failed)} "
            f"(reasons in the log); the {summary.units_done} finished units are committed "
            f"(version {summary.version}); rerun to retry the rest"
        )
    return summary


def _finish(summary: RunSummary, started: float, summary_json: str | Path | None) -> None:
    """The run's wall time; the summary written where asked."""
    summary.seconds = time.monotonic() - started
    if summary_json is not None:
        summary.write_json(summary_json)


def _start_replicas(
    config: PipelineConfig, sink: DatasetSink, summary: RunSummary
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Ray up and every replica's engine started: (actors, what each reported ready)."""
    from pipeline.regenerate.driver.pool import init_ray, start_replicas

    try:  # a failed start still releases the writer lease and the dataset's session
        init_ray(config.ray)
        engines = time.monotonic()
        actors, ready = start_replicas(
            config.target,
            config.replicas,
            config.regenerate,
            replica_name_prefix(config),
            cpu_host=config.cpu_host,
        )
    except BaseException as err:
        sink.on_write_failed(err)
        raise
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
    return actors, ready


def _scheduler(
    config: PipelineConfig, actors: list[Any], ready: list[dict[str, Any]], spec: UnitSpec
) -> UnitScheduler:
    """Units handed to the replicas as each asks for more, with the run's limits."""
    regen = config.regenerate
    return UnitScheduler(
        actors,
        [info["units_wanted"] for info in ready],
        lambda actor, unit: actor.regenerate.remote(unit, spec),
        SchedulerLimits(
            max_unit_attempts=regen.max_unit_attempts,
            unit_timeout_s=regen.unit_timeout_s,
            replica_stall_timeout_s=regen.replica_stall_timeout_s,
            replica_restart_timeout_s=config.replicas.start_timeout_s,
        ),
        hunger=lambda actor: actor.hungry.remote(),
        ceilings=[info["max_units"] for info in ready],
    )


def _regenerate_units(
    config: PipelineConfig,
    spec: UnitSpec,
    todo: list[WorkUnit],
    actors: list[Any],
    ready: list[dict[str, Any]],
    sink: DatasetSink,
    summary: RunSummary,
    show_progress: bool,
) -> None:
    """Every unit of `todo` through the replicas, each written shard handed to the sink;
    failures and the replicas' statistics into `summary`; the replicas closed after."""
    from pipeline.regenerate.driver.pool import close_replicas

    # Rates count from here: every engine is up.
    planned = planned_samples(todo, config.regenerate.turns)
    progress = Progress(sum(planned.values()), show_progress)
    steady = time.monotonic()
    scheduler = _scheduler(config, actors, ready, spec)

    def on_done(unit: WorkUnit, result: UnitResult) -> None:
        sink.on_unit_written(result.shard, unit_inputs(unit, config.regenerate.turns))
        summary.add(result)
        progress.update(planned[unit.unit_id], result)

    try:
        report = scheduler.run(todo, on_done)
        summary.retries = report.retries
        summary.units_failed = sorted(report.failed)
        for unit_id, why in sorted(report.failed.items()):
            log.error("unit failed %s", kv(unit=unit_id, why=why))
        summary.steady_seconds = time.monotonic() - steady
        summary.replica_stats = _replica_stats(actors)
        for stats, peak in zip(summary.replica_stats, report.peak_units, strict=True):
            stats["peak_units_held"] = peak
    except BaseException as err:
        sink.on_write_failed(err)
        raise
    finally:
        progress.close()
        close_replicas(actors)


def planned_samples(units: list[WorkUnit], turns: str) -> dict[str, int]:
    """Unit id -> the answers it will regenerate under `turns` (the progress bar's units):
    planning already left out the conversations no version lacks."""
    return {u.unit_id: len(unit_inputs(u, turns)) for u in units}


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
