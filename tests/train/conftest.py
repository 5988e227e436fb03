"""Fixtures of the training tests: torch single-threaded; the toy shards are tests/conftest.py's.

On a small shared machine OpenMP spin-waiting made two threads ~40x slower
than one (measured, see pipeline/demo/reference_shards.py).
"""

from __future__ import annotations

import torch
from draft_specs import tiny_spec  # noqa: F401  (re-exported to the training tests)

torch.set_num_threads(1)
