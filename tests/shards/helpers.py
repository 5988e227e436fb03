"""Small builders shared by the format and table tests: a provenance and deterministic samples."""

from __future__ import annotations

import torch

from pipeline.shards.schema import Provenance
from pipeline.shards.writer import Sample

HIDDEN = 32
LAYERS = (2, 5)
DOMAINS = ("math", "code", "chat")


def provenance(codec: str = "bf16", **overrides) -> Provenance:
    fields = dict(
        target_name="toy:trained",
        target_revision="sha256:0123abcd",
        tokenizer_hash="sha256:feedbeef",
        aux_layer_ids=LAYERS,
        hidden_size=HIDDEN,
        codec=codec,
        corpus_version="synthetic-v1",
        code_version="0.1.0+test",
        generation={"temperature": 0.0, "max_new_tokens": 64, "seed": 0},
    )
    fields.update(overrides)
    return Provenance(**fields)


def activations(num_tokens: int, width: int, seed: int) -> torch.Tensor:
    """LLM-like bf16 activations: per-channel scales and one massive channel."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(0.5 * torch.randn(width, generator=g))
    scale[seed % width] *= 100
    return (torch.randn(num_tokens, width, generator=g) * scale).to(torch.bfloat16)


def sample(index: int, unit: str = "u", num_tokens: int | None = None) -> Sample:
    """Deterministic sample number `index` of unit `unit`."""
    T = num_tokens or 8 + (index * 7) % 17
    prompt = T // 3
    seed = index * 1009 + sum(map(ord, unit))
    return Sample(
        sample_id=f"{unit}-{index:05d}",
        source="synthetic",
        domain=DOMAINS[index % len(DOMAINS)],
        input_ids=[(seed + t) % 1000 for t in range(T)],
        loss_mask=[0] * prompt + [1] * (T - prompt),
        hidden_states=activations(T, HIDDEN * len(LAYERS), seed),
        last_hidden_state=activations(T, HIDDEN, seed + 1),
        finish_reason="stop" if index % 4 else "length",
        num_prompt_tokens=prompt,
        num_generated_tokens=T - prompt,
    )


def write_unit(dataset, unit: str, num_samples: int, codec: str = "bf16", **kwargs):
    """Write one unit's shard into `dataset`; returns (ShardInfo, samples)."""
    samples = [sample(i, unit) for i in range(num_samples)]
    with dataset.writer(unit, provenance(codec), **kwargs) as writer:
        for s in samples:
            writer.write(s)
    return writer.info, samples


def assert_exactly_once(uri, samples, **reader_kwargs) -> None:
    """Every sample in `samples` is readable from the latest version exactly once, bit-exact,
    nothing else is there, and `verify` finds the version clean."""
    from pipeline.table.inspection import verify_dataset
    from pipeline.table.reader import ShardReader

    want = {s.sample_id: s for s in samples}
    got = list(ShardReader(uri, prefetch=0, **reader_kwargs))
    ids = [s.sample_id for s in got]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} samples read twice"
    assert set(ids) == set(want), (
        f"missing {sorted(set(want) - set(ids))[:3]}, unexpected {sorted(set(ids) - set(want))[:3]}"
    )
    for s in got:
        assert s.hidden_states.view(torch.int16).equal(
            want[s.sample_id].hidden_states.view(torch.int16)
        )
    report = verify_dataset(str(uri), **reader_kwargs)
    assert report.ok, report.to_text()
