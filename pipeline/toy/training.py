"""Training loop for the `trained` toy target: next-token prediction on the synthetic corpus.

Conversations are rendered with the chat template, joined with the
end-of-text token and cut into fixed windows (packing keeps every step the same
cost). The data order, initialisation and schedule derive from the spec's
seeds, so a rebuild on the same machine gives the same weights.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

from pipeline.logs import kv

log = logging.getLogger(__name__)


def render_ids(tokenizer, conversations: Iterable[dict]) -> list[list[int]]:
    """Token ids of each conversation rendered with the chat template."""
    return [
        tokenizer.apply_chat_template(c["messages"], tokenize=True, return_dict=True)["input_ids"]
        for c in conversations
    ]


def packed_windows(sequences: list[list[int]], sep_id: int, seq_len: int):
    """Concatenate sequences (separated by `sep_id`) into a (N, seq_len + 1) tensor."""
    import torch

    flat: list[int] = []
    for seq in sequences:
        flat.extend(seq)
        flat.append(sep_id)
    num = len(flat) // (seq_len + 1)
    if num == 0:
        raise ValueError(f"corpus has {len(flat)} tokens, fewer than one window of {seq_len + 1}")
    return torch.tensor(flat[: num * (seq_len + 1)], dtype=torch.long).view(num, seq_len + 1)


def mean_loss(model, windows, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats/token) over windows, without gradients."""
    import torch
    import torch.nn.functional as F

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(windows), batch_size):
            batch = windows[start : start + batch_size]
            logits = model(input_ids=batch[:, :-1]).logits
            loss = F.cross_entropy(
                logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum"
            )
            total += loss.item()
            count += batch[:, 1:].numel()
    return total / count


def train_toy(model, tokenizer, spec) -> dict:
    """Train `model` in place per `spec` (a ToyTrainSpec); return a small report."""
    import torch
    import torch.nn.functional as F

    from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate

    torch.manual_seed(spec.seed)
    corpus = generate(
        SyntheticCorpusConfig(num_conversations=spec.num_conversations, seed=spec.corpus_seed)
    )
    windows = packed_windows(render_ids(tokenizer, corpus), tokenizer.pad_token_id, spec.seq_len)
    heldout = packed_windows(
        render_ids(
            tokenizer,
            generate(SyntheticCorpusConfig(num_conversations=200, seed=spec.corpus_seed + 1)),
        ),
        tokenizer.pad_token_id,
        spec.seq_len,
    )
    gen = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95)
    )

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return spec.lr * (step + 1) / spec.warmup_steps
        progress = (step - spec.warmup_steps) / max(1, spec.num_steps - spec.warmup_steps)
        return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    started = time.monotonic()
    order = torch.randperm(len(windows), generator=gen)
    cursor = 0
    losses: list[float] = []
    model.train()
    for step in range(spec.num_steps):
        if cursor + spec.batch_size > len(order):
            order, cursor = torch.randperm(len(windows), generator=gen), 0
        batch = windows[order[cursor : cursor + spec.batch_size]]
        cursor += spec.batch_size
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == spec.num_steps - 1:
            elapsed = time.monotonic() - started
            eta = elapsed / (step + 1) * (spec.num_steps - step - 1)
            log.info(
                "toy training %s",
                kv(
                    step=step,
                    loss=round(loss.item(), 4),
                    lr=lr_at(step),
                    elapsed_s=round(elapsed),
                    eta_s=round(eta),
                ),
            )
    report = {
        "train_windows": len(windows),
        "train_tokens_seen": spec.num_steps * spec.batch_size * spec.seq_len,
        "final_train_loss": sum(losses[-10:]) / min(10, len(losses)),
        "heldout_loss": mean_loss(model, heldout),
        "train_seconds": round(time.monotonic() - started, 1),
    }
    model.eval()
    return report
