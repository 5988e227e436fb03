"""Evidence that a toy target learned its corpus: held-out loss, answer diversity, entropy per domain.

Used by the tests (the trained toy must beat a random-weight twin by a wide
margin and must not answer degenerately) and printed by
`dspark-targets toy-target --report`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

HELDOUT_SEED = 7  # the toy trains on seed 0 and reports held-out loss on seed 1


def distinct_token_ratio(ids: list[int]) -> float:
    """Distinct tokens / tokens. A loop of period p scores about p / len(ids)."""
    return len(set(ids)) / len(ids) if ids else 0.0


def heldout_conversations(num: int = 240) -> list[dict]:
    from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate

    return list(generate(SyntheticCorpusConfig(num_conversations=num, seed=HELDOUT_SEED)))


def entropy_by_domain(model, tokenizer, conversations: list[dict]) -> dict[str, float]:
    """Mean next-token entropy (nats) of the model on the assistant tokens, per domain."""
    import torch

    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    with torch.no_grad():
        for conv in conversations:
            enc = tokenizer.apply_chat_template(
                conv["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids = torch.tensor([enc["input_ids"]])
            mask = torch.tensor(enc["assistant_masks"][1:], dtype=torch.bool)
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            entropy = -(logp.exp() * logp).sum(-1)
            totals[conv["domain"]][0] += entropy[mask].sum().item()
            totals[conv["domain"]][1] += mask.sum().item()
    return {domain: s / n for domain, (s, n) in sorted(totals.items())}


def quality_report(model_dir: str | Path, num_prompts_per_domain: int = 3) -> dict:
    """Held-out loss vs a random twin, greedy-answer diversity and entropy per domain."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from pipeline.render import first_prompt, render_prompt
    from pipeline.targets.base import GenerationRequest
    from pipeline.targets.config import GenerationConfig, TargetConfig
    from pipeline.targets.hf_backend import HFTarget
    from pipeline.toy.training import mean_loss, packed_windows, render_ids

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(1234)
    twin = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)).eval()

    convs = heldout_conversations()
    windows = packed_windows(render_ids(tokenizer, convs), tokenizer.pad_token_id, 256)
    report: dict = {
        "heldout_loss": mean_loss(model, windows),
        "random_twin_loss": mean_loss(twin, windows),
        "entropy_by_domain": entropy_by_domain(model, tokenizer, convs),
    }

    picked: dict[str, list[dict]] = defaultdict(list)
    for conv in convs:
        if len(picked[conv["domain"]]) < num_prompts_per_domain:
            picked[conv["domain"]].append(conv)
    target = HFTarget(
        TargetConfig(model=str(model_dir), backend="hf", dtype="float32"), str(model_dir)
    )
    requests = [
        GenerationRequest(c["id"], render_prompt(tokenizer, first_prompt(c["messages"])))
        for cs in picked.values()
        for c in cs
    ]
    gens = target.generate(requests, GenerationConfig(max_new_tokens=160))
    domain_of = {c["id"]: c["domain"] for cs in picked.values() for c in cs}
    report["answers"] = [
        {
            "domain": domain_of[g.request_id],
            "text": tokenizer.decode(g.output_ids, skip_special_tokens=True),
            "num_tokens": len(g.output_ids),
            "distinct_ratio": distinct_token_ratio(g.output_ids),
            "finish_reason": g.finish_reason,
        }
        for g in gens
    ]
    return report
