"""The held-out samples an evaluation reads, after the provenance and leakage checks.

`load_heldout` opens the dataset version (pinned while it is read), checks that no
evaluated sample was trained on (the eval held-out fraction may not exceed any
draft's training fraction: the split is a hash threshold on the sample id; with
`split: all`, every draft left the sources out) and that the data was captured
from this target with the drafts' layers, and decodes the samples. Each draft
then reads its own subset of the layers (`draft_samples`); the live loop, the
vLLM cross-check and the serving benchmark take `round_robin_prompts` of them.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.evaluate.config import EvalConfig

# Held-out samples are cut to this many tokens, the training default of
# `data.max_seq_len` (what evaluation has always read them with).
MAX_SEQ_LEN = 4096


def _heldout_fraction(config: EvalConfig, train_configs: dict[str, dict]) -> float:
    train_fracs = {
        name: float(tc.get("data", {}).get("heldout_fraction", 0.0))
        for name, tc in train_configs.items()
    }
    frac = config.data.heldout_fraction
    if frac is None:
        if not train_fracs:
            raise ValueError(
                "data.heldout_fraction is unset and no draft is a training run to take it from: set it"
            )
        frac = min(train_fracs.values())
    if frac <= 0:
        raise ValueError(
            f"the drafts were trained with heldout_fraction {train_fracs}: a draft trained on every "
            "sample has no held-out split to evaluate on; retrain with data.heldout_fraction > 0"
        )
    leaked = {n: f for n, f in train_fracs.items() if f < frac}
    if leaked:
        raise ValueError(
            f"data.heldout_fraction {frac} exceeds the training held-out fraction of {leaked}: "
            "some evaluated samples were trained on; lower data.heldout_fraction to at most "
            f"{min(leaked.values())}"
        )
    return frac


def _check_left_out(config: EvalConfig, train_configs: dict[str, dict]) -> None:
    """split: all reads rows no draft may have trained on: each left the sources out."""
    wanted = set(config.data.sources)
    for name, tc in train_configs.items():
        left_out = set(tc.get("data", {}).get("exclude_sources", []))
        if not wanted <= left_out:
            raise ValueError(
                f"data.split: all evaluates every row of sources {sorted(wanted)}, but draft "
                f"{name!r} trained on {sorted(wanted - left_out)} (its data.exclude_sources is "
                f"{sorted(left_out)}): evaluate its held-out split instead, or retrain without them"
            )


def load_heldout(config: EvalConfig, train_configs: dict[str, dict], specs: dict, target_dir: Path):
    """(held-out samples, data description) after the provenance and leakage checks."""
    from pipeline.table.dataset import Dataset

    uri = config.data.uri
    if uri is None:
        uris = [tc["data"]["uri"] for tc in train_configs.values() if tc.get("data")]
        if not uris:
            raise ValueError(
                "data.uri is unset and no draft is a training run to take it from: set it"
            )
        uri = uris[0]
    frac = _heldout_fraction(config, train_configs)
    if config.data.split == "all":
        _check_left_out(config, train_configs)
    dataset = Dataset.open(uri, endpoint_url=config.data.endpoint_url)
    version = dataset.manifest(config.data.version).version  # the latest, if unset
    with dataset.pinned(version, "evaluate"):  # gc keeps it while it is read
        return _load_heldout(config, specs, target_dir, uri, version, frac)


def _load_heldout(config: EvalConfig, specs: dict, target_dir: Path, uri, version, frac):
    import json

    from pipeline.drafts.family import language_config
    from pipeline.evaluate.offline import inexact_reasons
    from pipeline.table.split import DatasetSplit

    data = DatasetSplit(
        uri,
        version=version,
        endpoint_url=config.data.endpoint_url,
        domains=config.data.domains,
        sources=config.data.sources,
        exclude_sources=config.data.exclude_sources,
        heldout_fraction=frac,
        max_seq_len=MAX_SEQ_LEN,
    )
    target_config = language_config(json.loads((target_dir / "config.json").read_text()))
    for spec in specs.values():
        data.check(
            target=config.target,
            target_config=target_config,
            aux_layer_ids=list(spec.aux_layer_ids),
        )
    prov = data.provenance
    inexact = inexact_reasons(generation=prov.generation, codec=prov.codec)
    if inexact and not config.data.report_as_teacher_forced:
        raise ValueError(
            f"{data.where}: the offline T=0 walk measures acceptance only on the target's "
            f"greedy output stored losslessly, but {'; '.join(inexact)}. Regenerate with "
            "generation.temperature: 0 and a lossless codec (output.codec: bf16), or set "
            "data.report_as_teacher_forced: true to report its tau as teacher-forced agreement"
        )
    rows = (
        data.heldout_rows if config.data.split == "heldout" else data.heldout_rows + data.train_rows
    )
    refs = subsample(rows, config.data.max_samples)
    if not refs:
        what = (
            f"at heldout_fraction {frac}"
            if config.data.split == "heldout"
            else f"of sources {config.data.sources}"
        )
        raise ValueError(f"{data.where}: no samples to evaluate {what}")
    samples = data.decode(refs)
    info = {
        "uri": str(uri),
        "version": data.manifest.version,
        "heldout_fraction": frac,
        "split": config.data.split,
        "sources": sorted({s.source for s in samples}),
        "num_samples": len(samples),
        # The layers the dataset captured: the samples' hidden_states columns, in order.
        "aux_layer_ids": list(prov.aux_layer_ids),
        "domains": sorted({s.domain for s in samples}),
        # What the offline T=0 tau measures on this data (and why, if not acceptance).
        "t0_measure": "teacher-forced agreement" if inexact else "acceptance",
        "t0_inexact": inexact,
    }
    return samples, info


def subsample(rows: list, limit: int | None) -> list:
    """At most `limit` of `rows`, drawn evenly over the whole split by a salted hash of each
    sample id (not the first in dataset order, which is a few shards of a few sources),
    kept in dataset order; the same rows on every run and machine."""
    from pipeline.corpus.identity import unit_interval

    if not limit or len(rows) <= limit:
        return rows
    keep = set(
        sorted(range(len(rows)), key=lambda i: unit_interval(f"evaluate:{rows[i].sample_id}"))[
            :limit
        ]
    )
    return [r for i, r in enumerate(rows) if i in keep]


def draft_samples(samples: list, data_info: dict, spec) -> list:
    """Held-out samples as a draft of `spec` reads them: hidden_states cut to its layers
    (the same columns training gave it, table/split.py `select_layers`)."""
    from pipeline.table.split import select_layers

    captured = data_info["aux_layer_ids"]
    return [select_layers(s, captured, spec.aux_layer_ids) for s in samples]


def round_robin_prompts(samples, num: int) -> list:
    """Up to `num` samples, round-robin over domains (deterministic order)."""
    by_domain: dict[str, list] = {}
    for s in samples:
        by_domain.setdefault(s.domain, []).append(s)
    picked, i = [], 0
    while len(picked) < num and any(i < len(v) for v in by_domain.values()):
        for d in sorted(by_domain):
            if i < len(by_domain[d]) and len(picked) < num:
                picked.append(by_domain[d][i])
        i += 1
    return picked
