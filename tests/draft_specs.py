"""Test helpers: a tiny draft architecture, random samples, and a small training run."""

from __future__ import annotations

import torch

from pipeline.drafts.registry import KINDS
from pipeline.drafts.spec import DraftSpec
from pipeline.shards.reader import TrainingSample

# Smaller still, for drafters checked against brute force (vocabulary 40, width 16).
SMALL = dict(
    vocab_size=40,
    hidden_size=16,
    target_hidden_size=16,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=24,
)


def tiny_spec(**overrides) -> DraftSpec:
    """A tiny spec of `kind` (default dspark) that its kind allows: no heads unless the kind
    has them, the fields it fixes (eagle3: one layer), mask id 0 where nothing is masked."""
    base = dict(
        kind="dspark",
        vocab_size=50,
        hidden_size=32,
        target_hidden_size=32,
        aux_layer_ids=(1, 2),
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=512,
        block_size=4,
        mask_token_id=3,
        sample_from_anchor=True,
        markov_rank=8,
        confidence_head=True,
        confidence_with_markov=True,
    )
    kind = KINDS.get(overrides.get("kind", "dspark"))
    if kind is not None:
        if not kind.heads:
            base.update(markov_rank=0, confidence_head=False)
        if not kind.mask_token:
            base.update(mask_token_id=0)
        base.update({name: value for name, (value, _) in kind.fixed.items()})
    base.update(overrides)
    return DraftSpec(**base)


def random_sample(
    *, vocab: int, hidden: int, t: int, prompt: int, seed: int = 1, num_aux: int = 2
) -> TrainingSample:
    """A sample of random tokens (ids >= 4) and features: `num_aux` captured layers."""
    g = torch.Generator().manual_seed(seed)
    return TrainingSample(
        "s",
        "x",
        "d",
        torch.randint(4, vocab, (t,), generator=g),
        torch.tensor([0] * prompt + [1] * (t - prompt), dtype=torch.bool),
        torch.randn(t, num_aux * hidden, generator=g),
        torch.randn(t, hidden, generator=g),
        "stop",
        prompt,
        t - prompt,
    )


def train_small_draft(
    shards, out_dir, draft: dict, *, num_steps: int = 60, heldout_fraction: float = 0.1
):
    """Train (and export) a draft on toy shards: 8 sequences a step, one thread (~40 s)."""
    from pipeline.train.config import parse_train_config
    from pipeline.train.trainer import train

    config = parse_train_config(
        dict(
            target="toy:trained",
            data=dict(
                uri=str(shards), num_anchors=64, heldout_fraction=heldout_fraction, prefetch=1
            ),
            out_dir=str(out_dir),
            num_steps=num_steps,
            global_batch_size=8,
            draft=draft,
            optim=dict(lr=3e-3),
            checkpoint_every=num_steps,
            log_every=1000,
            num_threads=1,
        )
    )
    return train(config)


def drafted(drafter, sample: dict[str, torch.Tensor]) -> dict:
    """What a drafter drafts from `sample` (a dict: input_ids, hidden_states,
    num_prompt_tokens): T=0 blocks at every answer anchor, and one live proposal
    at T=0.05 (seeded; the random toy target's logits are small). The record of
    tests/fixtures/drafts_v0/expected.json."""
    from pipeline.shards.reader import TrainingSample

    ids, feats = sample["input_ids"], sample["hidden_states"]
    t, p = ids.shape[0], int(sample["num_prompt_tokens"])
    s = TrainingSample(
        "fixture", "x", "d", ids, torch.arange(t) >= p, feats, feats, "stop", p, t - p
    )
    blocks = drafter.draft(s, torch.arange(p, t - 1))
    live = drafter.propose(
        ids[:15], feats[:15], temperature=0.05, generator=torch.Generator().manual_seed(0)
    )
    conf = blocks.confidence_logit
    return {
        "tokens": blocks.tokens.tolist(),
        "confidence_logit": None
        if conf is None
        else [[round(float(x), 5) for x in r] for r in conf],
        "live_tokens": live.tokens.tolist(),
    }
