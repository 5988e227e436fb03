"""The speculators format of EAGLE-3 (`eagle3`, vLLM's `Eagle3Qwen3ForCausalLM`).

`eagle_aux_hidden_state_layer_ids` = the capture ids unchanged (vLLM's target
appends the stream after layer k for id k, no shift for eagle3);
`norm_before_residual: false` (what the trainer's layer does; vLLM's default
when the key is absent is true); tensors `fc.weight`, `layers.0.*` (q/k/v read
the 2H input), `layers.0.hidden_norm.weight`, `norm.weight`, and the target's
`embed_tokens.weight` and `lm_head.weight` (speculators' Eagle3 reads both from
the checkpoint and leaves them uninitialised otherwise; vLLM loads them as the
draft's own, the same values it would share: the registry's
`target_tensors`); d2t/t2d and a head of the draft vocabulary's rows only for
a reduced vocabulary (pipeline/drafts/export.py writes them). No torch.
"""

from __future__ import annotations

from pipeline.drafts.spec import DraftSpec
from pipeline.drafts.speculators import (
    SPECULATORS_VERSION,
    layer_config,
    method_config,
    provenance,
)


def eagle3_config(spec: DraftSpec, *, verifier: str, target_config: dict) -> dict:
    """config.json of a speculators-format EAGLE-3 draft (see the module docstring)."""
    return {
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer_config(spec, target_config),
        "eagle_aux_hidden_state_layer_ids": list(spec.aux_layer_ids),
        "target_hidden_size": spec.target_hidden_size,
        "draft_vocab_size": spec.draft_vocab_size,
        "norm_before_residual": False,
        "norm_before_fc": False,
        "speculators_config": method_config(
            spec, algorithm="eagle3", verifier=verifier, target_config=target_config
        ),
        "dspark_targets": {**provenance(spec), "ttt_steps": spec.block_size},
    }


def eagle3_fields(config: dict) -> dict:
    """The DraftSpec fields an `eagle3` config.json decides."""
    return dict(
        kind="eagle3",
        aux_layer_ids=tuple(config["eagle_aux_hidden_state_layer_ids"]),
        block_size=config["speculators_config"]["proposal_methods"][0]["speculative_tokens"],
        mask_token_id=0,  # EAGLE-3 embeds no mask
        sample_from_anchor=True,
        markov_rank=0,
        confidence_head=False,
        confidence_with_markov=True,
    )
