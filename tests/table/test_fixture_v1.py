"""A dataset of manifest format 1 (written before lineages) is refused in one line, untouched.

`tests/fixtures/dataset-v1` was written by an early reference-shard writer
(toy:random target, aux ids [0, 1], 6 conversations, two units).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.reader import ShardReader

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dataset-v1"


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_format_1_dataset_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(FIXTURE, root)
    before = _digest(root)
    with pytest.raises(DatasetError, match="manifest format 1 .* no longer read"):
        Dataset.open(root).manifest()
    with pytest.raises(DatasetError, match="manifest format 1"):
        list(ShardReader(str(root), prefetch=0))
    result = CliRunner().invoke(cli, ["verify", str(root)])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "manifest format 1" in lines[0], result.output
    assert _digest(root) == before
