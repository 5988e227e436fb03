"""A dataset written by the code before the architecture move still reads, verifies and resumes.

`tests/fixtures/dataset-v1` was written by commit 3a46b47's reference-shard
writer (toy:random target, aux ids [0, 1], 6 conversations, two units).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from pipeline.shards.inspection import verify_dataset
from pipeline.shards.manifest import Dataset
from pipeline.shards.reader import ShardReader
from pipeline.shards.sink import DatasetSink

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dataset-v1"


def test_pre_move_dataset_reads_verifies_and_resumes(tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(FIXTURE, root)
    assert verify_dataset(str(root)).ok
    samples = list(ShardReader(str(root), prefetch=0))
    assert len(samples) == 6 and len({s.sample_id for s in samples}) == 6
    manifest = Dataset.open(root).manifest()
    assert manifest.provenance.aux_layer_ids == (0, 1)
    for s in samples:
        T = len(s.input_ids)
        assert s.hidden_states.shape == (T, 2 * manifest.provenance.hidden_size)
        assert s.hidden_states.dtype == torch.bfloat16
        assert int(s.loss_mask.sum()) == s.num_generated_tokens
    sink = DatasetSink(Dataset.open(root), manifest.provenance)
    assert sink.on_write_start() == {"ref-0000", "ref-0001"} and sink.version == 1


def test_a_commit_on_a_format1_version_migrates_and_checks_its_samples(tmp_path):
    import pytest

    from pipeline.shards.manifest import DuplicateSampleError

    from .helpers import activations

    root = tmp_path / "ds"
    shutil.copytree(FIXTURE, root)
    ds = Dataset.open(root)
    old = ds.manifest()
    prov = old.provenance
    width, hidden = prov.hidden_states_width, prov.hidden_size
    existing = next(iter(ShardReader(str(root), prefetch=0)))

    def one(sample_id: str):
        from pipeline.shards.writer import Sample

        with ds.writer("resumed", prov) as w:
            w.write(
                Sample(
                    sample_id,
                    "synthetic",
                    "chat",
                    [1, 2, 3, 4],
                    [0, 0, 1, 1],
                    activations(4, width, 1),
                    activations(4, hidden, 2),
                    "stop",
                    2,
                    2,
                )
            )
        return w.info

    with pytest.raises(DuplicateSampleError, match="already holds"):
        ds.commit([one(existing.sample_id)])  # read from the format-1 shard's id column
    m2 = ds.commit([one("new-sample-000")])
    assert m2.manifest_version == 2 and m2.lineage.first_version == 1
    assert {e.unit_id for e in m2.shards} == {"ref-0000", "ref-0001", "resumed"}
    assert m2.totals.rows == 7 and sum(m2.totals.by_domain.values()) == 7
    assert verify_dataset(str(root)).ok and verify_dataset(str(root), version=1).ok
    assert len(list(ShardReader(str(root), prefetch=0))) == 7
    assert Dataset.open(root).manifest(1).manifest_version == 1  # the old root is untouched
