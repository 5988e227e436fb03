"""The sidecar file format: a shard's sample index, its JSON and its partition-key buckets."""

from __future__ import annotations

import json

import pytest

from pipeline.corpus.identity import KEY_BITS, input_hash, partition_key
from pipeline.shards.errors import DatasetError
from pipeline.shards.sidecar import SampleIndex, bucket_of, build_index, sidecar_key

SHA = "ab" * 32


def _index() -> SampleIndex:
    rows = [("c1-0", "math", "gsm8k", 12), ("c1-1", "math", "gsm8k", 30), ("c2-0", "code", "x", 7)]
    return build_index("shards/unit-7.a1.parquet", SHA, rows, [("c3-0", "h3"), ("c3-0", "h3")])


def test_the_index_is_built_from_the_writers_report_in_file_order():
    index = _index()
    assert [r.sample_id for r in index.rows] == ["c1-0", "c1-1", "c2-0"]
    assert index.rows[0].input_hash == input_hash("c1-0", "math", "gsm8k")
    assert index.attempted == (("c3-0", "h3"),)  # attempted samples once, sorted
    assert index.member_ids() == {"c1-0", "c1-1", "c2-0", "c3-0"}


def test_json_round_trips_and_names_its_format():
    index = _index()
    text = index.to_json()
    assert json.loads(text)["format"] == "dspark-targets.sidecar"
    assert SampleIndex.from_json(text, "idx") == index
    assert SampleIndex.from_json(text.encode(), "idx") == index


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b.update(format="other"),
        lambda b: b.update(sidecar_version=2),
        lambda b: b.pop("rows"),
        lambda b: b.update(rows=[["c1-0", "h"]]),
    ],
)
def test_a_damaged_or_foreign_file_is_refused_naming_it(edit):
    body = json.loads(_index().to_json())
    edit(body)
    with pytest.raises(DatasetError, match="index/unit-7.a1.json: unreadable sample index"):
        SampleIndex.from_json(json.dumps(body), "index/unit-7.a1.json")
    with pytest.raises(DatasetError, match="unreadable sample index"):
        SampleIndex.from_json(b"{not json", "x")


def test_the_key_range_spans_every_member_and_turns_share_a_key():
    index = _index()
    keys = [partition_key(s) for s in ("c1-0", "c2-0", "c3-0")]
    assert partition_key("c1-0") == partition_key("c1-1")
    assert index.key_range() == (min(keys), max(keys))
    assert build_index("shards/empty.parquet", SHA, []).key_range() is None


def test_buckets_cut_the_key_space_into_equal_ranges():
    top = (1 << KEY_BITS) - 1
    assert [bucket_of(k, 4) for k in (0, top // 4, top // 4 + 1, top)] == [0, 0, 1, 3]
    assert bucket_of(top, 1) == 0


def test_the_sidecar_key_derives_from_the_shard_name():
    assert sidecar_key("shards/unit-7.a1.parquet") == "index/unit-7.a1.json"
