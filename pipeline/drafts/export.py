"""Export a trained draft in the speculators format that vLLM serves (docs/design.md#serving-drafts-in-vllm).

A directory with `config.json` (speculators_model_type, transformer_layer_config,
speculators_config with the verifier, the kind's own fields) and
`model.safetensors` whose tensor names are the ones vLLM's loaders read.
Embeddings and lm_head are not saved (vLLM shares the target's) unless the
format carries them (EAGLE-3). A draft with a reduced vocabulary
(`DraftSpec.draft_vocab`) writes `draft_vocab_size`, its own `lm_head.weight`
(the target head's rows of its tokens) and the maps `d2t`/`t2d`, in every
format: vLLM's eagle3, dflash and dspark loaders all read them. Which
format a draft exports as, how that format's config.json is written and read, and whether it carries the
target's tensors are the registry's (pipeline/drafts/registry.py; the
formats themselves are dspark/export.py and eagle3/export.py, their shared
fields speculators.py). A draft exported to another kind's format (a DSpark
draft of the fill-in layout as dflash) keeps its heads out of
model.safetensors and writes its own form beside (dspark/export.py). The
confidence head stays fp32 (vLLM builds it with params_dtype float32).

Reading is `read_export` / `spec_from_export`: evaluation loads a served
export exactly as it loads a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.drafts.checkpoint import load_checkpoint
from pipeline.drafts.dspark.export import DSPARK_DIR, HEAD_PREFIXES, HEADS_KEY
from pipeline.drafts.registry import draft_kind, format_kind
from pipeline.drafts.spec import DraftSpec
from pipeline.drafts.speculators import common_spec_fields

log = logging.getLogger(__name__)

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
# Tensors of the target a format with `target_tensors` carries (EAGLE-3).
TARGET_TENSORS = ("embed_tokens.weight", "lm_head.weight")
# A reduced draft vocabulary's maps (pipeline/drafts/vocab.py); its head is `lm_head.weight`.
VOCAB_MAPS = ("d2t", "t2d")


@dataclass(frozen=True)
class ExportPaths:
    draft: Path  # the export directory
    dflash_backbone: Path | None  # the same, when it holds a DSpark draft's DFlash backbone


def speculators_config(
    spec: DraftSpec, *, model_type: str, verifier: str, target_config: dict
) -> dict:
    """config.json of `spec` exported as `model_type` (a kind's format: 'dspark',
    'dflash' or 'eagle3')."""
    kind = draft_kind(spec.kind)
    if model_type not in (kind.export_format, kind.fill_in_format):
        raise ValueError(
            f"a {spec.kind} draft exports as {kind.export_format}"
            + (f" (in the fill-in layout as {kind.fill_in_format})" if kind.fill_in_format else "")
            + f", not as {model_type}"
        )
    return draft_kind(model_type).format.config(
        spec, verifier=verifier, target_config=target_config
    )


def export_draft(
    *,
    state: dict,
    spec: DraftSpec,
    out: Path,
    model_type: str,
    verifier: str,
    target_config: dict,
    dtype: str | None = None,
    target_tensors: dict | None = None,
) -> Path:
    """Write one speculators-format directory; returns it. `target_tensors` (the
    target's `embed_tokens.weight` and `lm_head.weight`) go into EAGLE-3 exports."""
    import torch
    from safetensors.torch import save_file

    config = speculators_config(
        spec, model_type=model_type, verifier=verifier, target_config=target_config
    )
    torch_dtype = getattr(torch, dtype or config["transformer_layer_config"]["torch_dtype"])
    keep_heads = model_type == draft_kind(spec.kind).export_format
    carries_target = draft_kind(model_type).format.target_tensors
    tensors, heads = {}, {}
    for name, tensor in state.items():
        # The confidence head stays fp32 (vLLM builds it with params_dtype float32).
        want = torch.float32 if name.startswith("confidence_head.") else torch_dtype
        into = heads if not keep_heads and name.startswith(HEAD_PREFIXES) else tensors
        into[name] = tensor.detach().to("cpu", want).contiguous()
    if carries_target:
        if not target_tensors:
            raise ValueError(
                f"an {model_type} export carries the target's embed_tokens and lm_head "
                "(speculators' Eagle3 reads them from the checkpoint): pass target_tensors"
            )
        for name in TARGET_TENSORS:
            tensors[name] = target_tensors[name].detach().to("cpu", torch_dtype).contiguous()
    if spec.draft_vocab is not None:
        tensors.update(_vocab_tensors(spec, target_tensors, torch_dtype))
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    if heads and HEADS_KEY in config:  # the whole DSpark form beside its backbone
        export_draft(
            state=state,
            spec=spec,
            out=out / DSPARK_DIR,
            model_type=spec.kind,
            verifier=verifier,
            target_config=target_config,
            dtype=dtype,
            target_tensors=target_tensors,
        )
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    log.info("exported %s draft to %s (%d tensors)", model_type, out, len(tensors))
    return out


def _vocab_tensors(spec: DraftSpec, target_tensors: dict | None, dtype) -> dict:
    """A reduced draft vocabulary's tensors: its head (the target lm_head's rows of the
    draft vocabulary: vLLM cannot share the target's full head with it) and the maps
    d2t (int64) and t2d (bool), as vLLM's eagle3, dflash and dspark loaders read them."""
    import torch

    from pipeline.drafts.vocab import d2t_of, t2d_of

    if not target_tensors or "lm_head.weight" not in target_tensors:
        raise ValueError(
            "a reduced-vocabulary export carries its own head (the target lm_head's rows of "
            "the draft vocabulary): pass target_tensors with lm_head.weight"
        )
    ids = torch.tensor(spec.draft_vocab, dtype=torch.long)
    head = target_tensors["lm_head.weight"].detach().to("cpu")[ids]
    return {
        "lm_head.weight": head.to(dtype).contiguous(),
        "d2t": d2t_of(spec.draft_vocab),
        "t2d": t2d_of(spec.draft_vocab, spec.vocab_size),
    }


def export_checkpoint(checkpoint: Path, out: Path, *, verifier: str | None = None) -> ExportPaths:
    """Export a trainer checkpoint (checkpoints/step-N) to `out`, in its kind's format for
    its layout (a DSpark draft in the fill-in layout: its DFlash backbone)."""
    from pipeline.targets.resolve import resolve_model

    ckpt = load_checkpoint(checkpoint)
    spec, kind = ckpt.spec, draft_kind(ckpt.spec.kind)
    target_dir = resolve_model(ckpt.target)
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    model_type = kind.format_for(spec)
    target_tensors = None
    if draft_kind(model_type).format.target_tensors or spec.draft_vocab is not None:
        from pipeline.drafts.target_head import load_target_head

        embed, head = load_target_head(target_dir, dtype=None)
        target_tensors = dict(zip(TARGET_TENSORS, (embed, head), strict=True))
    draft = export_draft(
        state=ckpt.model_state(),
        spec=spec,
        out=out,
        model_type=model_type,
        verifier=verifier or str(Path(target_dir).resolve()),
        target_config=target_config,
        target_tensors=target_tensors,
    )
    return ExportPaths(draft, draft if model_type != kind.export_format else None)


# ---------------------------------------------------------------------- reading


def is_export(path: str | Path) -> bool:
    return (Path(path) / CONFIG).exists() and (Path(path) / WEIGHTS).exists()


def spec_from_export(config: dict, where: str) -> DraftSpec:
    """Rebuild the DraftSpec of a speculators-format export from its config.json."""
    try:
        fmt = format_kind(config, where).format
        return DraftSpec(**common_spec_fields(config), **fmt.spec_fields(config))
    except (KeyError, IndexError) as err:
        raise ValueError(
            f"{where}: speculators config lacks {err.args[0]!r}; is this a dspark-targets export?"
        ) from None


def read_export(path: str | Path, *, weights: bool = True) -> tuple[DraftSpec, dict | None]:
    """(spec, tensors) of the export in `path`; tensors None unless `weights`."""
    path = Path(path)
    config = json.loads((path / CONFIG).read_text())
    spec = spec_from_export(config, str(path))
    draft_vocab_size = config.get("draft_vocab_size") or spec.vocab_size
    if draft_vocab_size < spec.vocab_size:
        spec = dataclasses.replace(spec, draft_vocab=_read_draft_vocab(path, draft_vocab_size))
    if not weights:
        return spec, None
    from safetensors.torch import load_file

    tensors = load_file(str(path / WEIGHTS))
    if HEADS_KEY in config:  # a DSpark draft's dflash export: its heads in its DSpark form
        form = load_file(str(path / config[HEADS_KEY]["file"]))
        tensors.update({k: v for k, v in form.items() if k.startswith(HEAD_PREFIXES)})
    # The target's own tables (EAGLE-3 exports carry them), a reduced vocabulary's head
    # (their rows) and maps are not draft weights: the draft rebuilds them from the spec.
    return spec, {k: v for k, v in tensors.items() if k not in (*TARGET_TENSORS, *VOCAB_MAPS)}


def _read_draft_vocab(path: Path, size: int) -> tuple[int, ...]:
    """The draft vocabulary an export's d2t/t2d encode (checked against each other)."""
    from safetensors import safe_open

    from pipeline.drafts.vocab import vocab_from_maps

    with safe_open(str(path / WEIGHTS), framework="pt") as f:
        names = set(f.keys())
        if not set(VOCAB_MAPS) <= names:
            raise ValueError(
                f"{path}: draft_vocab_size {size} is below the target's vocabulary but the "
                f"export has no {' and '.join(sorted(set(VOCAB_MAPS) - names))}"
            )
        vocab = vocab_from_maps(f.get_tensor("d2t"), f.get_tensor("t2d"))
    if len(vocab) != size:
        raise ValueError(f"{path}: d2t holds {len(vocab)} tokens, draft_vocab_size says {size}")
    return vocab


def export_target(path: str | Path) -> str:
    """The verifier an export names (`speculators_config.verifier.name_or_path`)."""
    config = json.loads((Path(path) / CONFIG).read_text())
    return config["speculators_config"]["verifier"]["name_or_path"]
