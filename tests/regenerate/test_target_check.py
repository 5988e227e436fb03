"""`verify --against-target`: a good dataset passes, one whose layers are shifted by one fails.

The good dataset is the in-process transformers regeneration of the trained
toy target (aux ids 1, 2, 3); the shifted copy keeps its tokens and final
state but stores the streams after layers 2 and 3 under aux ids 1 and 2, the
off-by-one the field's tools have shipped. On a deep target adjacent layers can
be alike enough to pass an error bound, so the test also checks that the report
names the stream each stored one is nearest to.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner


@pytest.fixture(scope="module")
def good_dataset(tmp_path_factory, trained_target_dir) -> Path:
    from pipeline.demo.reference_shards import write_reference_shards
    from pipeline.torch_threads import torch_threads

    uri = tmp_path_factory.mktemp("target-check") / "good"
    with torch_threads(1):
        write_reference_shards(uri, num_conversations=16, num_units=2, max_new_tokens=48)
    return uri


@pytest.fixture(scope="module")
def shifted_dataset(good_dataset) -> Path:
    """A copy whose aux ids 1 and 2 hold the streams after layers 2 and 3."""
    from pipeline.shards.writer import Sample
    from pipeline.table.dataset import Dataset
    from pipeline.table.reader import ShardReader

    reader = ShardReader(good_dataset, prefetch=0)
    prov = reader.manifest.provenance
    assert prov.aux_layer_ids == (1, 2, 3)
    hidden = prov.hidden_size
    shifted = dataclasses.replace(prov, aux_layer_ids=(1, 2))
    uri = good_dataset.parent / "shifted"
    dataset = Dataset.open(uri)
    with dataset.writer("shifted-0", shifted) as writer:
        for s in reader:
            writer.write(
                Sample(
                    sample_id=s.sample_id,
                    source=s.source,
                    domain=s.domain,
                    input_ids=s.input_ids,
                    loss_mask=s.loss_mask.to(torch.uint8),
                    hidden_states=s.hidden_states[:, hidden:].contiguous(),  # streams 2, 3
                    last_hidden_state=s.last_hidden_state,
                    finish_reason=s.finish_reason,
                    num_prompt_tokens=s.num_prompt_tokens,
                    num_generated_tokens=s.num_generated_tokens,
                )
            )
    dataset.commit([writer.info], provenance=shifted)
    return uri


def test_a_good_dataset_passes(good_dataset):
    from pipeline.regenerate.target_check import check_against_target

    with torch.no_grad():
        report = check_against_target(str(good_dataset), num_samples=6, seed=1)
    assert report.ok, report.to_text()
    assert report.num_samples == 6 and report.num_positions > 100
    assert [s.name for s in report.streams] == ["aux 1", "aux 2", "aux 3", "final"]
    for stream in report.streams:
        # float32 reference stored in bf16: only the storage rounding remains.
        assert stream.rel_error < 0.005 and stream.min_cosine > 0.9999, stream
        assert stream.nearest == stream.name


def test_layers_shifted_by_one_fail(shifted_dataset):
    from pipeline.regenerate.target_check import check_against_target

    report = check_against_target(str(shifted_dataset), num_samples=6, seed=1)
    assert not report.ok
    by_name = {s.name: s for s in report.streams}
    assert by_name["aux 1"].nearest == "aux 2" and by_name["aux 2"].nearest == "aux 3"
    assert by_name["aux 1"].nearest_rel_error < 0.005
    assert by_name["final"].nearest == "final"
    assert any(
        "aux 1 is closer to the recomputed aux 2" in p and "off by +1" in p for p in report.problems
    )


def test_verify_cli_exit_codes(good_dataset, shifted_dataset):
    from pipeline.cli import cli

    good = CliRunner().invoke(
        cli, ["verify", str(good_dataset), "--against-target", "--samples", "3"]
    )
    assert good.exit_code == 0, good.output
    assert "target check" in good.output and "OK: every stream" in good.output
    bad = CliRunner().invoke(
        cli, ["verify", str(shifted_dataset), "--against-target", "--samples", "3"]
    )
    assert bad.exit_code == 1, bad.output
    assert "FAILED: aux 1 is closer to the recomputed aux 2" in bad.output


def test_a_different_target_is_named(good_dataset):
    from pipeline.regenerate.target_check import check_against_target

    report = check_against_target(str(good_dataset), num_samples=2, target="toy:random")
    assert not report.ok
    assert any("pass --target naming those weights" in p for p in report.problems)
