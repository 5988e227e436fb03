"""The reader schemas/README.md gives downstream repos (numpy + zstandard only) decodes real shards."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from shards.helpers import write_unit

from pipeline.shards import codecs
from pipeline.table.dataset import Dataset
from pipeline.table.layout import manifest_key

README = Path(__file__).resolve().parents[2] / "schemas" / "README.md"


def _tiny_reader() -> dict:
    text = README.read_text()
    block = re.search(r"<!-- tiny-reader: begin -->\n```python\n(.*?)```", text, re.S).group(1)
    frame_lines = block.split("def decode_frame")[1].split("\n\n\n")[0].count("\n")
    assert frame_lines <= 20, frame_lines  # twenty lines, as the README says
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    return namespace


def test_the_readme_reader_decodes_both_codecs_and_resolves_a_version(tmp_path):
    tiny = _tiny_reader()
    ds = Dataset.open(tmp_path / "ds")
    a, sa = write_unit(ds, "unit-a", 3)
    ds.commit([a])
    b, _ = write_unit(Dataset.open(tmp_path / "fp8"), "unit-b", 2, codec="fp8")
    ds.commit([write_unit(ds, "unit-c", 2)[0]], drop={a.path: [sa[0].sample_id]})
    for root, path, exact in ((ds.storage.root, a.path, True), (tmp_path / "fp8", b.path, False)):
        table = pq.read_table(Path(root) / path)
        for name in ("hidden_states", "last_hidden_state"):
            for frame in table.column(name).to_pylist():
                ours = codecs.decode(frame).float().numpy()
                theirs = tiny["decode_frame"](frame)
                if exact:  # bf16: bit for bit
                    assert np.array_equal(theirs, ours)
                    bits = torch.from_numpy(theirs).to(torch.bfloat16).view(torch.int16)
                    assert torch.equal(bits, codecs.decode(frame).view(torch.int16))
                else:  # fp8: before the project's final rounding to bf16
                    assert np.allclose(theirs, ours, rtol=2**-8, atol=0)
    root_json = json.loads(ds.storage.read_bytes(manifest_key(2)))
    shards = tiny["version_shards"](root_json, lambda key: json.loads(ds.storage.read_bytes(key)))
    manifest = ds.manifest(2)
    assert shards == {e.path: set(e.dropped) for e in manifest.shards}
    assert shards[a.path] == {sa[0].sample_id}
