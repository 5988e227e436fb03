"""A version's shards by partition-key range: the overlap query finds what a scan finds."""

from __future__ import annotations

import random

from pipeline.corpus.identity import KEY_BITS
from pipeline.table.manifest import ShardEntry
from pipeline.table.ranges import RangeIndex, key_hex

TOP = (1 << KEY_BITS) - 1


def _entry(path: str, rng: tuple[int, int] | None) -> ShardEntry:
    lo, hi = (key_hex(rng[0]), key_hex(rng[1])) if rng else (None, None)
    return ShardEntry(
        path=path,
        unit_id=path,
        rows=1,
        tokens=1,
        bytes=1,
        sha256="0" * 64,
        codec="bf16",
        schema_version=1,
        identity="0" * 16,
        key_lo=lo,
        key_hi=hi,
    )


def _scan(entries: list[ShardEntry], lo: int, hi: int) -> set[str]:
    out = set()
    for e in entries:
        a, b = e.key_range or (0, TOP)
        if a <= hi and lo <= b:
            out.add(e.path)
    return out


def test_overlapping_matches_a_scan_of_every_shard():
    rnd = random.Random(0)
    num_buckets = 16
    width = (TOP + 1) // num_buckets
    entries = []
    for i in range(200):
        if i % 25 == 0:  # a few wide or unknown ranges (shards written outside the planner)
            entries.append(_entry(f"w{i}", None if i % 50 == 0 else (0, TOP // 2)))
            continue
        bucket = rnd.randrange(num_buckets)
        lo = bucket * width + rnd.randrange(width // 2)
        entries.append(_entry(f"n{i}", (lo, lo + rnd.randrange(width // 2))))
    index = RangeIndex.build(entries, num_buckets)
    assert len(index.wide) == 8
    for _ in range(100):
        lo = rnd.randrange(TOP)
        hi = min(TOP, lo + rnd.randrange(width))
        assert set(index.overlapping(lo, hi)) == _scan(entries, lo, hi)


def test_changes_make_a_new_index_and_leave_the_old_one():
    old = RangeIndex.build([_entry("a", (10, 20)), _entry("b", (30, 40))], 4)
    new = old.with_changes([_entry("c", (15, 35))], removed={"a"})
    assert sorted(old.overlapping(18, 32)) == ["a", "b"]
    assert sorted(new.overlapping(18, 32)) == ["b", "c"]
    assert new.overlapping(41, 50) == []


def test_key_hex_is_what_a_shard_entry_parses():
    assert _entry("a", (5, TOP)).key_range == (5, TOP)
    assert key_hex(5) == "0000000000000005"
