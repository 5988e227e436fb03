"""Typed configuration of the training stage (`dspark-targets train --config ...`).

One pydantic model per concern (draft architecture, loss weights, data,
optimiser, run), all frozen and forbidding unknown keys. What differs between
draft kinds (defaults, fixed fields, loss weights) comes from the one table of
kinds, pipeline/drafts/registry.py; `DraftConfig.resolve` turns a draft
config into the DraftSpec a checkpoint records. `load_train_config`
reads a YAML file and fails with the same message style as pipeline/config.py:
file, dotted key, problem.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config import ConfigModel, dump_yaml, load_model_yaml, parse_model
from pipeline.drafts.family import embed_scale_of, language_config, logit_softcap_of, rope_of
from pipeline.drafts.registry import DEFAULT_KIND, KINDS, draft_kind
from pipeline.drafts.spec import DraftSpec


class DraftConfig(ConfigModel):
    """The draft architecture (docs/design.md#the-draft-dspark). Unset sizes copy the target's."""

    # A kind of pipeline/drafts/registry.py. dspark: DFlash backbone +
    # Markov logit-bias head + confidence head. dflash: the same backbone
    # without the heads, trained with CE only. eagle3: the EAGLE-3 baseline
    # (pipeline/drafts/eagle3/model.py): one layer, the training-time test
    # unrolled block_size steps (default 1 layer, 7 steps).
    kind: str = DEFAULT_KIND
    num_layers: int = Field(5, gt=0)
    # Query slots per block: [anchor, MASK x (block_size - 1)]. eagle3: the
    # number of unrolled draft steps (vLLM's num_speculative_tokens).
    block_size: int = Field(8, ge=2)
    # True: slot k predicts token p+k+1 (the anchor slot predicts too; block_size
    # drafted tokens). False: the DFlash fill-in layout, slot k predicts p+k
    # (block_size - 1 drafted tokens); vLLM serves only this layout as `dflash`.
    # None: the kind's default (True for dspark and eagle3, False for dflash).
    sample_from_anchor: bool | None = None
    markov_rank: int = Field(256, gt=0)
    confidence_head: bool = True
    # The confidence head sees [h_k ; W1[prev]] (True) or h_k alone.
    confidence_with_markov: bool = True
    num_heads: int | None = Field(None, gt=0)
    num_kv_heads: int | None = Field(None, gt=0)
    head_dim: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    # Captured aux layer ids the draft reads, ascending: any subset of the dataset's
    # (docs/train.md, Capture once, train any). None: the kind's default when the
    # dataset captured it (eagle3: 2, L//2, L-3), else every captured layer.
    aux_layer_ids: list[int] | None = None
    # Token fed to mask slots (its target embedding row); None: the tokenizer's mask token,
    # else the first unused embedding row, pad, EOS or unk (docs/train.md, Mask token).
    mask_token_id: int | None = Field(None, ge=0)
    # Rows of the draft's head: the most frequent tokens of the training split's answers
    # (pipeline/drafts/vocab.py, exported as the speculators format's d2t/t2d), the
    # target's EOS tokens always among them; None: the target's whole vocabulary.
    draft_vocab_size: int | None = Field(None, gt=0)

    @property
    def anchor_predicts(self) -> bool:
        if self.sample_from_anchor is None:
            return draft_kind(self.kind).sample_from_anchor
        return self.sample_from_anchor

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: Any) -> Any:
        # e.g. EAGLE-3: one layer, 7 unrolled steps unless the config says otherwise.
        if isinstance(data, dict) and (kind := KINDS.get(data.get("kind", DEFAULT_KIND))):
            data = {**kind.config_defaults, **data}
        return data

    @field_validator("aux_layer_ids")
    @classmethod
    def _ascending(cls, ids: list[int] | None) -> list[int] | None:
        if ids is not None and (not ids or min(ids) < 0 or ids != sorted(set(ids))):
            raise ValueError(
                f"aux_layer_ids {ids} must be distinct non-negative ids in ascending order "
                f"(e.g. {sorted(set(i for i in ids if i >= 0)) or [2]})"
            )
        return ids

    def layers_to_read(
        self, captured: Sequence[int], num_layers: int
    ) -> tuple[tuple[int, ...], str]:
        """(aux ids the draft reads, where they come from) for a dataset that captured
        `captured` from a target of `num_layers` layers. Whether the dataset holds ids the
        config names is DatasetSplit's check, not this one."""
        if self.aux_layer_ids is not None:
            return tuple(self.aux_layer_ids), "draft.aux_layer_ids"
        default = draft_kind(self.kind).default_layers
        if default is not None:
            ids = default(num_layers)
            if list(ids) == sorted(set(ids)) and set(ids) <= set(captured):
                return ids, f"the {self.kind} default"
        return tuple(captured), "every captured layer"

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        draft_kind(kind)
        return kind

    @model_validator(mode="after")
    def _fixed_by_kind(self) -> DraftConfig:
        for name, (value, why) in draft_kind(self.kind).fixed.items():
            got = getattr(self, name)
            if got is not None and got != value:
                raise ValueError(f"{why} (got {name}: {str(got).lower()})")
        return self

    def resolve(
        self,
        target_config: dict,
        *,
        aux_layer_ids: Sequence[int],
        mask_token_id: int,
        draft_vocab: Sequence[int] | None = None,
    ) -> DraftSpec:
        """The DraftSpec: unset sizes filled from the target's config.json contents
        (its language model's, for a multimodal checkpoint), and what the draft copies
        from the target's family (pipeline/drafts/family.py). `draft_vocab`: the
        reduced vocabulary's target ids (pipeline/drafts/vocab.py; None: full)."""
        cfg = language_config(target_config)
        if draft_vocab is not None and len(draft_vocab) != self.draft_vocab_size:
            raise ValueError(
                f"draft vocabulary of {len(draft_vocab)} tokens for draft_vocab_size "
                f"{self.draft_vocab_size}"
            )
        if self.draft_vocab_size is not None and self.draft_vocab_size > cfg["vocab_size"]:
            raise ValueError(
                f"draft.draft_vocab_size {self.draft_vocab_size} exceeds the target's vocabulary "
                f"of {cfg['vocab_size']}: set it smaller, or unset it for the whole vocabulary"
            )
        rope_theta, rope_scaling = rope_of(cfg)
        hidden = cfg["hidden_size"]
        heads = self.num_heads or cfg["num_attention_heads"]
        with_heads = draft_kind(self.kind).heads
        return DraftSpec(
            kind=self.kind,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            target_hidden_size=hidden,
            aux_layer_ids=tuple(int(i) for i in aux_layer_ids),
            num_layers=self.num_layers,
            num_heads=heads,
            num_kv_heads=self.num_kv_heads or cfg.get("num_key_value_heads") or heads,
            head_dim=self.head_dim or cfg.get("head_dim") or hidden // heads,
            intermediate_size=self.intermediate_size or cfg["intermediate_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            block_size=self.block_size,
            mask_token_id=mask_token_id,
            sample_from_anchor=self.anchor_predicts,
            markov_rank=self.markov_rank if with_heads else 0,
            confidence_head=with_heads and self.confidence_head,
            confidence_with_markov=self.confidence_with_markov,
            rope_scaling=rope_scaling,
            embed_scale=embed_scale_of(cfg),
            logit_softcap=logit_softcap_of(target_config),
            draft_vocab=None if draft_vocab is None else tuple(int(t) for t in draft_vocab),
        )


def resolve_spec(
    target_dir: str | Path, draft: DraftConfig, aux_layer_ids: Sequence[int], mask_token_id: int
) -> DraftSpec:
    """`draft.resolve` against the target checkpoint in `target_dir`."""
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    return draft.resolve(target_config, aux_layer_ids=aux_layer_ids, mask_token_id=mask_token_id)


class LossConfig(ConfigModel):
    """Weights of `0.1 CE + 0.9 L1 + 1.0 BCE (+ KL)`; None picks the kind's default
    (dspark: 0.1/0.9/1.0 with L1 = ||p_draft - p_target||_1, the DSpark paper's Eq. 10
    and its reference code; dflash: CE only; eagle3: forward KL to the target only)."""

    ce_weight: float | None = Field(None, ge=0.0)
    # Weight of the L1 distance ||p_draft - p_target||_1 (= 2 TV).
    l1_weight: float | None = Field(None, ge=0.0)
    # Weight of TV = 1/2 ||p_draft - p_target||_1 instead (what earlier versions
    # called the distribution term: tv_weight 0.9 is l1_weight 0.45). Set one of the two.
    tv_weight: float | None = Field(None, ge=0.0)
    bce_weight: float | None = Field(None, ge=0.0)
    # Forward KL(p_target || p_draft): EAGLE-3's soft-label loss (same gradient as
    # its -sum p_target log p_draft); None: 1.0 for eagle3, else 0.
    kl_weight: float | None = Field(None, ge=0.0)
    # Slot k (1-based) is weighted by exp(-(k-1)/gamma); 4 for blocks of 7-8.
    gamma: float = Field(4.0, gt=0.0)
    # eagle3 only: step s (0-based) of the unrolled training-time test is
    # weighted by ttt_step_decay**s (EAGLE-3: 0.8); replaces gamma.
    ttt_step_decay: float = Field(0.8, gt=0.0, le=1.0)
    # CE-first: the first this share of num_steps ramps linearly from CE alone to the
    # weights above (pipeline/train/schedule.py); 0: the weights above from step 0.
    ce_first_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    # Valid slots per chunk of the vocabulary-sized loss: memory only (logits and
    # softmaxes exist for this many slots at a time), not the loss' value.
    chunk_size: int = Field(1024, gt=0)

    @model_validator(mode="after")
    def _one_distribution_weight(self) -> LossConfig:
        if self.l1_weight is not None and self.tv_weight is not None:
            raise ValueError("set l1_weight or tv_weight, not both (tv_weight w is l1_weight w/2)")
        return self

    def weights(self, kind: str) -> tuple[float, float, float]:
        """(ce, tv, bce) weights for a draft of `kind`; the distribution term as a
        weight on TV (an L1 weight w is a TV weight 2w)."""
        default = draft_kind(kind).loss
        if self.tv_weight is not None:
            tv = self.tv_weight
        else:
            tv = 2.0 * (default.l1 if self.l1_weight is None else self.l1_weight)
        return (
            default.ce if self.ce_weight is None else self.ce_weight,
            tv,
            default.bce if self.bce_weight is None else self.bce_weight,
        )

    def kl(self, kind: str) -> float:
        return draft_kind(kind).loss.kl if self.kl_weight is None else self.kl_weight


class TrainDataConfig(ConfigModel):
    """Which committed dataset version to stream, and how samples become blocks."""

    # Dataset root: local directory or s3://bucket/prefix.
    uri: str
    version: int | None = Field(None, ge=0)
    endpoint_url: str | None = None
    # Keep only these domains; empty keeps all.
    domains: list[str] = Field(default_factory=list)
    # Corpus sources training never sees (a source left out, to measure the draft on
    # prompts from a source it never saw: evaluate's `data.split: all`).
    exclude_sources: list[str] = Field(default_factory=list)
    # Share of sample ids (by hash) held out for evaluation; training never sees them.
    heldout_fraction: float = Field(0.02, ge=0.0, lt=1.0)
    # Anchors per sequence, drawn among loss-mask positions, reseeded every epoch.
    num_anchors: int = Field(512, gt=0)
    # Packing budget: context tokens per packed row (a longer sample gets a row alone).
    max_row_tokens: int = Field(4096, gt=0)
    # Samples longer than this keep their first max_seq_len tokens (None: no limit).
    # 4096: the DSpark reference recipe's sequence length.
    max_seq_len: int | None = Field(4096, gt=1)
    # Batches the background thread builds ahead.
    prefetch: int = Field(2, ge=0)
    # samples: every step's global batch is the same whatever the world size
    # (each rank reads all shards, decodes only its rows); shards: rank r reads
    # only shards r::world_size (for large clusters; batches depend on world size).
    split: Literal["samples", "shards"] = "samples"
    # Start while a regeneration still commits: epoch 0 picks up each new version
    # as it lands, until no writer holds the lease (`train --follow`; data.py).
    follow: bool = False
    # Seconds between looks for a new version while following.
    follow_poll_s: float = Field(5.0, gt=0.0)
    # End epoch 0 after this long without a new version (None: when the writer ends).
    follow_timeout_s: float | None = Field(None, gt=0.0)


class OptimConfig(ConfigModel):
    """AdamW with linear warmup and cosine decay, the DSpark reference's settings:
    lr 6e-4, 4% warmup, torch's default betas (0.9, 0.999), no weight decay, clip 1.0."""

    lr: float = Field(6e-4, gt=0.0)
    warmup_fraction: float = Field(0.04, ge=0.0, lt=1.0)
    min_lr_fraction: float = Field(0.0, ge=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.999, ge=0.0, lt=1.0)
    grad_clip: float = Field(1.0, gt=0.0)


class ExportConfig(ConfigModel):
    """What to export after training (speculators format, docs/design.md#serving-drafts-in-vllm)."""

    # Directory for the exported draft; None: <out_dir>/export.
    dir: str | None = None
    # Ignored (old configs set it): a DSpark draft in the fill-in layout is exported
    # as its DFlash backbone only, one in the anchor layout cannot be (off by one).
    dflash_backbone: bool | None = None


class TrainRayConfig(ConfigModel):
    # None starts a local Ray; "auto" joins the cluster this process runs on.
    address: str | None = None
    num_cpus: int | None = Field(None, gt=0)
    num_cpus_per_worker: float = Field(1.0, gt=0.0)


class TrainConfig(ConfigModel):
    """A whole training run."""

    # Target model: local HF directory, hub name, or `toy:<name>`. Its embeddings
    # and lm_head are loaded and frozen; its shapes must match the dataset.
    target: str
    data: TrainDataConfig
    # Where checkpoints, metrics.jsonl and the export go (a shared filesystem
    # path when workers run on several nodes).
    out_dir: str
    num_steps: int = Field(gt=0)
    # Sequences per optimiser step, over all workers.
    global_batch_size: int = Field(gt=0)
    # Sequences per forward/backward on one worker; gradients accumulate over
    # global_batch_size / (num_workers * micro_batch_size) micro-batches (DDP skips
    # the all-reduce until the last). None: one micro-batch of the worker's share.
    # The DSpark reference recipe: 1 (one 4k-token sample), global batch 512.
    micro_batch_size: int | None = Field(None, gt=0)
    draft: DraftConfig = DraftConfig()
    # Warm start: a trained draft's run directory or checkpoint whose tensors this draft
    # shares by name (a DFlash draft for a DSpark one) are copied in before step 0; the
    # rest keep their initialisation (pipeline/train/warm_start.py). A resumed run ignores it.
    init_from: str | None = None
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    export: ExportConfig = ExportConfig()
    # 1: train in this process; >1: Ray Train TorchTrainer with this many workers.
    num_workers: int = Field(1, gt=0)
    # Data parallelism over the workers: ddp (every worker holds the whole draft)
    # or fsdp (FSDP2 fully_shard: parameters, gradients and AdamW state sharded per
    # draft layer; for target-width drafts of very large targets).
    distributed: Literal["ddp", "fsdp"] = "ddp"
    # fp32, or bf16 autocast with fp32 master weights (frozen target tables in
    # bf16); auto: bf16 on GPU, fp32 on CPU.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # Block attention (pipeline/drafts/block_mask.py): sdpa (fused kernels, any
    # device), flex (block-sparse flex_attention, compiled; GPU only: it has no
    # CPU backward), eager (the reference; materialises the scores).
    attention: Literal["sdpa", "flex", "eager"] = "sdpa"
    # Force Ray Train even for one worker (e.g. to get a GPU worker on a cluster).
    use_ray: bool = False
    use_gpu: bool = False
    ray: TrainRayConfig = TrainRayConfig()
    checkpoint_every: int = Field(100, gt=0)
    log_every: int = Field(10, gt=0)
    seed: int = 0
    # Torch intra-op threads per worker; None leaves torch's default.
    num_threads: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _batch_divides(self) -> TrainConfig:
        if self.global_batch_size % self.num_workers:
            raise ValueError(
                f"global_batch_size {self.global_batch_size} is not a multiple of "
                f"num_workers {self.num_workers}: make it one, so every worker gets equal batches"
            )
        share = self.global_batch_size // self.num_workers
        if self.micro_batch_size is not None and share % self.micro_batch_size:
            raise ValueError(
                f"micro_batch_size {self.micro_batch_size} does not divide a worker's share "
                f"{share} of global_batch_size {self.global_batch_size} over "
                f"{self.num_workers} worker(s): pick a divisor of {share}"
            )
        if self.data.follow and (self.num_workers > 1 or self.use_ray):
            raise ValueError(
                "data.follow trains in one process: several workers would each decide when "
                "the followed stream ends (a writer starting in between splits them); train on "
                "one worker, or on a finished version without follow"
            )
        if self.attention == "flex" and not self.use_gpu:
            raise ValueError(
                "attention: flex needs a GPU (flex_attention has no CPU backward): set "
                "use_gpu: true or attention: sdpa"
            )
        return self

    @property
    def bf16(self) -> bool:
        """Whether the run trains under bf16 autocast (precision auto: on GPU)."""
        return self.precision == "bf16" or (self.precision == "auto" and self.use_gpu)

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimiser step on one worker."""
        share = self.global_batch_size // self.num_workers
        return share // (self.micro_batch_size or share)


def parse_train_config(data: dict[str, Any], source: str = "<dict>") -> TrainConfig:
    """Validate a mapping; `source` names it in errors."""
    return parse_model(TrainConfig, data, source)


def load_train_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a training YAML; `overrides` are dotted keys (`optim.lr`)."""
    return load_model_yaml(TrainConfig, path, overrides)


def dump_train_config(config: TrainConfig) -> str:
    return dump_yaml(config)
