"""Torch's intra-op thread count, capped for a block of work and restored after.

On a small shared machine OpenMP spin-waiting made two threads ~40x slower
than one (measured, pipeline/demo/reference_shards.py), so CPU stages cap it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with `num_threads` torch threads (None or 0: unchanged)."""
    import torch

    saved = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
