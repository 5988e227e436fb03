"""The embedded default: everything that runs on one machine with no hub and no GPU.

`run.py` is `make demo` (toy target -> corpus -> regeneration on local Ray
with CPU vLLM -> a trained draft -> its acceptance length);
`reference_shards.py` regenerates the synthetic corpus with the
transformers backend in process (tests, benchmarks); `quality.py` reports a
toy target's quality figures; `CONFIG_DIR` holds the embedded configs
(package data): `toy.yaml` (regeneration), `train-toy*.yaml`, `eval-toy.yaml`.
It sits above every stage and nothing in a stage imports it.
"""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
