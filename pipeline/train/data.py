"""Stream committed shards into DSpark training batches, resumable to the sample.

* **Validation before step 0**: the dataset's provenance (layer convention,
  aux layer ids, hidden size, target name) is checked against the draft and
  the target checkpoint; a mismatch is an error naming the dataset and field.
* **Order**: each epoch permutes the shards and, inside every row group, the
  rows (seeded by `seed` and the epoch). Only the small columns (sample id,
  domain) are read to plan an epoch; tensors are decoded only for the rows a
  rank trains on.
* **Split** `samples`: global batch i is the same G samples whatever the world
  size; rank r takes every world_size-th of them. `shards`: rank r reads only
  shards r::world_size (no duplicate reads on large clusters).
* **Position**: (epoch, samples consumed in the epoch); resuming skips exactly
  what was consumed without decoding it.
* **Held-out split** by a hash of the sample id: training never sees those ids.
* **Micro-batches**: a rank's share of a step's global batch comes as
  micro-batches of `micro_batch_size` samples, each packed on its own; the
  trainer accumulates their gradients. Anchors are seeded per sample, so the
  split changes nothing but the memory a forward needs.
* Truncation, anchors and packing: packing.py.
* **Prefetch**: a background thread builds batches ahead.
* **Follow** (`data.follow`, `train --follow`): training starts while the
  regeneration still commits. Epoch 0 reads the start version's shards, then
  each newer version's new shards as it lands (rows permuted per version),
  until no writer holds the dataset's lease; later epochs read the version
  epoch 0 ended on. The order is a function of the commit history alone, so
  a resumed run replays it exactly; positions past epoch 0 name their version.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.logs import kv
from pipeline.shards.manifest import Dataset, Manifest, ShardEntry
from pipeline.shards.pins import version_pin
from pipeline.shards.reader import (
    TrainingSample,
    decode_rows,
    next_version,
    open_shard,
    read_row_group,
)
from pipeline.shards.schema import VLLM_AUX_CONVENTION, Provenance
from pipeline.train.config import TrainDataConfig
from pipeline.train.drafts.spec import DraftSpec
from pipeline.train.packing import TrainBatch, derived_seed, pack, sample_anchors, truncate

log = logging.getLogger(__name__)


class DataMismatchError(ValueError):
    """The dataset was captured for another target or layer set than the draft expects."""


@dataclass(frozen=True)
class DataPosition:
    epoch: int
    consumed: int  # samples of this epoch's order already trained on (all ranks)
    version: int | None = None  # following runs past epoch 0: the version read

    def to_dict(self) -> dict:
        """As checkpoints store it (no `version` key unless set: the layout of old runs)."""
        out = {"epoch": self.epoch, "consumed": self.consumed}
        return out if self.version is None else {**out, "version": self.version}


@dataclass(frozen=True)
class RowRef:
    shard: int  # index into TrainingData.entries (the manifest's shards, or those followed)
    row_group: int
    row: int  # row within the row group
    sample_id: str


def is_heldout(sample_id: str, fraction: float) -> bool:
    """Stable across runs and machines: a hash of the id, not a random draw."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(sample_id.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


class TrainingData:
    """One dataset version opened for training: provenance checks, epoch plans, decoding."""

    def __init__(self, cfg: TrainDataConfig, *, pin_prefix: str | None = None) -> None:
        self.cfg = cfg
        self.pin_prefix = pin_prefix  # a run's pins (shards/pins.py): each followed version
        self.dataset = Dataset.open(cfg.uri, endpoint_url=cfg.endpoint_url)
        self.use_version(cfg.version)
        if not self.manifest.shards and not cfg.follow:
            raise DataMismatchError(
                f"{self.dataset.uri} version {self.manifest.version} has no shards"
            )

    def use_version(self, version: int | None) -> None:
        """Read `version` (None: the newest) from now on; indexes are rebuilt lazily."""
        self.manifest: Manifest = self.dataset.manifest(version)
        self.entries: list[ShardEntry] = list(self.manifest.shards)
        self._rows: list[RowRef] | None = None
        self._heldout: list[RowRef] | None = None
        self._cache: tuple[tuple[int, int], object] | None = None

    @property
    def provenance(self) -> Provenance:
        return self.manifest.provenance

    @property
    def where(self) -> str:
        return f"{self.dataset.uri} (version {self.manifest.version})"

    def check(self, *, target: str, target_config: dict, aux_layer_ids: list[int] | None) -> None:
        """Raise DataMismatchError unless this data fits the target and draft."""
        from pipeline.train.drafts.family import language_config

        target_config = language_config(target_config)
        prov = self.provenance
        problems = []
        if prov.layer_convention != VLLM_AUX_CONVENTION:
            problems.append(
                f"layer_convention is {prov.layer_convention!r}, this trainer reads {VLLM_AUX_CONVENTION!r}"
            )
        if prov.last_hidden_state != "after final norm":
            problems.append(
                f"last_hidden_state is {prov.last_hidden_state!r}; the trainer needs it after the "
                "final norm to rebuild target logits with the lm_head"
            )
        if prov.target_name != target:
            problems.append(
                f"captured from target {prov.target_name!r}, but the config trains against {target!r}"
            )
        if prov.hidden_size != target_config["hidden_size"]:
            problems.append(
                f"hidden_size {prov.hidden_size} != the target's hidden_size {target_config['hidden_size']}"
            )
        num_layers = target_config["num_hidden_layers"]
        if any(k > num_layers for k in prov.aux_layer_ids):
            problems.append(
                f"aux_layer_ids {list(prov.aux_layer_ids)} exceed the target's {num_layers} layers"
            )
        if aux_layer_ids is not None and list(aux_layer_ids) != list(prov.aux_layer_ids):
            problems.append(
                f"aux_layer_ids {list(prov.aux_layer_ids)} != draft.aux_layer_ids {list(aux_layer_ids)}"
            )
        if problems:
            raise DataMismatchError(f"{self.where}: " + "; ".join(problems))

    # ------------------------------------------------------------------ planning

    def _index(self) -> None:
        rows, heldout = [], []
        for s in range(len(self.entries)):
            groups, held = self._shard_rows(s)
            rows.extend(ref for group in groups for ref in group)
            heldout.extend(held)
        self._rows, self._heldout = rows, heldout

    def _shard_rows(self, s: int) -> tuple[list[list[RowRef]], list[RowRef]]:
        """Shard `s`'s training rows (one list per row group) and held-out rows; rows
        its version tombstones and other domains are left out (only ids are read)."""
        entry = self.entries[s]
        domains = set(self.cfg.domains) if self.cfg.domains else None
        dropped = frozenset(entry.dropped)  # rows this version tombstones: never trained on
        groups: list[list[RowRef]] = []
        heldout: list[RowRef] = []
        pf, _ = open_shard(self.dataset, entry)
        url = self.dataset.shard_url(entry)
        with pf:
            for g in range(pf.metadata.num_row_groups):
                keys = read_row_group(pf, g, url, ["sample_id", "domain"])
                ids = keys.column("sample_id").to_pylist()
                doms = keys.column("domain").to_pylist()
                group = []
                for r, (sid, dom) in enumerate(zip(ids, doms, strict=True)):
                    if sid in dropped or (domains is not None and dom not in domains):
                        continue
                    ref = RowRef(s, g, r, sid)
                    (heldout if is_heldout(sid, self.cfg.heldout_fraction) else group).append(ref)
                groups.append(group)
        return groups, heldout

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

    @property
    def train_rows(self) -> list[RowRef]:
        if self._rows is None:
            self._index()
        return self._rows

    @property
    def heldout_rows(self) -> list[RowRef]:
        if self._heldout is None:
            self._index()
        return self._heldout

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

    def decode(self, refs: list[RowRef]) -> list[TrainingSample]:
        """Decode exactly these rows (consecutive refs of one row group share one read),
        each truncated to `max_seq_len` tokens."""
        out = []
        i = 0
        while i < len(refs):
            key = (refs[i].shard, refs[i].row_group)
            j = i
            while j < len(refs) and (refs[j].shard, refs[j].row_group) == key:
                j += 1
            table = self._row_group(*key)
            entry = self.entries[key[0]]
            out.extend(
                truncate(s, self.cfg.max_seq_len)
                for s in decode_rows(
                    table.take([r.row for r in refs[i:j]]), self.dataset.shard_url(entry)
                )
            )
            i = j
        return out

    def _row_group(self, shard: int, group: int):
        if self._cache is not None and self._cache[0] == (shard, group):
            return self._cache[1]
        entry = self.entries[shard]
        pf, _ = open_shard(self.dataset, entry)
        with pf:
            table = read_row_group(pf, group, self.dataset.shard_url(entry))
        self._cache = ((shard, group), table)
        return table


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
