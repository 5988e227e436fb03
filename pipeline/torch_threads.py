"""Torch's intra-op thread count, capped for a block of work and restored after.

OpenMP spin-waiting makes several threads far slower than one on a small
shared machine, so CPU stages cap it (docs/capture.md, "Limits and pitfalls").
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
