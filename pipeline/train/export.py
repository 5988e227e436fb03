"""Export a trained draft in the speculators format that vLLM serves (DESIGN.md §10).

A directory with `config.json` (speculators_model_type, transformer_layer_config,
speculators_config with the verifier, aux_hidden_state_layer_ids, block_size,
mask_token_id, Markov/confidence fields) and `model.safetensors` whose tensor
names are the ones vLLM's `qwen3_dflash.py` / `qwen3_dspark.py` loaders read.
Embeddings and lm_head are not saved: vLLM shares the target's.

Layer ids: the config carries the capture convention's aux ids unchanged;
vLLM derives `target_layer_ids = aux_ids - 1` itself when it loads a
speculators config. DFlash drafts get `sliding_window_non_causal: true`, or
vLLM would run the bidirectional block causally (measured: tau 2.48 vs 3.18).

A DSpark draft trained in the fill-in layout (`sample_from_anchor: false`)
also exports its backbone as a DFlash draft: the same tensors minus the two
heads. vLLM's CPU build serves `dflash` but not `dspark` (Triton-only runner),
so that export is how a DSpark checkpoint is checked end to end on CPU.

EAGLE-3 (`speculators_model_type: "eagle3"`, vLLM's `Eagle3Qwen3ForCausalLM`):
`eagle_aux_hidden_state_layer_ids` = the capture ids unchanged (vLLM's target
appends the stream after layer k for id k, no shift for eagle3),
`norm_before_residual: false` (what the trainer's layer does; vLLM's default
when the key is absent is true), tensors `fc.weight`, `layers.0.*` (q/k/v read
the 2H input), `layers.0.hidden_norm.weight`, `norm.weight`; no lm_head,
embed_tokens, d2t/t2d (full vocabulary: vLLM shares the target's).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.train.model import DraftSpec

log = logging.getLogger(__name__)

SPECULATORS_VERSION = "0.3.0"
_HEAD_PREFIXES = ("markov_head.", "confidence_head.")


@dataclass(frozen=True)
class ExportPaths:
    draft: Path  # the draft as trained (dspark or dflash)
    dflash_backbone: Path | None  # a DSpark draft's backbone as a DFlash draft, if exported


def _layer_config(spec: DraftSpec, target_config: dict) -> dict:
    """The Qwen3 decoder config of the draft layers (vLLM builds them from it)."""
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "rope_theta": spec.rope_theta,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": target_config.get("dtype") or target_config.get("torch_dtype", "bfloat16"),
    }


def _verifier(verifier: str, target_config: dict) -> dict:
    return {
        "name_or_path": verifier,
        "architectures": target_config.get("architectures", ["Qwen3ForCausalLM"]),
    }


def _provenance(spec: DraftSpec) -> dict:
    """What this project adds to config.json (readers other than vLLM use it)."""
    return {
        "aux_layer_convention": "aux id k = residual stream after k decoder layers",
        "trained_kind": spec.kind,
    }


def eagle3_config(spec: DraftSpec, *, verifier: str, target_config: dict) -> dict:
    """config.json of a speculators-format EAGLE-3 draft (see the module docstring)."""
    return {
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": _layer_config(spec, target_config),
        "eagle_aux_hidden_state_layer_ids": list(spec.aux_layer_ids),
        "target_hidden_size": spec.target_hidden_size,
        "draft_vocab_size": spec.vocab_size,
        "norm_before_residual": False,
        "norm_before_fc": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": spec.num_draft_tokens}
            ],
            "default_proposal_method": "greedy",
            "verifier": _verifier(verifier, target_config),
        },
        "dspark_targets": {**_provenance(spec), "ttt_steps": spec.block_size},
    }


def speculators_config(spec: DraftSpec, *, kind: str, verifier: str, target_config: dict) -> dict:
    """config.json of a speculators-format draft of `kind` ('dflash', 'dspark' or 'eagle3')."""
    if kind == "eagle3" or spec.kind == "eagle3":
        if kind != spec.kind:
            raise ValueError(f"a {spec.kind} draft cannot be exported as {kind}")
        return eagle3_config(spec, verifier=verifier, target_config=target_config)
    if kind == "dflash" and spec.sample_from_anchor:
        raise ValueError(
            "a draft trained with sample_from_anchor=true predicts token p+k+1 in slot k; vLLM's "
            "dflash method reads slot k as token p+k, so it would be served off by one: "
            "train with sample_from_anchor: false to export a DFlash draft"
        )
    num_draft = spec.num_draft_tokens
    config = {
        "speculators_model_type": kind,
        "speculators_version": SPECULATORS_VERSION,
        "architectures": ["DFlashDraftModel" if kind == "dflash" else "Qwen3DSparkModel"],
        "transformer_layer_config": _layer_config(spec, target_config),
        "aux_hidden_state_layer_ids": list(spec.aux_layer_ids),
        "target_hidden_size": spec.target_hidden_size,
        "draft_vocab_size": spec.vocab_size,
        "mask_token_id": spec.mask_token_id,
        "block_size": spec.block_size,
        "sample_from_anchor": spec.sample_from_anchor,
        # The block attends to itself bidirectionally (vLLM: false -> causal).
        "sliding_window_non_causal": True,
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [
                {
                    "proposal_type": kind,
                    "speculative_tokens": num_draft,
                    "block_size": spec.block_size,
                }
            ],
            "default_proposal_method": kind,
            "verifier": _verifier(verifier, target_config),
        },
        "dspark_targets": _provenance(spec),
    }
    if kind == "dspark":
        config.update(
            markov_rank=spec.markov_rank,
            markov_head_type="vanilla",
            enable_confidence_head=spec.confidence_head,
            confidence_head_with_markov=spec.confidence_with_markov,
        )
    return config


def export_draft(
    *,
    state: dict,
    spec: DraftSpec,
    out: Path,
    kind: str,
    verifier: str,
    target_config: dict,
    dtype: str | None = None,
) -> Path:
    """Write one speculators-format directory; returns it."""
    import torch
    from safetensors.torch import save_file

    if kind == "dspark" and spec.kind != "dspark":
        raise ValueError("only a draft trained as dspark has the Markov head to export as dspark")
    config = speculators_config(spec, kind=kind, verifier=verifier, target_config=target_config)
    torch_dtype = getattr(torch, dtype or config["transformer_layer_config"]["torch_dtype"])
    tensors = {}
    for name, tensor in state.items():
        if kind == "dflash" and name.startswith(_HEAD_PREFIXES):
            continue
        # The confidence head stays fp32 (vLLM builds it with params_dtype float32).
        want = torch.float32 if name.startswith("confidence_head.") else torch_dtype
        tensors[name] = tensor.detach().to("cpu", want).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    log.info("exported %s draft to %s (%d tensors)", kind, out, len(tensors))
    return out


def export_checkpoint(
    checkpoint: Path, out: Path, *, dflash_backbone: bool = True, verifier: str | None = None
) -> ExportPaths:
    """Export a trainer checkpoint (checkpoints/step-N) to `out` (+ `out`-dflash)."""
    import torch

    from pipeline.targets.resolve import resolve_model

    checkpoint = Path(checkpoint)
    spec = DraftSpec.from_json((checkpoint / "spec.json").read_text())
    train_config = yaml.safe_load((checkpoint / "config.yaml").read_text())
    target_dir = resolve_model(train_config["target"])
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    state = torch.load(checkpoint / "state.pt", map_location="cpu", weights_only=True)["model"]
    verifier = verifier or str(Path(target_dir).resolve())
    draft = export_draft(
        state=state,
        spec=spec,
        out=out,
        kind=spec.kind,
        verifier=verifier,
        target_config=target_config,
    )
    backbone = None
    if spec.kind == "dspark" and dflash_backbone:
        if spec.sample_from_anchor:
            log.warning(
                "not exporting the DFlash backbone of %s: it was trained with sample_from_anchor=true, "
                "which vLLM's dflash method would serve off by one",
                checkpoint,
            )
        else:
            backbone = export_draft(
                state=state,
                spec=spec,
                out=out.with_name(out.name + "-dflash"),
                kind="dflash",
                verifier=verifier,
                target_config=target_config,
            )
    return ExportPaths(draft, backbone)
