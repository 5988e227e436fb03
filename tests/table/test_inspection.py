"""inspect / verify / gc, through the library and the CLI."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from shards.helpers import write_unit

from pipeline.cli import cli
from pipeline.table.dataset import Dataset
from pipeline.table.gc import gc_dataset
from pipeline.table.inspection import inspect_dataset, verify_dataset


@pytest.fixture
def dataset(root):
    ds = Dataset.open(root)
    ds.commit([write_unit(ds, "unit-a", 3)[0], write_unit(ds, "unit-b", 3)[0]])
    ds.commit([write_unit(ds, "unit-c", 2)[0]])
    return ds


def _key(ds: Dataset, unit: str) -> str:
    (path,) = [e.path for e in ds.manifest().shards if e.unit_id == unit]
    return path


def _flip_byte(ds: Dataset, key: str, offset: int) -> None:
    """Corrupt a file in place, as bit rot or a foreign tool would (not a shard writer)."""
    data = bytearray(ds.storage.read_bytes(key))
    data[offset] ^= 0x01
    with ds.storage.open_write(key) as f:
        f.write(bytes(data))


def test_inspect_shows_versions_shards_and_provenance(dataset):
    text = inspect_dataset(dataset.uri).to_text()
    assert "latest version: 2" in text
    assert "v000001" in text and "v000002" in text
    for unit in ("unit-a", "unit-b", "unit-c"):
        assert _key(dataset, unit) in text
    assert "bytes/token=" in text and "raw bf16 192 B/token" in text
    assert '"target_revision": "sha256:0123abcd"' in text and "bf16" in text
    older = inspect_dataset(dataset.uri, version=1)
    assert older.manifest.version == 1 and "unit-c" not in older.to_text().split("version 1 (")[1]


def test_verify_passes_on_clean_data(dataset):
    report = verify_dataset(dataset.uri)
    assert report.ok and report.num_shards == 3 and report.num_rows == 8
    assert "OK" in report.to_text()


def test_verify_names_a_shard_with_one_flipped_byte(dataset):
    key = _key(dataset, "unit-b")
    # Flip a byte inside a tensor frame's compressed data (middle of the first row group).
    group = pq.ParquetFile(dataset.storage.open_read(key)).metadata.row_group(0)
    chunk = group.column(5)  # hidden_states
    _flip_byte(dataset, key, chunk.data_page_offset + chunk.total_compressed_size // 2)
    report = verify_dataset(dataset.uri)
    assert not report.ok
    assert [c.path for c in report.corrupt] == [dataset.shard_url(key)]
    assert any("sha256" in p for p in report.corrupt[0].problems)
    assert "CORRUPT " + dataset.shard_url(key) in report.to_text()


def test_verify_catches_a_flipped_footer_byte_and_truncation(dataset):
    a, c = _key(dataset, "unit-a"), _key(dataset, "unit-c")
    size = dataset.storage.info(a).size
    _flip_byte(dataset, a, size - 20)
    data = dataset.storage.read_bytes(c)
    with dataset.storage.open_write(c) as f:
        f.write(data[: len(data) // 2])
    report = verify_dataset(dataset.uri)
    assert sorted(s.path for s in report.corrupt) == sorted(dataset.shard_url(k) for k in (a, c))


def test_cli_verify_exits_nonzero_naming_the_shard(dataset):
    runner = CliRunner()
    ok = runner.invoke(cli, ["verify", dataset.uri])
    assert ok.exit_code == 0, ok.output
    key = _key(dataset, "unit-a")
    _flip_byte(dataset, key, 100)
    bad = runner.invoke(cli, ["verify", dataset.uri])
    assert bad.exit_code == 1
    assert dataset.shard_url(key) in bad.output
    assert "unit-b" not in bad.output.split("corrupt shard")[1]


def test_gc_lists_then_deletes_only_unreferenced_files(dataset):
    orphan, _ = write_unit(dataset, "unit-orphan", 1)
    report = gc_dataset(dataset.uri, min_age_s=0, unsafe_min_age=True)
    assert [o.key for o in report.garbage] == [orphan.path] and not report.deleted
    assert dataset.storage.exists(orphan.path)  # dry run by default
    young = gc_dataset(dataset.uri, min_age_s=3600, unsafe_min_age=True, delete=True)
    assert young.garbage == () and [o.key for o in young.young] == [orphan.path]
    assert dataset.storage.exists(orphan.path)  # too young: may be about to be committed
    gc_dataset(dataset.uri, min_age_s=0, unsafe_min_age=True, delete=True)
    assert not dataset.storage.exists(orphan.path)
    assert verify_dataset(dataset.uri).ok and verify_dataset(dataset.uri, version=1).ok
    assert gc_dataset(dataset.uri, min_age_s=0, unsafe_min_age=True).garbage == ()


def test_cli_inspect_and_gc(dataset):
    runner = CliRunner()
    out = runner.invoke(cli, ["inspect", dataset.uri])
    assert out.exit_code == 0 and _key(dataset, "unit-c") in out.output
    orphan, _ = write_unit(dataset, "unit-orphan", 1)
    refused = runner.invoke(cli, ["gc", dataset.uri, "--min-age-hours", "0"])
    assert refused.exit_code == 1 and "pass --unsafe-min-age" in refused.output
    for bad in ("-5", "nan"):
        out = runner.invoke(cli, ["gc", dataset.uri, "--min-age-hours", bad, "--unsafe-min-age"])
        assert out.exit_code == 1 and "--min-age-hours must be a finite age >= 0" in out.output
    unsafe = ["--min-age-hours", "0", "--unsafe-min-age"]
    dry = runner.invoke(cli, ["gc", dataset.uri, *unsafe])
    assert dry.exit_code == 0 and f"would delete {orphan.path}" in dry.output
    assert "--delete" in dry.output
    done = runner.invoke(cli, ["gc", dataset.uri, *unsafe, "--delete"])
    assert done.exit_code == 0 and f"deleted {orphan.path}" in done.output
    assert not dataset.storage.exists(orphan.path)


def test_cli_reports_a_missing_dataset_in_one_line(tmp_path):
    out = CliRunner().invoke(cli, ["verify", str(tmp_path / "nope")])
    assert out.exit_code == 1 and "no such dataset" in out.output
    assert len(out.output.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    out = CliRunner().invoke(cli, ["verify", str(tmp_path / "empty")])
    assert out.exit_code == 1 and "no committed version" in out.output


def test_the_dataset_card_is_rewritten_at_each_commit(dataset):
    card = dataset.storage.read_bytes("README.md").decode()
    assert "# Training targets: toy:trained" in card and "Version **2**" in card
    assert "| samples | 8 |" in card and "| shards | 3 |" in card
    assert "| math | 3 |" in card and "| synthetic | 8 |" in card  # per domain, per source
    assert "bytes per token" in card and "raw bf16: 192" in card
    assert "| target_revision | `sha256:0123abcd` |" in card
    assert "| 2 |" in card and "| 1 |" in card  # recent versions
    m = dataset.commit([], remove=[_key(dataset, "unit-c")])
    card = dataset.storage.read_bytes("README.md").decode()
    assert f"Version **{m.version}**" in card and "| samples | 6 |" in card


def test_inspect_marks_the_versions_gc_retired(tmp_path):
    ds = Dataset.open(tmp_path / "ds")
    for unit in ("unit-a", "unit-b", "unit-c"):
        ds.commit([write_unit(ds, unit, 2)[0]])
    gc_dataset(ds.uri, keep_versions=1, min_age_s=0, unsafe_min_age=True, delete=True)
    report = inspect_dataset(ds.uri)
    assert [(v.version, v.retired) for v in report.versions] == [(1, True), (2, True), (3, False)]
    text = CliRunner().invoke(cli, ["inspect", ds.uri]).output
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  v0")}
    assert lines["v000001"].endswith(" retired") and lines["v000002"].endswith(" retired")
    assert not lines["v000003"].endswith(" retired")
