"""Planning a regeneration against a dataset's latest version: what is still to do, and as which units.

`plan_against` reads the corpus, builds the provenance, compares its lineage
with the latest version's (a new target revision, layer set, template, codec
or generation parameters start a new lineage, said in one line; plain
`regenerate` refuses), diffs the corpus against the version's live samples by
sample id and input hash (`partition.diff_corpus`) and cuts the samples still to
do into units over the lineage's fixed bucket space (`partition.plan_units`), so
a grown corpus adds units and never changes a committed one. No engine, no Ray.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.regenerate.driver.partition import CorpusDiff
from pipeline.regenerate.units import WorkUnit

if TYPE_CHECKING:
    from pipeline.corpus.ingest import Corpus
    from pipeline.regenerate.config import PipelineConfig
    from pipeline.shards.schema import Provenance
    from pipeline.table.dataset import Dataset

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
    from pipeline.regenerate.driver.partition import (
        diff_corpus,
        num_buckets_for,
        plan_units,
        run_fingerprint,
    )
    from pipeline.regenerate.driver.provenance import build_provenance, corpus_version, run_identity
    from pipeline.table.errors import LineageMismatch

    cfg = config.regenerate
    corpus = load_corpus(config.corpus)
    provenance = build_provenance(config, corpus_version(corpus.conversations), corpus.licences())
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
