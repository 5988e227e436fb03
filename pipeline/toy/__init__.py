"""The toy wing: small targets built on the spot, their reference shards, the demo, its configs.

Nothing in production paths imports it: `targets/resolve.py` reaches it (lazily)
for `toy:NAME` model references, and the CLI, the demo, the tests and
`bench/` use it directly. `CONFIG_DIR` holds the embedded default configs
(package data): `toy.yaml` (regeneration), `train-toy*.yaml`, `eval-toy.yaml`.
"""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
