"""Training shards from the transformers reference target, for tests, benchmarks and the demo.

The same regeneration stage as production (`regenerate.run.run_local`: the
same planning, unit job, provenance and commit sink), on the transformers
backend in this process instead of vLLM replicas on Ray: one path, one
convention (docs/design.md#the-layer-convention: aux id k = the stream after k layers; the final
state after the norm; the last, never fed row zero). The reference runs in
float32 (greedy decoding is then a pure function of the weights) and the
shards store bf16 like every other dataset.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from pipeline.logs import kv
from pipeline.torch_threads import torch_threads

log = logging.getLogger(__name__)

DEFAULT_AUX_LAYER_IDS = (1, 2, 3)


def reference_config(
    uri: str | Path,
    *,
    target: str = "toy:trained",
    num_conversations: int = 120,
    corpus_seed: int = 0,
    aux_layer_ids: Sequence[int] = DEFAULT_AUX_LAYER_IDS,
    num_units: int = 2,
    max_new_tokens: int = 160,
    codec: str = "bf16",
    endpoint_url: str | None = None,
):
    """The regeneration config of a reference dataset (hf backend, float32, greedy)."""
    from pipeline.regenerate.config import parse_config

    return parse_config(
        {
            "name": "reference-shards",
            "target": {
                "model": target,
                "backend": "hf",
                "dtype": "float32",
                "max_model_len": 1024,
                "aux_layer_ids": list(aux_layer_ids),
            },
            "corpus": {"synthetic": {"num_conversations": num_conversations, "seed": corpus_seed}},
            "generation": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
            "output": {"uri": str(uri), "endpoint_url": endpoint_url, "codec": codec},
            "regenerate": {"num_buckets": num_units, "commit_every_units": num_units},
        },
        "reference shards",
    )


def write_reference_shards(
    uri: str | Path, *, num_threads: int | None = 1, **options
) -> int | None:
    """Regenerate the synthetic corpus into `uri` with the reference target; the version.

    `options` are `reference_config`'s. Resumable: a second call finds the
    units committed and commits nothing. `num_threads` caps torch's threads
    while this runs: on a small shared machine OpenMP spin-waiting made 2
    threads ~40x slower than 1 (measured).
    """
    from pipeline.regenerate.run import run_local

    config = reference_config(uri, **options)
    with torch_threads(num_threads):
        summary = run_local(config)
    log.info(
        "reference shards committed %s",
        kv(uri=summary.dataset_uri, version=summary.version, samples=summary.samples),
    )
    return summary.version
