"""What a Trainer reads before step 0: the target, the dataset checked against it, the spec.

`prepare_inputs` resolves the target, opens the dataset version and checks its
provenance against the target and the draft config (layer ids, hidden size,
target) before any step runs, selects the captured layers the draft reads,
settles a reduced draft vocabulary and resolves the `DraftSpec` the model is
built from (pipeline/train/loop.py builds it).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.drafts.registry import draft_kind
from pipeline.logs import kv
from pipeline.table.pins import run_pin_prefix
from pipeline.train.config import TrainConfig

if TYPE_CHECKING:
    from pipeline.drafts.spec import DraftSpec
    from pipeline.train.data import TrainingData

log = logging.getLogger(__name__)


@dataclass
class TrainInputs:
    """A worker's checked inputs: the target's directory, the dataset, the draft spec."""

    target_dir: Path
    data: TrainingData  # reads only the layers the spec names
    spec: DraftSpec


@dataclass
class _Target:
    directory: Path
    config: dict[str, Any]  # its config.json
    language: dict[str, Any]  # its language model's config (pipeline/drafts/family.py)


def prepare_inputs(config: TrainConfig, *, out_dir: Path, rank: int) -> TrainInputs:
    """The target resolved, the dataset checked against it and the draft config, the
    layers the draft reads selected, the draft vocabulary settled and the spec resolved.
    Rank 0 logs the layers and writes the draft vocabulary."""
    target = _resolve_target(config)
    data = _open_checked_data(config, target)
    layers = _select_layers(config, data, target, rank=rank)
    draft_vocab = _draft_vocab(config, data, target, out_dir=out_dir, rank=rank)
    spec = config.draft.resolve(
        target.config,
        aux_layer_ids=layers,
        mask_token_id=_mask_token_id(config, target.directory),
        draft_vocab=draft_vocab,
    )
    return TrainInputs(target.directory, data, spec)


def _resolve_target(config: TrainConfig) -> _Target:
    from pipeline.drafts.family import language_config
    from pipeline.targets.resolve import resolve_model

    directory = Path(resolve_model(config.target))
    target_config = json.loads((directory / "config.json").read_text())
    return _Target(directory, target_config, language_config(target_config))


def _open_checked_data(config: TrainConfig, target: _Target) -> TrainingData:
    """The dataset version, its provenance checked against the target and the draft."""
    from pipeline.train.data import TrainingData

    data = TrainingData(config.data, pin_prefix=run_pin_prefix(config.out_dir))
    data.check(
        target=config.target,
        target_config=target.language,
        aux_layer_ids=config.draft.aux_layer_ids,
    )
    return data


def _select_layers(
    config: TrainConfig, data: TrainingData, target: _Target, *, rank: int
) -> tuple[int, ...]:
    """The captured layers the draft reads; every batch carries only their columns."""
    captured = data.provenance.aux_layer_ids
    num_layers = target.language["num_hidden_layers"]
    layers, source = config.draft.layers_to_read(captured, num_layers)
    data.read_layers(layers)  # every batch: these layers' columns of the frame
    if rank == 0:
        log.info(
            "draft reads layers %s",
            kv(aux_layer_ids=list(layers), captured=list(captured), source=source),
        )
    return layers


def _draft_vocab(
    config: TrainConfig, data: TrainingData, target: _Target, *, out_dir: Path, rank: int
) -> tuple[int, ...] | None:
    """The run's reduced draft vocabulary (`draft.draft_vocab_size`), else None."""
    if config.draft.draft_vocab_size is None:
        return None
    from pipeline.train.vocab import run_draft_vocab

    return run_draft_vocab(
        size=config.draft.draft_vocab_size,
        split=data,
        vocab_size=target.language["vocab_size"],
        target_dir=target.directory,
        out_dir=out_dir,
        write=rank == 0,
    )


def _mask_token_id(config: TrainConfig, target_dir: Path) -> int:
    """The token mask slots embed: the config's, else the tokenizer's or a fallback
    (kinds without mask slots get 0, an id that is never embedded)."""
    if config.draft.mask_token_id is not None:
        return config.draft.mask_token_id
    if not draft_kind(config.draft.kind).mask_token:
        return 0
    from pipeline.drafts.target_head import tokenizer_mask_token_id

    return tokenizer_mask_token_id(target_dir)
