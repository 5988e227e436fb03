"""The one door from a model reference to a model: hub name, local directory, GGUF, or `toy:NAME`.

Every stage that needs the target's files or facts comes through here:
`resolve_model` turns a reference into something `from_pretrained` loads (a
toy target is built and cached on first use; a hub name passes through and
is fetched by the library that loads it; a GGUF file, or a packaged one by its
short name, is converted once into a checked bf16 directory, `targets.gguf`)
and `target_shape` reads the facts
the capture and the shards depend on (layers, hidden size, aux ids). Which
references need building is the scheme registry's (schemes.py): the toy wing
plugs `toy:` in from above, so production paths never load it.
`loader.load_target` builds a backend on the resolved model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def check_model_ref(model: str) -> None:
    """Raise ValueError (one line) for a reference its scheme cannot resolve (schemes.py)."""
    from pipeline.targets.schemes import scheme_of

    scheme = scheme_of(model)
    if scheme is not None:
        scheme.check(model)


def resolve_model(model: str, cache_dir: Path | None = None) -> str:
    """A path or hub name `from_pretrained` loads: a scheme's target is built (or found) first."""
    from pipeline.targets.schemes import scheme_of

    scheme = scheme_of(model)
    return str(scheme.build(model, cache_dir)) if scheme is not None else model


def text_config(model_dir: str, revision: str | None = None) -> Any:
    """The language model's config (`text_config` of a multimodal checkpoint, else the config)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, revision=revision)
    return getattr(config, "text_config", config)


@dataclass(frozen=True)
class TargetShape:
    """The facts about a target that captured data depends on."""

    num_layers: int  # L decoder layers
    hidden_size: int  # H
    # Captured residual streams, ascending (docs/design.md#the-layer-convention).
    aux_layer_ids: tuple[int, ...]


def default_aux_layer_ids(num_layers: int, num_layers_captured: int = 5) -> tuple[int, ...]:
    """DFlash/DSpark spacing: target layers evenly from 1 to L-3, as aux ids (+1).

    36 layers -> target layers [1, 9, 17, 25, 33] -> aux ids [2, 10, 18, 26, 34].
    Shallow targets (L < 8) take every layer from 1 to L-1 instead.
    """
    if num_layers < 8:
        return tuple(range(1, num_layers))
    start, end = 1, num_layers - 3
    k = num_layers_captured
    layers = sorted({round(start + i * (end - start) / (k - 1)) for i in range(k)})
    return tuple(layer + 1 for layer in layers)


def check_aux_layer_ids(aux_ids: Sequence[int], num_layers: int, model: str) -> None:
    """Aux ids name streams after 0..L-1 layers; the final (normed) state is captured apart."""
    bad = [a for a in aux_ids if not 0 <= a < num_layers]
    if bad:
        raise ValueError(
            f"target {model}: aux_layer_ids {bad} out of range for {num_layers} layers "
            f"(valid: 0..{num_layers - 1}; the final hidden state is always captured separately)"
        )


def shape_of(
    num_layers: int, hidden_size: int, aux_layer_ids: Sequence[int] | None, model: str
) -> TargetShape:
    """The shape for a model's depth and width; None aux ids take the DFlash spacing."""
    aux = tuple(aux_layer_ids or default_aux_layer_ids(num_layers))
    check_aux_layer_ids(aux, num_layers, model)
    return TargetShape(int(num_layers), int(hidden_size), aux)


def target_shape(
    model_dir: str, revision: str | None, aux_layer_ids: Sequence[int] | None
) -> TargetShape:
    """Read the target's depth and width from its config and check the given aux ids."""
    text = text_config(model_dir, revision)
    return shape_of(text.num_hidden_layers, text.hidden_size, aux_layer_ids, model_dir)


def eos_token_ids(target_dir: str | Path) -> tuple[int, ...]:
    """The target's end-of-sequence ids (config.json and generation_config.json)."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(target_dir) / name
        if path.exists():
            eos = json.loads(path.read_text()).get("eos_token_id")
            ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return tuple(sorted(int(i) for i in ids))
