"""The capture spool format and assembly (no engine): safe files, last write wins, no holes."""

from __future__ import annotations

import os

import pytest
import torch

from pipeline.targets import capture, capture_chunks
from pipeline.targets.capture import CaptureChunk, CaptureReader, assemble
from pipeline.targets.capture_chunks import read_spool, write_spool, write_spool_planes


def _chunk(
    step: int, spans: list[tuple[str, int, int]], value: float | None = None
) -> CaptureChunk:
    rows = []
    for _key, start, length in spans:
        for pos in range(start, start + length):
            fill = value if value is not None else float(pos)
            rows.append(torch.full((2, 4), fill, dtype=torch.bfloat16))
    return CaptureChunk(
        step,
        [k for k, _, _ in spans],
        [s for _, s, _ in spans],
        [n for _, _, n in spans],
        torch.stack(rows),
    )


def test_spool_round_trip_is_safetensors_and_drains(tmp_path):
    write_spool(str(tmp_path), "w1", _chunk(0, [("a", 0, 3), ("b", 0, 2)]))
    write_spool(str(tmp_path), "w1", _chunk(1, [("a", 3, 2)]))
    names = sorted(os.listdir(tmp_path))
    assert names == ["000000000000-w1.safetensors", "000000000001-w1.safetensors"]
    from safetensors import safe_open

    with safe_open(str(tmp_path / names[0]), framework="pt") as fh:
        assert fh.metadata()["format"] == capture_chunks.SPOOL_FORMAT
    chunks = read_spool(str(tmp_path))
    # Read files become the writer's free slots (hidden), never chunks again.
    assert [c.step for c in chunks] == [0, 1]
    assert sorted(os.listdir(tmp_path)) == [".free-w1-0", ".free-w1-1"]
    assert read_spool(str(tmp_path)) == []
    assert chunks[0].keys == ["a", "b"] and chunks[0].rows.dtype == torch.bfloat16
    rows = assemble(chunks)
    assert rows["a"][:, 0, 0].tolist() == [0, 1, 2, 3, 4]
    assert rows["b"].shape == (2, 2, 4)


def test_spool_planes_read_back_as_the_rows_they_are():
    """The worker writes one tensor per stream (no stacking copy); the reader sees the
    same (rows, streams, H) rows as `write_spool` of the stacked tensor gives, and the
    final norm's in-place write reaches them."""
    import tempfile

    chunk = _chunk(0, [("a", 0, 3), ("b", 0, 2)])
    chunk.rows[:, 1] += 0.5  # the two streams differ
    planes = [chunk.rows[:, i].clone() for i in range(2)]
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        write_spool(d1, "w1", chunk)
        write_spool_planes(d2, "w1", 0, chunk.keys, chunk.starts, chunk.lengths, planes)
        (stacked,), (split,) = read_spool(d1), read_spool(d2)
    assert split.rows.shape == stacked.rows.shape == (5, 2, 4)
    assert torch.equal(split.rows, stacked.rows)
    assert (split.keys, split.starts, split.lengths) == (["a", "b"], [0, 0], [3, 2])
    split.rows[:, 1].mul_(2)  # as norm_final does, in place on the last stream
    assert torch.equal(assemble([split])["a"][:, 1], chunk.rows[:3, 1] * 2)


def test_spool_written_with_one_pwrite_where_the_os_lacks_pwritev(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "pwritev", raising=False)
    write_spool(str(tmp_path), "w1", _chunk(0, [("a", 0, 3), ("b", 0, 2)]))
    rows = assemble(read_spool(str(tmp_path)))
    assert rows["a"][:, 0, 0].tolist() == [0, 1, 2] and rows["b"].shape == (2, 2, 4)


def test_spool_files_are_recycled_and_oversized_ones_removed(tmp_path, monkeypatch):
    """A free slot is overwritten in place (same inode, its pages reused); a file past
    SPOOL_RECYCLE_BYTES is removed instead; a shorter rewrite is cut to its size."""
    directory = str(tmp_path)
    write_spool(directory, "w1", _chunk(0, [("a", 0, 6)]))
    read_spool(directory)
    inode = os.stat(tmp_path / ".free-w1-0").st_ino
    step = capture_chunks.SPOOL_SLOTS  # the writer takes slot 0 again this step
    write_spool(directory, "w1", _chunk(step, [("b", 0, 2)], value=7.0))
    assert not (tmp_path / ".free-w1-0").exists()
    name = f"{step:012d}-w1.safetensors"
    assert os.stat(tmp_path / name).st_ino == inode
    (chunk,) = read_spool(directory)
    assert chunk.keys == ["b"] and chunk.rows.shape == (2, 2, 4)
    assert chunk.rows.float().eq(7.0).all()
    monkeypatch.setattr(capture_chunks, "SPOOL_RECYCLE_BYTES", 16)
    write_spool(directory, "w1", _chunk(1, [("c", 0, 1)]))
    read_spool(directory)
    assert not (tmp_path / ".free-w1-1").exists()


def test_capture_keys_cannot_hold_the_spool_separator():
    with pytest.raises(ValueError, match="newline"):
        capture.capture_params("a\nb", "aux_outputs")


def test_temp_files_and_foreign_files_are_skipped_or_rejected(tmp_path):
    (tmp_path / ".000000000000-w1.safetensors.tmp").write_bytes(b"partial")
    assert read_spool(str(tmp_path)) == []
    from safetensors.torch import save_file

    save_file({"rows": torch.zeros(1)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="not a capture chunk"):
        read_spool(str(tmp_path))
    (tmp_path / "x.safetensors").unlink()
    # The format's name on a file without the spans: named, not a KeyError.
    save_file(
        {"rows": torch.zeros(1, 2, 4, dtype=torch.bfloat16)},
        str(tmp_path / "y.safetensors"),
        metadata={"format": capture_chunks.SPOOL_FORMAT, "step": "0", "keys": "a"},
    )
    with pytest.raises(ValueError, match="without 'spans'"):
        read_spool(str(tmp_path))


def test_later_step_overwrites_draft_row_and_holes_raise():
    # Step 0 computes positions 0..4 (prompt) ; step 1 positions 5..6, where 6 is
    # a draft row; step 2 recomputes 6 (draft rejected) and 7 (new draft).
    chunks = [
        _chunk(0, [("a", 0, 5)]),
        _chunk(1, [("a", 5, 2)], value=-1.0),
        _chunk(2, [("a", 6, 2)]),
    ]
    rows = assemble(chunks)["a"]
    assert rows[:, 0, 0].tolist() == [0, 1, 2, 3, 4, -1, 6, 7]
    with pytest.raises(RuntimeError, match="never written"):
        assemble([_chunk(0, [("a", 0, 2)]), _chunk(1, [("a", 3, 1)])])


def test_inprocess_reader_and_engine_args():
    sink = capture.SinkSpec("inprocess", "chan-1")
    capture.put_inprocess("chan-1", _chunk(1, [("k", 2, 1)]))
    capture.put_inprocess("chan-1", _chunk(0, [("k", 0, 2)]))
    assert CaptureReader(sink).collect()["k"][:, 0, 0].tolist() == [0, 1, 2]
    assert CaptureReader(sink).collect() == {}
    cfg = capture.kv_transfer_config("inprocess", "chan-1")
    assert cfg["kv_connector_module_path"] == "pipeline.targets.capture_connector"
    assert cfg["kv_connector_extra_config"] == {
        "capture_transport": "inprocess",
        "capture_channel": "chan-1",
    }
    worker = capture.worker_engine_kwargs(capture.SinkSpec("spool", "/d"), [1, 4])
    assert worker["worker_cls"] == "pipeline.targets.capture_worker.CaptureWorker"
    assert worker["additional_config"]["dspark_capture"] == {
        "aux_layer_ids": [1, 4],
        "transport": "spool",
        "capture_dir": "/d",
    }
    assert capture.capture_params("s-1", "aux_outputs") == {"dspark_capture_key": "s-1"}
    spec = capture.speculative_config([2, 5, 8])
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 5, 8]
    with pytest.raises(ValueError, match="sorted"):
        capture.speculative_config([5, 2])
    with pytest.raises(ValueError, match="unknown capture transport"):
        capture.kv_transfer_config("pickle", "x")


def test_rms_norm_matches_transformers():
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    torch.manual_seed(0)
    norm = Qwen3RMSNorm(16, eps=1e-6).to(torch.bfloat16)
    norm.weight.data = torch.randn(16).to(torch.bfloat16)
    x = torch.randn(5, 16).to(torch.bfloat16)
    assert torch.equal(capture.rms_norm(x, norm.weight.data.float(), 1e-6), norm(x))


def test_final_norm_from_checkpoint(random_target_dir):
    from transformers import AutoModelForCausalLM

    weight, eps = capture.load_final_norm(str(random_target_dir))
    model = AutoModelForCausalLM.from_pretrained(random_target_dir)
    assert torch.equal(weight, model.model.norm.weight.data)
    assert eps == model.config.rms_norm_eps


def _layout(num_aux: int = 1, hidden: int = 4):
    from pipeline.targets.capture_rows import RowLayout

    return RowLayout(num_aux, hidden, "bfloat16", torch.ones(hidden, dtype=torch.bfloat16), 1e-6)


def test_one_rows_handle_whether_the_rows_are_in_memory_or_in_the_spool(tmp_path):
    """A request's rows read by the engine's owner (`PieceRows`) and left in the spool for
    another reader (`SpooledRows`) build the same tensors behind one interface."""
    import pickle

    from pipeline.targets.capture import CaptureAssembler, SinkSpec
    from pipeline.targets.capture_rows import (
        CaptureContract,
        PieceRows,
        SpooledRows,
        close_spool,
        open_spool,
    )

    steps = [_chunk(0, [("a", 0, 3), ("b", 0, 2)]), _chunk(1, [("a", 3, 2)])]
    layout = _layout()
    assembler = CaptureAssembler()
    assembler.add(steps)
    layout.norm_final(steps)  # the spool reader applies the norm as it drains; here by hand
    in_memory = PieceRows("a", 6, assembler.take_parts("a"), layout, 6 * 16)
    for step in _chunk(0, [("a", 0, 3), ("b", 0, 2)]), _chunk(1, [("a", 3, 2)]):
        write_spool(str(tmp_path), "w1", step)
    contract = CaptureContract(SinkSpec("spool", str(tmp_path)), layout)
    spooled = pickle.loads(pickle.dumps(SpooledRows("a", 6, str(tmp_path), 6 * 16)))
    with pytest.raises(LookupError, match="open_spool"):  # no reader in this process yet
        spooled.states()
    open_spool(contract)
    try:
        want, got = in_memory.states(), spooled.states()
        assert torch.equal(got.hidden_states, want.hidden_states)
        assert torch.equal(got.last_hidden_state, want.last_hidden_state)
        assert got.hidden_states.shape == (6, 4) and not got.hidden_states[-1].any()
        # A request that becomes no sample: its rows are dropped where they are held.
        SpooledRows("b", 3, str(tmp_path), 0).release()
        with pytest.raises(RuntimeError, match="no hidden states"):
            SpooledRows("b", 3, str(tmp_path), 0).states()
    finally:
        close_spool(contract)


def test_a_followed_spool_is_read_as_the_engine_writes_it(tmp_path):
    """`open_spool(follow=True)`: files are read (and become free slots for the engine)
    without any sample being built; samples still build; closing stops the reader."""
    import time

    from pipeline.targets.capture import SinkSpec
    from pipeline.targets.capture_rows import CaptureContract, SpooledRows, close_spool, open_spool

    contract = CaptureContract(SinkSpec("spool", str(tmp_path)), _layout())
    spool = open_spool(contract, follow=True)
    try:
        write_spool(str(tmp_path), "w1", _chunk(0, [("a", 0, 3), ("b", 0, 2)]))
        deadline = time.monotonic() + 5
        while not (tmp_path / ".free-w1-0").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(os.listdir(tmp_path)) == [".free-w1-0"]  # read, nothing built yet
        assert spool.nbytes == 5 * 2 * 4 * 2
        states = SpooledRows("a", 4, str(tmp_path), 0).states()
        assert states.hidden_states.shape == (4, 4)
    finally:
        close_spool(contract)
    assert not spool._thread.is_alive()
