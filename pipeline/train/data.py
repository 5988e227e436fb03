"""Stream committed shards into DSpark training batches, resumable to the sample.

* **Validation before step 0**, the held-out split by a hash of the sample id
  and decoding: pipeline/table/split.py (`DatasetSplit`, which evaluation
  reads too); `TrainingData` is a DatasetSplit with epochs and following.
* **Order**: each epoch permutes the shards and, inside every row group, the
  rows (seeded by `seed` and the epoch). Only the small columns (sample id,
  domain) are read to plan an epoch; tensors are decoded only for the rows a
  rank trains on.
* **Split** `samples`: global batch i is the same G samples whatever the world
  size; rank r takes every world_size-th of them. `shards`: rank r reads only
  shards r::world_size (no duplicate reads on large clusters).
* **Position**: (epoch, samples consumed in the epoch); resuming skips exactly
  what was consumed without decoding it.
* **Micro-batches**: a rank's share of a step's global batch comes as
  micro-batches of `micro_batch_size` samples, each packed on its own; the
  trainer accumulates their gradients. Anchors are seeded per sample, so the
  split changes nothing but the memory a forward needs.
* Anchors and packing: packing.py.
* **Prefetch**: a background thread builds batches ahead.
* **Follow** (`data.follow`, `train --follow`): training starts while the
  regeneration still commits. Epoch 0 reads the start version's shards, then
  each newer version's new shards as it lands (rows permuted per version),
  until no writer holds the dataset's lease; later epochs read the version
  epoch 0 ended on. The order is a function of the commit history alone, so
  a resumed run replays it exactly; positions past epoch 0 name their version.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.drafts.spec import DraftSpec
from pipeline.logs import kv
from pipeline.table.pins import version_pin
from pipeline.table.reader import next_version
from pipeline.table.split import DatasetSplit, RowRef
from pipeline.train.config import TrainDataConfig
from pipeline.train.packing import TrainBatch, derived_seed, pack, sample_anchors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataPosition:
    epoch: int
    consumed: int  # samples of this epoch's order already trained on (all ranks)
    version: int | None = None  # following runs past epoch 0: the version read

    def to_dict(self) -> dict:
        """As checkpoints store it (no `version` key unless set: the layout of old runs)."""
        out = {"epoch": self.epoch, "consumed": self.consumed}
        return out if self.version is None else {**out, "version": self.version}


class TrainingData(DatasetSplit):
    """One dataset version opened for training: a DatasetSplit with epoch plans and following."""

    def __init__(self, cfg: TrainDataConfig, *, pin_prefix: str | None = None) -> None:
        self.cfg = cfg
        self.pin_prefix = pin_prefix  # a run's pins (table/pins.py): each followed version
        super().__init__(
            cfg.uri,
            version=cfg.version,
            endpoint_url=cfg.endpoint_url,
            domains=cfg.domains,
            exclude_sources=cfg.exclude_sources,
            heldout_fraction=cfg.heldout_fraction,
            max_seq_len=cfg.max_seq_len,
            allow_empty=cfg.follow,
        )

    def follow_order(self, seed: int) -> Iterator[list[RowRef]]:
        """Epoch 0 of a following run: the rows of the start version's shards, then of
        each newer version's new shards as it lands, until no writer holds the lease.
        Per version the new shards are permuted, and the rows inside each row group."""
        manifest = self.manifest
        self.entries, seen = [], set()
        while manifest is not None:
            self.manifest = manifest
            fresh = [e for e in manifest.shards if e.path not in seen]
            seen.update(e.path for e in fresh)
            first = len(self.entries)
            self.entries.extend(fresh)
            per_shard = [self._shard_rows(first + k)[0] for k in range(len(fresh))]
            rng = np.random.default_rng(derived_seed(seed, "follow", manifest.version))
            order: list[RowRef] = []
            for k in rng.permutation(len(fresh)).tolist():
                for refs in per_shard[k]:
                    order.extend(refs[i] for i in rng.permutation(len(refs)))
            log.info(
                "following %s",
                kv(dataset=self.dataset.uri, version=manifest.version, new_samples=len(order)),
            )
            yield order
            manifest = next_version(
                self.dataset, manifest, self.cfg.follow_poll_s, self.cfg.follow_timeout_s
            )
            if manifest is not None and self.pin_prefix is not None:
                name = version_pin(self.pin_prefix, manifest.version)
                self.dataset.pin(manifest.version, name, owner="train --follow")

    def epoch_order(self, epoch: int, seed: int, shards: set[int] | None = None) -> list[RowRef]:
        """This epoch's sample order: shards permuted, rows permuted inside each row group."""
        rng = np.random.default_rng(derived_seed(seed, "epoch", epoch))
        groups: dict[tuple[int, int], list[RowRef]] = {}
        for ref in self.train_rows:
            if shards is None or ref.shard in shards:
                groups.setdefault((ref.shard, ref.row_group), []).append(ref)
        by_shard: dict[int, list[list[RowRef]]] = {}
        for (s, _g), refs in sorted(groups.items()):
            by_shard.setdefault(s, []).append(refs)
        order: list[RowRef] = []
        for s in rng.permutation(sorted(by_shard)).tolist():
            for refs in by_shard[s]:
                order.extend(refs[i] for i in rng.permutation(len(refs)))
        return order


def iter_batches(
    data: TrainingData,
    spec: DraftSpec,
    *,
    seed: int,
    global_batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    start: DataPosition = DataPosition(0, 0),
    micro_batch_size: int | None = None,
) -> Iterator[tuple[list[TrainBatch], DataPosition]]:
    """Endless (micro-batches of this rank's share of a step, position after the step)
    pairs from `start` on; `micro_batch_size` samples each (None: one micro-batch)."""
    cfg = data.cfg
    by_shards = cfg.split == "shards"
    per_step = global_batch_size // world_size if by_shards else global_batch_size
    size = micro_batch_size

    def step(chunk: list[RowRef], epoch: int) -> list[TrainBatch]:
        mine = chunk if by_shards else chunk[rank::world_size]
        samples = data.decode(mine)
        anchors = sample_anchors(samples, num_anchors=cfg.num_anchors, seed=seed, epoch=epoch)
        n = size or len(samples)
        return [
            pack(
                samples[j : j + n], anchors[j : j + n], spec=spec, max_row_tokens=cfg.max_row_tokens
            )
            for j in range(0, len(samples), n)
        ]

    epoch, consumed = start.epoch, start.consumed
    if cfg.follow and epoch == 0:
        pending: list[RowRef] = []
        done = 0  # samples of epoch 0 in the steps so far
        for refs in data.follow_order(seed):
            pending.extend(refs)
            while len(pending) >= per_step:
                chunk, pending = pending[:per_step], pending[per_step:]
                done += per_step
                if done > consumed:  # a resumed run replays the history up to its position
                    yield step(chunk, 0), DataPosition(0, done)
        if done == 0:
            raise ValueError(
                f"{data.where}: the followed versions hold {len(pending)} training samples, "
                f"which cannot fill one batch of {per_step}: lower global_batch_size or add data"
            )
        log.info("epoch 0 followed to its end %s", kv(version=data.manifest.version, samples=done))
        data.use_version(data.manifest.version)  # later epochs: the version epoch 0 ended on
        epoch, consumed = 1, 0
    elif start.version is not None and start.version != data.manifest.version:
        data.use_version(start.version)
    version = data.manifest.version if cfg.follow else None
    local_shards = set(range(rank, len(data.entries), world_size)) if by_shards else None
    while True:
        order = data.epoch_order(epoch, seed, local_shards)
        num_batches = len(order) // per_step
        if num_batches == 0:
            raise ValueError(
                f"{data.where}: {len(order)} training samples{f' on rank {rank}' if by_shards else ''} "
                f"cannot fill one batch of {per_step}: lower global_batch_size or add data"
            )
        for i in range(consumed // per_step, num_batches):
            chunk = order[i * per_step : (i + 1) * per_step]
            yield step(chunk, epoch), DataPosition(epoch, (i + 1) * per_step, version)
        epoch, consumed = epoch + 1, 0


def heldout_batches(
    data: TrainingData, spec: DraftSpec, *, seed: int, batch_size: int, limit: int | None = None
) -> Iterator[TrainBatch]:
    """Batches of the held-out split, in a fixed order (for evaluation)."""
    refs = data.heldout_rows[:limit] if limit else data.heldout_rows
    for i in range(0, len(refs), batch_size):
        samples = data.decode(refs[i : i + batch_size])
        anchors = sample_anchors(samples, num_anchors=data.cfg.num_anchors, seed=seed, epoch=-1)
        yield pack(samples, anchors, spec=spec, max_row_tokens=data.cfg.max_row_tokens)
