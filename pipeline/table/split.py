"""A dataset version read as samples, split into training and held-out rows.

What both readers of a dataset for drafts need, training and evaluation:

* **Validation** (`check`): the dataset's provenance (layer convention, the
  final hidden state after the norm, target name, hidden size, aux layer ids)
  against the target and the draft; a mismatch is a `DataMismatchError`
  naming the dataset and field.
* **Layers**: a draft may read any subset of the captured layers
  (`read_layers`). A sample's `hidden_states` frame is (T, k*H), the captured
  layers side by side in the provenance's order; decoding cuts it to the
  draft's layers here (`select_layers`), the one place training batches and
  the evaluation's held-out rows get their columns from.
* **Held-out split** by a hash of the sample id (`is_heldout`): stable across
  runs and machines, so evaluation reads exactly the rows training never saw.
* **Row index**: only the small columns (sample id, domain) are read to list a
  version's rows (`RowRef`), leaving out the rows the version tombstones and
  other domains; tensors are decoded only for the rows asked for (`decode`),
  each sample cut to `max_seq_len` tokens (`truncate`).

pipeline/train/data.py builds epochs, following and batches on top of it
(`TrainingData`); pipeline/evaluate/run.py reads the held-out rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.corpus.identity import unit_interval
from pipeline.shards.reader import TrainingSample, decode_rows, read_row_group
from pipeline.shards.schema import VLLM_AUX_CONVENTION, Provenance
from pipeline.table.dataset import Dataset
from pipeline.table.manifest import Manifest, ShardEntry
from pipeline.table.reader import open_shard


class DataMismatchError(ValueError):
    """The dataset was captured for another target or layer set than the draft expects."""


@dataclass(frozen=True)
class RowRef:
    shard: int  # index into DatasetSplit.entries (the manifest's shards, or those followed)
    row_group: int
    row: int  # row within the row group
    sample_id: str


def is_heldout(sample_id: str, fraction: float) -> bool:
    """Stable across runs and machines: a hash of the id, not a random draw."""
    if fraction <= 0:
        return False
    return unit_interval(sample_id) < fraction


def missing_layers(layers: Sequence[int], captured: Sequence[int]) -> str | None:
    """Why a draft cannot read `layers` from a dataset that captured `captured` (None: it can)."""
    missing = [i for i in layers if i not in captured]
    if not missing:
        return None
    return (
        f"draft.aux_layer_ids {list(layers)}: {missing} not captured "
        f"(the dataset captured {list(captured)}; a draft reads a subset of them)"
    )


def select_layers(
    sample: TrainingSample, captured: Sequence[int], layers: Sequence[int]
) -> TrainingSample:
    """`sample` whose hidden_states hold only `layers`' columns, in that order.

    The stored frame is (T, k*H): captured layer i (of `captured`, the
    provenance's order) in columns [i*H, (i+1)*H). The same sample comes back
    when `layers` is `captured` (no copy)."""
    captured, layers = tuple(captured), tuple(layers)
    if layers == captured:
        return sample
    if problem := missing_layers(layers, captured):
        raise DataMismatchError(f"sample {sample.sample_id!r}: {problem}")
    t, width = sample.hidden_states.shape
    k = len(captured)
    if width % k:
        raise DataMismatchError(
            f"sample {sample.sample_id!r}: hidden_states has {width} columns, not {k} layers' worth"
        )
    pos = [captured.index(i) for i in layers]
    frame = sample.hidden_states.reshape(t, k, width // k)[:, pos].reshape(t, -1)  # (T, len*H)
    return dataclasses.replace(sample, hidden_states=frame)


def truncate(sample: TrainingSample, max_len: int | None) -> TrainingSample:
    """The first `max_len` tokens of `sample` (itself when it is not longer)."""
    t = len(sample.input_ids)
    if max_len is None or t <= max_len:
        return sample
    return dataclasses.replace(
        sample,
        input_ids=sample.input_ids[:max_len],
        loss_mask=sample.loss_mask[:max_len],
        hidden_states=sample.hidden_states[:max_len],
        last_hidden_state=sample.last_hidden_state[:max_len],
        num_prompt_tokens=min(sample.num_prompt_tokens, max_len),
        num_generated_tokens=max(0, max_len - sample.num_prompt_tokens),
        finish_reason="truncated",
    )


class DatasetSplit:
    """One dataset version opened for reading samples: checks, split, row index, decoding.

    `domains` keeps only those domains (empty: all), `sources` only those corpus
    sources (empty: all) and `exclude_sources` leaves those out (a source left out of
    training, to measure on it alone: a leave-one-source-out split); `heldout_fraction` is the
    share of sample ids held out; `max_seq_len` cuts longer samples (None: no
    limit); `allow_empty` accepts a version without shards (a following run).
    Decoding gives every captured layer until `read_layers` names a subset."""

    def __init__(
        self,
        uri: str,
        *,
        version: int | None = None,
        endpoint_url: str | None = None,
        domains: list[str] | tuple[str, ...] = (),
        sources: list[str] | tuple[str, ...] = (),
        exclude_sources: list[str] | tuple[str, ...] = (),
        heldout_fraction: float = 0.0,
        max_seq_len: int | None = None,
        allow_empty: bool = False,
    ) -> None:
        self.domains = tuple(domains)
        self.sources, self.exclude_sources = tuple(sources), frozenset(exclude_sources)
        self.heldout_fraction = heldout_fraction
        self.max_seq_len = max_seq_len
        self.layers: tuple[int, ...] | None = None  # aux ids decode keeps (None: all captured)
        self.dataset = Dataset.open(uri, endpoint_url=endpoint_url)
        self.use_version(version)
        if not self.manifest.shards and not allow_empty:
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
        """Raise DataMismatchError unless this data fits the target and draft.

        `target_config` is the target's language-model config (a multimodal
        checkpoint's `text_config`: pipeline/drafts/family.py `language_config`)."""
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
        if aux_layer_ids is not None and (
            problem := missing_layers(aux_layer_ids, prov.aux_layer_ids)
        ):
            problems.append(problem)
        if problems:
            raise DataMismatchError(f"{self.where}: " + "; ".join(problems))

    def read_layers(self, layers: Sequence[int] | None) -> None:
        """Decode only `layers` (aux ids, any subset of the captured ones, in the draft's
        order) from now on; None: every captured layer. DataMismatchError, one line,
        naming the dataset, the missing ids and the captured ones otherwise."""
        if layers is not None and (
            problem := missing_layers(layers, self.provenance.aux_layer_ids)
        ):
            raise DataMismatchError(f"{self.where}: {problem}")
        self.layers = None if layers is None else tuple(int(i) for i in layers)

    # ------------------------------------------------------------------ the row index

    def _index(self) -> None:
        rows, heldout = [], []
        for s in range(len(self.entries)):
            groups, held = self._shard_rows(s)
            rows.extend(ref for group in groups for ref in group)
            heldout.extend(held)
        self._rows, self._heldout = rows, heldout

    def _shard_rows(self, s: int) -> tuple[list[list[RowRef]], list[RowRef]]:
        """Shard `s`'s training rows (one list per row group) and held-out rows; rows
        its version tombstones, other domains and sources are left out (only ids are read)."""
        entry = self.entries[s]
        domains = set(self.domains) if self.domains else None
        sources = set(self.sources) if self.sources else None
        dropped = frozenset(entry.dropped)  # rows this version tombstones: never read
        groups: list[list[RowRef]] = []
        heldout: list[RowRef] = []
        pf, _ = open_shard(self.dataset, entry)
        url = self.dataset.shard_url(entry)
        with pf:
            for g in range(pf.metadata.num_row_groups):
                keys = read_row_group(pf, g, url, ["sample_id", "domain", "source"])
                ids = keys.column("sample_id").to_pylist()
                doms = keys.column("domain").to_pylist()
                srcs = keys.column("source").to_pylist()
                group = []
                for r, (sid, dom, src) in enumerate(zip(ids, doms, srcs, strict=True)):
                    if (
                        sid in dropped
                        or (domains is not None and dom not in domains)
                        or (sources is not None and src not in sources)
                        or src in self.exclude_sources
                    ):
                        continue
                    ref = RowRef(s, g, r, sid)
                    (heldout if is_heldout(sid, self.heldout_fraction) else group).append(ref)
                groups.append(group)
        return groups, heldout

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

    # ------------------------------------------------------------------ decoding

    def decode(self, refs: list[RowRef]) -> list[TrainingSample]:
        """Decode exactly these rows (consecutive refs of one row group share one read),
        each truncated to `max_seq_len` tokens, its hidden_states cut to `layers`."""
        captured = self.provenance.aux_layer_ids
        layers = captured if self.layers is None else self.layers
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
                select_layers(truncate(s, self.max_seq_len), captured, layers)
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
