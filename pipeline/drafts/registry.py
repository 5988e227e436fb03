"""The one table of draft kinds: everything that differs between dspark, dflash and eagle3.

Every place that would ask `if kind == ...` asks this table instead: the
training config (defaults and the fields a kind fixes), spec resolution (the
heads), the trainer (model class, loss weights, slot weights, mask token),
the export (the speculators format each kind writes and reads, and which
format a kind's layout exports as), the evaluator (the drafter) and serving
in vLLM (the speculative method, whether vLLM's CPU build serves it, the
engine's environment, whether a served export drafts with the heads). A new
kind is one entry here and its folder (model, export format, drafter);
tests/drafts/test_registry.py fails on a kind name compared anywhere else.

No torch at import: the training config reads this table, and the CLI must
start fast. Model classes, weight functions and drafters are imported when
called; the format writers are plain dict builders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.drafts.dspark.export import dflash_config, dflash_fields, dspark_config, dspark_fields
from pipeline.drafts.eagle3.export import eagle3_config, eagle3_fields
from pipeline.drafts.spec import DraftSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from pipeline.drafts.drafter import Drafter


@dataclass(frozen=True)
class LossWeights:
    """Default weights of `ce CE + l1 L1 + bce BCE + kl KL` (docs/design.md#the-draft-dspark), L1 =
    ||p_draft - p_target||_1 as the DSpark paper (Eq. 10) and its reference code use it."""

    ce: float
    l1: float
    bce: float
    kl: float


@dataclass(frozen=True)
class SpeculatorsFormat:
    """The speculators format named after a kind (`speculators_model_type`)."""

    # (spec, *, verifier, target_config) -> config.json; ValueError for a spec it cannot hold.
    config: Callable[..., dict]
    # config.json -> the DraftSpec fields this format decides (the rest: speculators.py).
    spec_fields: Callable[[dict], dict]
    # The export carries the target's embed_tokens and lm_head (speculators' Eagle3 reads them).
    target_tensors: bool = False


@dataclass(frozen=True)
class DraftKind:
    name: str
    # The nn.Module class, built as cls(spec, embed, lm_head); imported when called.
    model: Callable[[], type[nn.Module]]
    # (B,) loss weight of each block slot / unrolled step, from the LossConfig's
    # gamma (slot decay) and ttt_step_decay; imported when called.
    step_weights: Callable[..., torch.Tensor]
    # (report name, draft module, use_heads) -> the Drafter the evaluator drafts with.
    drafter: Callable[[str, nn.Module, bool], Drafter]
    # The speculators format of this kind's name.
    format: SpeculatorsFormat
    loss: LossWeights
    # Default of DraftConfig.sample_from_anchor (True: slot k drafts token a+k+1).
    sample_from_anchor: bool
    # Markov logit-bias and confidence heads (DSpark).
    heads: bool = False
    # Mask slots embed a mask token (False: every slot reads a real token).
    mask_token: bool = True
    # The kind whose format a draft of the fill-in layout exports as instead (dspark:
    # its backbone as dflash, what vLLM's CPU build serves; its own form goes beside).
    fill_in_format: str | None = None
    # The aux ids a draft of this kind reads when `draft.aux_layer_ids` is unset, from
    # the target's layer count (used only if the dataset captured them all; None, or
    # not captured: every captured layer).
    default_layers: Callable[[int], tuple[int, ...]] | None = None
    # Serving in vLLM (the method: `vllm_method`). None: vLLM's CPU build serves it
    # whole; else why this method needs a GPU (the reason a CPU serving run reports).
    vllm_needs_gpu: str | None = None
    # Environment the vLLM engine needs to serve this method.
    vllm_env: Mapping[str, str] = field(default_factory=dict)
    # DraftConfig defaults of this kind, and the fields it fixes: field -> (value, why).
    config_defaults: Mapping[str, Any] = field(default_factory=dict)
    fixed: Mapping[str, tuple[Any, str]] = field(default_factory=dict)

    @property
    def export_format(self) -> str:
        """The speculators format a draft of this kind exports as: its own name."""
        return self.name

    @property
    def vllm_method(self) -> str:
        """vLLM's speculative method (`--speculative-config`'s `method`) that serves this
        kind's format: its name, the export's `speculators_model_type`."""
        return self.export_format

    def build(
        self,
        spec: DraftSpec,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        frozen_dtype: torch.dtype | None = None,
    ) -> nn.Module:
        """The draft module of `spec` with the target's frozen embeddings and lm_head
        (stored in `frozen_dtype`, None: as given)."""
        return self.model()(spec, embed, lm_head, frozen_dtype)

    def format_for(self, spec: DraftSpec) -> str:
        """The speculators format `spec` exports as (its layout decides for dspark)."""
        if self.fill_in_format and not spec.sample_from_anchor:
            return self.fill_in_format
        return self.export_format


def _block_model() -> type[nn.Module]:
    from pipeline.drafts.dspark.model import DSparkDraft

    return DSparkDraft


def _eagle3_model() -> type[nn.Module]:
    from pipeline.drafts.eagle3.model import Eagle3Draft

    return Eagle3Draft


def _slot_weights(spec: DraftSpec, *, gamma: float, ttt_step_decay: float) -> torch.Tensor:
    from pipeline.drafts.dspark.model import slot_weights

    return slot_weights(block_size=spec.block_size, first_offset=spec.first_offset, gamma=gamma)


def _ttt_weights(spec: DraftSpec, *, gamma: float, ttt_step_decay: float) -> torch.Tensor:
    from pipeline.drafts.eagle3.model import ttt_step_weights

    return ttt_step_weights(num_steps=spec.block_size, decay=ttt_step_decay)


def _eagle3_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layer: vLLM's default for an eagle3 draft without
    `eagle_aux_hidden_state_layer_ids` (2, L // 2, L - 3); 30 layers -> (2, 15, 27)."""
    return (2, num_layers // 2, num_layers - 3)


def _block_drafter(name: str, model: nn.Module, use_heads: bool) -> Drafter:
    """DSpark and DFlash draft blocks left to right (a DFlash draft has no heads to use)."""
    from pipeline.drafts.dspark.drafter import DSparkDrafter

    return DSparkDrafter(name, model, use_heads=use_heads)


def _eagle3_drafter(name: str, model: nn.Module, use_heads: bool) -> Drafter:
    """EAGLE-3's step loop (no heads: `use_heads` changes nothing)."""
    from pipeline.drafts.eagle3.drafter import Eagle3Drafter

    return Eagle3Drafter(name, model)


KINDS: dict[str, DraftKind] = {
    kind.name: kind
    for kind in (
        # DFlash backbone + Markov logit-bias head + confidence head (docs/design.md#the-draft-dspark).
        DraftKind(
            name="dspark",
            model=_block_model,
            step_weights=_slot_weights,
            drafter=_block_drafter,
            format=SpeculatorsFormat(config=dspark_config, spec_fields=dspark_fields),
            loss=LossWeights(ce=0.1, l1=0.9, bce=1.0, kl=0.0),
            sample_from_anchor=True,
            heads=True,
            fill_in_format="dflash",
            vllm_needs_gpu="vLLM's dspark method needs Model Runner V2 (Triton, a GPU); "
            "on CPU serve the draft's DFlash backbone export",
            vllm_env={"VLLM_USE_V2_MODEL_RUNNER": "1"},  # dspark exists only in Model Runner V2
        ),
        # The same backbone without the heads, trained with CE only.
        DraftKind(
            name="dflash",
            model=_block_model,
            step_weights=_slot_weights,
            drafter=_block_drafter,
            format=SpeculatorsFormat(config=dflash_config, spec_fields=dflash_fields),
            loss=LossWeights(ce=1.0, l1=0.0, bce=0.0, kl=0.0),
            sample_from_anchor=False,
            fixed={
                "sample_from_anchor": (
                    False,
                    "sample_from_anchor=true is the DSpark layout; vLLM's dflash method serves "
                    "only the fill-in layout: set kind: dspark or sample_from_anchor: false",
                )
            },
        ),
        # The EAGLE-3 baseline (eagle3/model.py): one layer, the training-time
        # test unrolled block_size steps, forward KL to the target only.
        DraftKind(
            name="eagle3",
            model=_eagle3_model,
            step_weights=_ttt_weights,
            drafter=_eagle3_drafter,
            format=SpeculatorsFormat(
                config=eagle3_config, spec_fields=eagle3_fields, target_tensors=True
            ),
            loss=LossWeights(ce=0.0, l1=0.0, bce=0.0, kl=1.0),
            sample_from_anchor=True,
            mask_token=False,
            default_layers=_eagle3_layers,
            config_defaults={"num_layers": 1, "block_size": 7},
            fixed={
                "num_layers": (
                    1,
                    "kind: eagle3 is the one-layer EAGLE-3 baseline: set num_layers: 1 "
                    "(or leave it unset)",
                ),
                "sample_from_anchor": (
                    True,
                    "kind: eagle3 drafts from the token just sampled (step s predicts token "
                    "a+s+1): leave sample_from_anchor unset",
                ),
            },
        ),
    )
}


# DraftConfig.kind of a config that names none.
DEFAULT_KIND = "dspark"

# The speculative methods vLLM serves the kinds' exports with (the evaluation config's
# `method` keys take one of these).
VLLM_METHODS: dict[str, DraftKind] = {kind.vllm_method: kind for kind in KINDS.values()}


def draft_kind(name: str) -> DraftKind:
    """The registry entry of `name`; ValueError naming the known kinds otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown draft kind {name!r}; known: {sorted(KINDS)}") from None


def serving_kind(method: str) -> DraftKind:
    """The kind whose exports vLLM serves as `method`; ValueError naming the methods."""
    try:
        return VLLM_METHODS[method]
    except KeyError:
        raise ValueError(
            f"unknown vLLM speculative method {method!r}; one of {sorted(VLLM_METHODS)}"
        ) from None


def format_kind(config: dict, where: str) -> DraftKind:
    """The kind whose format wrote an export's config.json (its `speculators_model_type`)."""
    model_type = config.get("speculators_model_type")
    if model_type is None:
        raise ValueError(f"{where}: no speculators_model_type; is this a dspark-targets export?")
    if model_type not in KINDS:
        raise ValueError(
            f"{where}: speculators_model_type {model_type!r} is none of {sorted(KINDS)}"
        )
    return KINDS[model_type]


def served_method(config: dict, where: str) -> str:
    """The vLLM speculative method that serves the export whose config.json is `config`."""
    return format_kind(config, where).vllm_method


def drafts_with_heads(config: dict, where: str) -> bool:
    """Whether vLLM drafts with the heads of the export whose config.json is `config`:
    its own format serves them (dspark), and a DSpark draft's dflash export carries them
    in a heads file that the project's vLLM plugin serves where it supports the vLLM
    version (pipeline/drafts/vllm_plugin.py); otherwise vLLM drafts with the backbone."""
    from pipeline.drafts.dspark.export import HEADS_KEY
    from pipeline.drafts.vllm_plugin import supports, vllm_version

    if serving_kind(served_method(config, where)).heads:
        return True
    return HEADS_KEY in config and supports(vllm_version())


def vllm_env(method: str | None) -> dict[str, str]:
    """The environment a vLLM engine needs to serve `method` (None: no draft)."""
    return dict(serving_kind(method).vllm_env) if method else {}


def build_draft(
    spec: DraftSpec,
    embed: torch.Tensor,
    lm_head: torch.Tensor,
    frozen_dtype: torch.dtype | None = None,
) -> nn.Module:
    """The draft module of `spec.kind` (DSpark/DFlash: DSparkDraft; eagle3: Eagle3Draft)."""
    return draft_kind(spec.kind).build(spec, embed, lm_head, frozen_dtype)
