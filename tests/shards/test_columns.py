"""Row-group tables built from buffers equal pyarrow's own conversion, and need no pandas."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from pipeline.shards.columns import column, rows_table

SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.uint8()), nullable=False),
        pa.field("frame", pa.large_binary(), nullable=False),
        pa.field("blob", pa.binary(), nullable=False),
        pa.field("count", pa.int32(), nullable=False),
    ]
)


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        length = int(rng.integers(0, 9))
        rows.append(
            {
                "sample_id": f"s{i}-é✓" if i % 3 == 0 else f"s{i}",
                "input_ids": rng.integers(-(2**31), 2**31 - 1, length).astype(np.int32),
                "loss_mask": rng.integers(0, 2, length).astype(np.uint8),
                "frame": rng.bytes(int(rng.integers(0, 50))),
                "blob": b"" if i % 2 else b"\x00\xff",
                "count": int(rng.integers(-5, 2**31 - 1)),
            }
        )
    return rows


@pytest.mark.parametrize("n", [0, 1, 17])
def test_equals_pyarrows_conversion(n):
    rows = _rows(n)
    expected = pa.table({f.name: [r[f.name] for r in rows] for f in SCHEMA}, schema=SCHEMA)
    got = rows_table(rows, SCHEMA)
    assert got.schema == SCHEMA
    assert got.equals(expected)
    assert got.to_pylist() == expected.to_pylist()


def test_lists_and_python_ints_as_values():
    got = column([[1, 2], [], [3]], pa.list_(pa.int32()))
    assert got.to_pylist() == [[1, 2], [], [3]]
    assert column([], pa.list_(pa.uint8())).to_pylist() == []


@pytest.mark.parametrize(
    "values, type_",
    [
        ([2**31], pa.int32()),
        ([np.array([256])], pa.list_(pa.uint8())),
        ([np.array([-1])], pa.list_(pa.uint8())),
    ],
)
def test_values_outside_the_type_are_refused_as_pyarrow_refuses_them(values, type_):
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, OverflowError)):
        pa.array(values, type=type_)
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, OverflowError)):
        column(values, type_)


def test_other_values_go_through_pyarrow():
    for values, type_ in [([1.0, 2.0], pa.int32()), ([b"x"], pa.string()), ([None], pa.int32())]:
        assert column(values, type_).equals(pa.array(values, type=type_))


def test_writing_a_shard_does_not_import_pandas(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        import torch
        from pipeline.shards.schema import Provenance
        from pipeline.shards.writer import Sample, ShardWriter
        from pipeline.storage import open_storage

        prov = Provenance(
            target_name="t", target_revision="sha256:0", tokenizer_hash="sha256:0",
            aux_layer_ids=(1, 2), hidden_size=8, codec="bf16", corpus_version="c",
            code_version="c", generation={{"temperature": 0.0}},
        )
        sample = Sample(
            sample_id="a", source="s", domain="chat",
            input_ids=torch.arange(4, dtype=torch.int32),
            loss_mask=torch.tensor([0, 0, 1, 1], dtype=torch.uint8),
            hidden_states=torch.randn(4, 16).to(torch.bfloat16),
            last_hidden_state=torch.randn(4, 8).to(torch.bfloat16),
            finish_reason="stop", num_prompt_tokens=2, num_generated_tokens=2,
        )
        with ShardWriter(open_storage({str(tmp_path)!r}), "u0", prov) as w:
            w.write(sample)
        assert w.info.rows == 1
        print("pandas" in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
