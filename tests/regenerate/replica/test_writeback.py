"""The write-back: shards in sample-id order whatever the arrival order, spilled rows included."""

from __future__ import annotations

import os
import tempfile

import pytest
from transformers import AutoTokenizer

from pipeline.corpus.records import Conversation
from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
from pipeline.regenerate.config import parse_config
from pipeline.regenerate.driver.partition import plan_units
from pipeline.regenerate.driver.provenance import build_provenance
from pipeline.regenerate.replica.feeder import EngineFeeder, FeedLimits
from pipeline.regenerate.replica.writeback import WritebackConfig
from pipeline.regenerate.replica.writeback_process import start_writeback
from pipeline.regenerate.units import UnitSpec
from pipeline.table.dataset import Dataset
from pipeline.table.reader import ShardReader
from pipeline.targets.hf_backend import HFTarget


@pytest.fixture(scope="module")
def setup(trained_target_dir):
    config = parse_config(
        {
            "target": {"model": str(trained_target_dir), "backend": "hf", "dtype": "float32"},
            "corpus": {"sources": [{"path": "unused.jsonl"}]},
            "generation": {"max_new_tokens": 24},
            "output": {"uri": "unused"},
        },
        "test",
    )
    rows = generate(SyntheticCorpusConfig(num_conversations=10, seed=41, multi_turn_fraction=0.5))
    convs = [
        Conversation(r["id"], "syn", r["domain"], tuple(r["messages"]), f"syn:{i}")
        for i, r in enumerate(rows)
    ]
    backend = HFTarget(config.target, str(trained_target_dir))
    return (
        config,
        backend,
        AutoTokenizer.from_pretrained(trained_target_dir),
        plan_units(convs, 2, "fp"),
    )


def _run(config, backend, tok, units, uri, spill_dir=None, spill_above=None):
    spec = UnitSpec.from_config(config, build_provenance(config, "c"))
    spec = UnitSpec(**{**spec.__dict__, "dataset_uri": str(uri)})
    writeback = start_writeback(WritebackConfig(spill_dir=spill_dir), spill_above_bytes=spill_above)
    feeder = EngineFeeder(backend, tok, FeedLimits(8, 1 << 30), writeback=writeback)
    try:
        results = [f.result(timeout=600) for f in [feeder.submit_unit(u, spec) for u in units]]
    finally:
        feeder.close()
    return results, feeder


def test_spilled_rows_write_the_same_shard_bytes(setup, tmp_path):
    config, backend, tok, units = setup
    kept, _ = _run(config, backend, tok, units, tmp_path / "kept")
    spill_dir = tempfile.mkdtemp(dir=tmp_path)
    spilled, feeder = _run(config, backend, tok, units, tmp_path / "spilled", spill_dir, 0)
    assert feeder.writeback.stats().spilled_bytes > 0  # every encoded row went to disk first
    assert not os.listdir(spill_dir)  # and the spill files went with their units
    for a, b in zip(kept, spilled, strict=True):
        assert a.shard.sha256 == b.shard.sha256 and a.shard.rows == b.shard.rows > 0
    ds = Dataset.open(tmp_path / "spilled")
    ds.commit([r.shard for r in spilled])
    ids = [s.sample_id for s in ShardReader(ds, prefetch=0)]
    expected = sorted(sid for u in units for c in u.conversations for sid in c.sample_ids())
    assert sorted(ids) == expected and len(ids) == len(set(ids))
    unit_of = {sid: u.unit_id for u in units for c in u.conversations for sid in c.sample_ids()}
    by_unit: dict[str, list[str]] = {}
    for sid in ids:  # rows in file order, shard by shard
        by_unit.setdefault(unit_of[sid], []).append(sid)
    assert all(rows == sorted(rows) for rows in by_unit.values())  # sample-id order in a shard
