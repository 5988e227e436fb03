"""A version's shards by partition-key range, for the exactly-once check of a commit.

Each shard entry records the range of its members' partition keys (`key_lo`,
`key_hi`: 16 hex digits, `key_hex`; the range comes from the shard's sample
index, `pipeline/shards/sidecar.py`). A commit consults only the parent shards
whose range overlaps a new shard's (checks.py), found here in O(log N + hits)
instead of by a scan of every shard of the version.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pipeline.corpus.identity import KEY_BITS

if TYPE_CHECKING:
    from pipeline.table.manifest import ShardEntry

# (lo, hi, shard path): sorting by it orders ranges by their low key.
Span = tuple[int, int, str]


def key_hex(key: int) -> str:
    """A partition key as a shard entry records it."""
    return f"{key:016x}"


class RangeIndex:
    """Shards by partition-key range, for the commit's overlap query.

    Shards planned by bucket cover a narrow range (at most `narrow_span`): they
    sit in a list sorted by their low key, so the shards a new range can
    overlap are found by bisection. Wider ranges (shards written outside the
    planner, or with no range) are few and checked one by one.
    """

    def __init__(
        self,
        narrow: list[Span],
        wide: list[Span],
        narrow_span: int,
        max_span: int = 0,
    ) -> None:
        self.narrow = narrow  # sorted by (lo, hi, path)
        self.wide = wide
        self.narrow_span = narrow_span
        self.max_span = max_span  # widest narrow range ever added (an upper bound)

    @classmethod
    def build(cls, entries: Iterable[ShardEntry], num_buckets: int) -> RangeIndex:
        index = cls([], [], 2 * ((1 << KEY_BITS) // max(1, num_buckets)))
        return index.with_changes(list(entries), set())

    def _split(self, entries: Iterable[ShardEntry]) -> tuple[list[Span], list[Span]]:
        narrow, wide = [], []
        for e in entries:
            rng = e.key_range
            if rng is None:
                wide.append((0, (1 << KEY_BITS) - 1, e.path))
            elif rng[1] - rng[0] <= self.narrow_span:
                narrow.append((rng[0], rng[1], e.path))
            else:
                wide.append((rng[0], rng[1], e.path))
        return narrow, wide

    def with_changes(self, added: Iterable[ShardEntry], removed: set[str]) -> RangeIndex:
        """A new index: this one plus `added` entries, minus the paths in `removed`."""
        narrow = [t for t in self.narrow if t[2] not in removed] if removed else list(self.narrow)
        wide = [t for t in self.wide if t[2] not in removed]
        new_narrow, new_wide = self._split(added)
        for item in new_narrow:
            bisect.insort(narrow, item)
        span = max([self.max_span] + [hi - lo for lo, hi, _ in new_narrow])
        return RangeIndex(narrow, wide + new_wide, self.narrow_span, span)

    def overlapping(self, lo: int, hi: int) -> list[str]:
        """Paths of the shards whose range meets [lo, hi]."""
        start = bisect.bisect_left(self.narrow, (lo - self.max_span, -1, ""))
        stop = bisect.bisect_right(self.narrow, (hi, 1 << KEY_BITS, "\uffff"))
        out = [p for a, b, p in self.narrow[start:stop] if a <= hi and lo <= b]
        out += [p for a, b, p in self.wide if a <= hi and lo <= b]
        return out
