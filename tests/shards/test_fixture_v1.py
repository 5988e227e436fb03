"""A dataset written by the code before the architecture move still reads, verifies and resumes.

`tests/fixtures/dataset-v1` was written by commit 3a46b47's reference-shard
writer (toy:random target, aux ids [0, 1], 6 conversations, two units).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from pipeline.shards.manifest import Dataset
from pipeline.shards.reader import ShardReader
from pipeline.shards.sink import DatasetSink
from pipeline.shards.tools import verify_dataset

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
