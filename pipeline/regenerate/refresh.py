"""Incremental refresh: regenerate only what changed and publish the next dataset version.

A refresh (`dspark-targets refresh --config C`, `jobs/refresh.py`, or a
scheduled RayCronJob/CronJob running either) is the regeneration stage
planned against the dataset's latest version:

1. take the dataset's writer lease (lease.py): a second refresh exits at once
   naming the holder, or waits with `--wait-for-lease`;
2. read the latest version and the corpus snapshot; if the target revision,
   layer set, chat template, codec or generation parameters differ from the
   version's lineage, say so in one line and start a new lineage (everything
   is regenerated; the old versions stay readable);
3. diff the snapshot against the version's live samples by sample id and input
   hash (`units.diff_corpus`): new and changed samples are regenerated, samples
   no longer in the corpus are tombstoned;
4. run the same units, replicas and sink as `regenerate`; each commit drops the
   old rows of the samples its shards replace, the first one also carries the
   tombstones, so every version in between holds each sample once. The last
   version is N+1 = previous shards + new shards - tombstones, and the rows
   dropped from kept shards are listed in the manifest, not rewritten.

Plain `regenerate` uses the same planning without changes or tombstones: on a
grown corpus it regenerates only the new conversations (`plan_against`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.regenerate.units import CorpusDiff, WorkUnit

if TYPE_CHECKING:
    from pipeline.corpus.ingest import Corpus
    from pipeline.regenerate.config import PipelineConfig
    from pipeline.regenerate.summary import RunSummary
    from pipeline.shards.manifest import Dataset
    from pipeline.shards.schema import Provenance

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetPlan:
    """A regeneration planned against a dataset's latest version."""

    corpus: Corpus
    provenance: Provenance
    units: list[WorkUnit]
    diff: CorpusDiff
    parent_version: int | None
    new_lineage: bool
    num_buckets: int
    num_committed_shards: int  # shards of the lineage the latest version holds
    note: str | None  # the one line that says a new lineage starts, and why


def plan_against(config: PipelineConfig, dataset: Dataset, *, refresh: bool) -> DatasetPlan:
    """Corpus, provenance and units still to do against `dataset`'s latest version; no engine."""
    from pipeline.corpus.ingest import load_corpus
    from pipeline.regenerate.provenance import build_provenance, corpus_version, run_identity
    from pipeline.regenerate.units import diff_corpus, num_buckets_for, plan_units, run_fingerprint
    from pipeline.shards.manifest import LineageMismatch

    cfg = config.regenerate
    corpus = load_corpus(config.corpus)
    provenance = build_provenance(config, corpus_version(corpus.conversations))
    fingerprint = run_fingerprint(run_identity(provenance, cfg.min_answer_tokens))
    latest = dataset.latest_version()
    manifest = dataset.manifest(latest) if latest is not None else None
    fresh_buckets = cfg.num_buckets or num_buckets_for(
        len(corpus.conversations), cfg.conversations_per_unit
    )
    new_lineage, note, num_buckets = False, None, fresh_buckets
    if manifest is not None:
        key = manifest.lineage.key if manifest.lineage else manifest.provenance.lineage_key()
        if provenance.lineage_key() != key:
            diffs = "; ".join(manifest.provenance.lineage_differences(provenance)[:6])
            if not refresh:
                raise LineageMismatch(
                    f"{dataset.uri}: version {latest} was made with other settings ({diffs}); "
                    "run `dspark-targets refresh` to start a new lineage (everything is "
                    "regenerated), or set output.uri to another dataset"
                )
            new_lineage = True
            note = (
                f"new lineage: {diffs}; all {len(corpus.conversations)} conversations are "
                f"regenerated (versions up to {latest} stay readable)"
            )
        elif manifest.lineage is not None:
            num_buckets = manifest.lineage.num_buckets
            if cfg.num_buckets is not None and cfg.num_buckets != num_buckets:
                log.warning(
                    "regenerate.num_buckets=%d is ignored: lineage %s fixed %d buckets when it "
                    "started (a conversation's bucket must not move)",
                    cfg.num_buckets,
                    manifest.lineage.id,
                    num_buckets,
                )
    carried = manifest is not None and not new_lineage
    live = dataset.live_members(latest) if carried else {}
    diff = diff_corpus(corpus.conversations, live, cfg.turns, apply_changes=refresh)
    units = plan_units(
        diff.todo, num_buckets, fingerprint, conversations_per_unit=cfg.conversations_per_unit
    )
    return DatasetPlan(
        corpus=corpus,
        provenance=provenance,
        units=units,
        diff=diff,
        parent_version=latest,
        new_lineage=new_lineage,
        num_buckets=num_buckets,
        num_committed_shards=len(manifest.shards) if carried else 0,
        note=note,
    )


def run_refresh(
    config: PipelineConfig,
    *,
    local: bool = False,
    wait_for_lease_s: float = 0.0,
    show_progress: bool = False,
) -> RunSummary:
    """Refresh `config.output.uri` from `config.corpus`; on Ray, or in this process (`local`)."""
    from pipeline.regenerate.run import run_local, run_regenerate

    if local:
        return run_local(
            config, show_progress=show_progress, refresh=True, lease_wait_s=wait_for_lease_s
        )
    return run_regenerate(
        config, show_progress=show_progress, refresh=True, lease_wait_s=wait_for_lease_s
    )
