"""Incremental refresh: regenerate only what changed and publish the next dataset version.

A refresh (`dspark-targets refresh --config C`, `python -m pipeline refresh` in a
Ray job, or a scheduled RayCronJob/CronJob running it) is the regeneration stage
planned against the dataset's latest version:

1. take the dataset's writer lease (lease.py): a second refresh exits at once
   naming the holder, or waits with `--wait-for-lease`;
2. read the latest version and the corpus snapshot; if the target revision,
   layer set, chat template, codec or generation parameters differ from the
   version's lineage, say so in one line and start a new lineage (everything
   is regenerated; the old versions stay readable);
3. diff the snapshot against the version's live samples by sample id and input
   hash (`partition.diff_corpus`): new and changed samples are regenerated, samples
   no longer in the corpus are tombstoned;
4. run the same units, replicas and sink as `regenerate`; each commit drops the
   old rows of the samples its shards replace, the first one also carries the
   tombstones, so every version in between holds each sample once. The last
   version is N+1 = previous shards + new shards - tombstones, and the rows
   dropped from kept shards are listed in the manifest, not rewritten.

Plain `regenerate` uses the same planning (`planning.plan_against`) without
changes or tombstones: on a grown corpus it regenerates only the new
conversations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.regenerate.config import PipelineConfig
    from pipeline.regenerate.driver.summary import RunSummary


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
