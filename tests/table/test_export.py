"""Exports, each checked with the reading code of its own layout."""

from __future__ import annotations

import json

import pytest
import torch
from shards.helpers import LAYERS, write_unit

from pipeline.table.dataset import Dataset
from pipeline.table.export import export_dataset
from pipeline.table.reader import ShardReader


@pytest.fixture
def dataset(tmp_path):
    ds = Dataset.open(tmp_path / "ds")
    a, sa = write_unit(ds, "unit-a", 3)
    ds.commit([a])
    b, _ = write_unit(ds, "unit-b", 2)
    ds.commit([b], drop={a.path: [sa[1].sample_id]})  # a tombstoned row is not exported
    return ds


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def test_hf_datasets_export_loads_with_load_from_disk(dataset, tmp_path):
    import datasets

    out = tmp_path / "hf"
    report = export_dataset(dataset.uri, out, format="hf-datasets")
    assert report.rows == 4 and report.version == 2
    loaded = datasets.load_from_disk(str(out)).with_format("torch")
    ours = {s.sample_id: s for s in ShardReader(dataset)}
    assert sorted(loaded["sample_id"]) == sorted(ours)
    for row in loaded:
        want = ours[row["sample_id"]]
        got = torch.as_tensor(row["hidden_states"]).to(torch.int16).view(torch.bfloat16)
        assert torch.equal(_bits(got), _bits(want.hidden_states))
        last = torch.as_tensor(row["last_hidden_state"]).to(torch.int16).view(torch.bfloat16)
        assert torch.equal(_bits(last), _bits(want.last_hidden_state))
        assert row["input_ids"].tolist() == want.input_ids.tolist()
    meta = json.loads((out / "dspark_export.json").read_text())
    assert meta["version"] == 2 and meta["rows"] == 4 and meta["lineage"]["first_version"] == 1
    with pytest.raises(ValueError, match="not empty"):
        export_dataset(dataset.uri, out, format="hf-datasets")


def test_speculators_export_reads_with_speculators_own_dataset(dataset, tmp_path):
    pytest.importorskip("speculators")
    from speculators.train.data import ArrowDataset

    out = tmp_path / "spec"
    export_dataset(dataset.uri, out, format="speculators")
    spec = ArrowDataset(max_len=4096, datapath=str(out), on_missing="raise")
    ours = {s.sample_id: s for s in ShardReader(dataset)}
    assert len(spec) == len(ours) == 4
    for i in range(len(spec)):
        item = spec[i]
        want = ours[spec.data[i]["sample_id"]]
        assert torch.equal(item["input_ids"], want.input_ids)
        assert torch.equal(_bits(item["hidden_states"]), _bits(want.hidden_states))
        assert item["hidden_states"].shape[1] == len(LAYERS) * want.last_hidden_state.shape[1]
        assert torch.equal(
            _bits(item["verifier_last_hidden_states"]), _bits(want.last_hidden_state)
        )
        assert item["loss_mask"].tolist() == want.loss_mask.long().tolist()


def test_cli_export(dataset, tmp_path):
    from click.testing import CliRunner

    from pipeline.cli import cli

    out = tmp_path / "cli-hf"
    result = CliRunner().invoke(
        cli,
        [
            "export",
            dataset.uri,
            "--format",
            "hf-datasets",
            "--out",
            str(out),
            "--version",
            "1",
            "--verify",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "exported version 1 (3 samples) as hf-datasets" in result.output


def test_an_export_pins_its_version_while_it_reads(tmp_path, monkeypatch):
    from pipeline.table import export as export_module
    from pipeline.table.pins import pinned_versions

    ds = Dataset.open(tmp_path / "ds")
    ds.commit([write_unit(ds, "unit-a", 3)[0]])
    ds.commit([write_unit(ds, "unit-b", 2)[0]])
    seen, real = [], export_module._export_speculators

    def reading(reader, out):
        seen.append(pinned_versions(ds))
        return real(reader, out)

    monkeypatch.setattr(export_module, "_export_speculators", reading)
    export_dataset(str(ds.uri), tmp_path / "out", format="speculators", version=1)
    assert [list(p.values()) for p in seen] == [[1]]
    assert next(iter(seen[0])).startswith("export-")
    assert pinned_versions(ds) == {}  # released when done
