"""Fixtures of the evaluation tests. Torch single-threaded (two shared cores: OpenMP
spin-waiting made 2 threads ~40x slower than 1, see pipeline/train/toy_shards.py)."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
