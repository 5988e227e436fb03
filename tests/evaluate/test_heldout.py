"""The held-out loader's sample cap draws over the whole split."""

from pipeline.evaluate.heldout import subsample
from pipeline.table.split import RowRef


def _rows(shards: int, per_shard: int) -> list[RowRef]:
    return [
        RowRef(s, 0, r, f"src{s}/conv-{r:04d}#t1") for s in range(shards) for r in range(per_shard)
    ]


def test_subsample_spreads_over_the_split_in_dataset_order():
    rows = _rows(4, 250)
    picked = subsample(rows, 40)
    assert len(picked) == 40
    # Every shard (a source, in dataset order) is represented, not just the first.
    assert {r.shard for r in picked} == {0, 1, 2, 3}
    assert picked == [r for r in rows if r in set(picked)]  # dataset order kept
    assert subsample(list(reversed(rows)), 40) == list(reversed(picked))  # ids decide


def test_subsample_leaves_small_splits_and_no_cap_alone():
    rows = _rows(1, 10)
    assert subsample(rows, None) is rows
    assert subsample(rows, 10) is rows
    assert subsample(rows, 3) == subsample(rows, 3)
