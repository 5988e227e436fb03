"""Load a trained draft and draft blocks with it, exactly as a serving engine would.

A draft loads from a training run directory (`<out_dir>`, whose
`checkpoints/latest` is used), a checkpoint directory (`spec.json` +
`state.pt`), or a speculators-format export (`config.json` +
`model.safetensors`, what vLLM serves). `untrained=True` keeps the
architecture and draws fresh weights (seeded): the floor every trained draft
must beat. EAGLE-3 drafts load the same ways and draft through
`pipeline/evaluate/eagle3_drafting.py`; `make_drafter` picks the drafter.

Drafting is left to right, as DSpark samples: slot k's logits are the
backbone's plus the Markov bias `W2(W1[prev])`, where `prev` is the token the
draft itself just produced (the anchor for the first drafted slot). The
confidence head sees that same `prev`. The backbone runs once for every
anchor of a sample (the context mask hides features at positions >= the
anchor, so this equals calling it once per verification round); only the
Markov step is sequential, over the few drafted slots.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from pipeline.shards.reader import TrainingSample
    from pipeline.train.eagle3 import Eagle3Draft
    from pipeline.train.model import DraftModel, DraftSpec


@dataclass
class DraftBlocks:
    """One drafted block per anchor of one sample (A anchors, n drafted slots)."""

    anchors: torch.Tensor  # (A,) int64 anchor positions a (slot j drafts token a + 1 + j)
    tokens: torch.Tensor  # (A, n) int64 drafted tokens
    confidence_logit: torch.Tensor | None  # (A, n) pre-sigmoid acceptance estimate
    probs: torch.Tensor | None = None  # (A, n, V) draft distribution of each slot (T > 0)


class Drafter(Protocol):
    """What the evaluator needs from a draft: its block length and blocks at given anchors."""

    name: str
    num_draft_tokens: int  # n: tokens drafted per verification round

    def draft(self, sample: TrainingSample, anchors: torch.Tensor) -> DraftBlocks:
        """Greedy (T=0) blocks at `anchors` from the sample's cached target features."""
        ...

    def propose(
        self,
        ids: torch.Tensor,  # (T,) int64 committed tokens; the last one is the anchor
        features: torch.Tensor,  # (T, k*H) target features (the anchor's row unused)
        *,
        temperature: float,
        generator: torch.Generator | None,
    ) -> DraftBlocks:
        """One block drafted at the last position (the live loop); `probs` set when T > 0."""
        ...


@dataclass
class LoadedDraft:
    model: DraftModel | Eagle3Draft
    spec: DraftSpec
    source: Path  # what it was loaded from
    export_dir: Path | None  # where calibration is stored beside the served draft
    train_config: dict | None  # the training run's config (None for an export)


def _checkpoint_dir(path: Path) -> Path | None:
    """A checkpoint directory for `path` (itself, or a run's checkpoints/latest)."""
    from pipeline.train.trainer import latest_checkpoint

    if (path / "spec.json").exists() and (path / "state.pt").exists():
        return path
    return latest_checkpoint(path)  # a dangling `latest` pointer is an error, named


def spec_from_export(config: dict, where: str) -> DraftSpec:
    """Rebuild the DraftSpec of a speculators-format export from its config.json."""
    from pipeline.train.model import DraftSpec

    try:
        layer = config["transformer_layer_config"]
        served = config["speculators_model_type"]
        kind = config.get("dspark_targets", {}).get("trained_kind", served)
        rope = layer.get("rope_parameters") or {}
        eagle3 = served == "eagle3"
        if eagle3:
            steps = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
        return DraftSpec(
            kind="eagle3" if eagle3 else kind if served == "dspark" else "dflash",
            vocab_size=layer["vocab_size"],
            hidden_size=layer["hidden_size"],
            target_hidden_size=config["target_hidden_size"],
            aux_layer_ids=tuple(
                config[
                    "eagle_aux_hidden_state_layer_ids" if eagle3 else "aux_hidden_state_layer_ids"
                ]
            ),
            num_layers=layer["num_hidden_layers"],
            num_heads=layer["num_attention_heads"],
            num_kv_heads=layer["num_key_value_heads"],
            head_dim=layer["head_dim"],
            intermediate_size=layer["intermediate_size"],
            rms_norm_eps=layer["rms_norm_eps"],
            rope_theta=float(rope.get("rope_theta", layer.get("rope_theta", 1e6))),
            max_position_embeddings=layer["max_position_embeddings"],
            block_size=steps if eagle3 else config["block_size"],
            mask_token_id=0 if eagle3 else config["mask_token_id"],  # EAGLE-3 embeds no mask
            sample_from_anchor=eagle3 or bool(config.get("sample_from_anchor", False)),
            markov_rank=config.get("markov_rank", 0) if served == "dspark" else 0,
            confidence_head=bool(config.get("enable_confidence_head", False))
            and served == "dspark",
            confidence_with_markov=bool(config.get("confidence_head_with_markov", True)),
        )
    except (KeyError, IndexError) as err:
        raise ValueError(
            f"{where}: speculators config lacks {err.args[0]!r}; is this a dspark-targets export?"
        ) from None


def load_draft(
    path: str | Path,
    *,
    target_dir: str | Path,
    untrained: bool = False,
    seed: int = 0,
    target_head: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> LoadedDraft:
    """Load a draft (see the module docstring); embeddings and lm_head come from the target
    (`target_head`: the target's (embed, lm_head), already loaded, for several drafts)."""
    import torch
    import yaml

    from pipeline.train.eagle3 import build_draft
    from pipeline.train.model import DraftSpec, load_target_head

    path = Path(path)
    embed, head = target_head or load_target_head(target_dir)
    ckpt = _checkpoint_dir(path)
    train_config = None
    export_dir = None
    if ckpt is not None:
        spec = DraftSpec.from_json((ckpt / "spec.json").read_text())
        train_config = yaml.safe_load((ckpt / "config.yaml").read_text())
        state = None
        if not untrained:
            state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=True)["model"]
        run_dir = ckpt.parent.parent
        export = (train_config.get("export") or {}).get("dir")
        candidate = Path(export) if export else run_dir / "export"
        export_dir = candidate if (candidate / "config.json").exists() else None
    elif (path / "config.json").exists() and (path / "model.safetensors").exists():
        spec = spec_from_export(json.loads((path / "config.json").read_text()), str(path))
        state = None
        if not untrained:
            from safetensors.torch import load_file

            state = load_file(str(path / "model.safetensors"))
        export_dir = path
    else:
        raise FileNotFoundError(
            f"{path}: not a training run (checkpoints/latest), a checkpoint (spec.json + "
            "state.pt) or a speculators export (config.json + model.safetensors)"
        )
    if spec.kind not in ("dspark", "dflash", "eagle3"):
        raise ValueError(f"{path}: unknown draft kind {spec.kind!r}")
    if embed.shape[0] != spec.vocab_size or embed.shape[1] != spec.hidden_size:
        raise ValueError(
            f"{path}: draft expects vocab {spec.vocab_size} x hidden {spec.hidden_size}, "
            f"target {target_dir} has embeddings {tuple(embed.shape)}"
        )
    torch.manual_seed(seed)
    model = build_draft(spec, embed, head)
    if state is not None:
        missing, unexpected = model.load_state_dict(
            {k: v.float() for k, v in state.items()}, strict=False
        )
        if missing or unexpected:
            raise ValueError(f"{path}: tensors missing {missing}, unexpected {unexpected}")
    model.eval()
    return LoadedDraft(model, spec, path, export_dir, train_config)


def drafting_slots(spec: DraftSpec) -> slice:
    """Block slots that draft a token (fill-in layout: slot 0 is the anchor and drafts nothing)."""
    return slice(1 - spec.first_offset, spec.block_size)


def sample_slots(
    *,
    base_logits: torch.Tensor,  # (N, n, V) backbone logits of the drafting slots
    hidden: torch.Tensor,  # (N, n, d) final-norm hidden states of the drafting slots
    first_prev: torch.Tensor,  # (N,) int64 token before the first drafted slot (the anchor)
    model: DraftModel,
    use_heads: bool = True,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> DraftBlocks:
    """Left-to-right drafting with the Markov bias on the draft's own previous token.

    `use_heads=False` drafts with the backbone alone (what vLLM's dflash method
    serves for a DSpark draft's backbone). At temperature 0 each slot takes the
    argmax; above it, slot k samples from softmax(logits / T) and its
    distribution is returned for rejection sampling.
    """
    import torch

    n = base_logits.shape[1]
    markov = model.markov_head if use_heads else None
    conf_head = model.confidence_head if use_heads else None
    prev = first_prev
    tokens, probs, conf = [], [], []
    for k in range(n):
        logits = base_logits[:, k].float()  # (N, V)
        emb = None
        if markov is not None:
            emb = markov.markov_w1(prev)  # (N, r)
            logits = logits + markov.markov_w2(emb).float()
        if conf_head is not None:
            feats = hidden[:, k].float()
            if model.spec.confidence_with_markov and emb is not None:
                feats = torch.cat([feats, emb.float()], dim=-1)
            conf.append(conf_head.proj(feats).squeeze(-1))  # (N,)
        if temperature > 0:
            p = torch.softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(p, 1, generator=generator).squeeze(-1)
            probs.append(p)
        else:
            tok = logits.argmax(-1)
        tokens.append(tok)
        prev = tok
    return DraftBlocks(
        anchors=torch.empty(0, dtype=torch.long),
        tokens=torch.stack(tokens, 1),
        confidence_logit=torch.stack(conf, 1) if conf else None,
        probs=torch.stack(probs, 1) if probs else None,
    )


def run_blocks(
    model: DraftModel,
    input_ids: torch.Tensor,  # (T,) int64 tokens (context + anchors)
    features: torch.Tensor,  # (T, k*H) captured target layers (rows >= the anchor unused)
    anchors: torch.Tensor,  # (A,) int64 anchor positions
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backbone outputs of the drafting slots: (base_logits (A, n, V), hidden (A, n, d))."""
    import torch

    from pipeline.train.model import DraftInputs

    spec = model.spec
    t, a, b = input_ids.shape[0], anchors.shape[0], spec.block_size
    block_ids = torch.full((1, a, b), spec.mask_token_id, dtype=torch.long)
    block_ids[0, :, 0] = input_ids[anchors]
    inputs = DraftInputs(
        ctx_features=features[None],
        ctx_positions=torch.arange(t)[None],
        ctx_doc=torch.zeros(1, t, dtype=torch.long),
        block_ids=block_ids,
        block_anchor=anchors[None],
        block_doc=torch.zeros(1, a, dtype=torch.long),
        prev_ids=torch.zeros(1, a, b, dtype=torch.long),  # Markov runs in sample_slots
    )
    with torch.no_grad():
        out = model(inputs)
    slots = drafting_slots(spec)
    return out.base_logits[0, :, slots], out.hidden[0, :, slots]


class LiveProposals:
    """`propose` for drafters whose `_blocks(ids, features, anchors, ...)` drafts at anchors."""

    def propose(
        self,
        ids: torch.Tensor,
        features: torch.Tensor,
        *,
        temperature: float,
        generator: torch.Generator | None,
    ) -> DraftBlocks:
        import torch

        anchor = torch.tensor([ids.shape[0] - 1])
        return self._blocks(ids, features, anchor, temperature=temperature, generator=generator)


@dataclass
class ModelDrafter(LiveProposals):
    """A DraftModel as a Drafter. `use_heads=False`: the backbone alone (DFlash path)."""

    name: str
    model: DraftModel
    use_heads: bool = True

    @property
    def num_draft_tokens(self) -> int:
        return self.model.spec.num_draft_tokens

    @property
    def has_confidence(self) -> bool:
        return self.use_heads and self.model.confidence_head is not None

    def _blocks(
        self,
        ids: torch.Tensor,
        features: torch.Tensor,
        anchors: torch.Tensor,
        *,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> DraftBlocks:
        import torch

        with torch.no_grad():
            base, hidden = run_blocks(self.model, ids, features, anchors)
            blocks = sample_slots(
                base_logits=base,
                hidden=hidden,
                first_prev=ids[anchors],
                model=self.model,
                use_heads=self.use_heads,
                temperature=temperature,
                generator=generator,
            )
        blocks.anchors = anchors
        return blocks

    def draft(self, sample: TrainingSample, anchors: torch.Tensor) -> DraftBlocks:
        return self._blocks(sample.input_ids, sample.hidden_states, anchors)


def make_drafter(name: str, draft: LoadedDraft, *, use_heads: bool = True) -> Drafter:
    """The drafter for a loaded draft: EAGLE-3's step loop, or DSpark/DFlash blocks."""
    if draft.spec.kind == "eagle3":
        from pipeline.evaluate.eagle3_drafting import Eagle3Drafter

        return Eagle3Drafter(name, draft.model)
    return ModelDrafter(name, draft.model, use_heads=use_heads)
