"""Engine row pieces -> the contract's tensors (`RowLayout.to_states`), without an engine.

The fast path (one concatenation when the pieces tile the fed positions in
order) must give exactly what the general path (a copy per piece, later
pieces win) gives, and must step aside for every other layout.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.targets.capture import rms_norm, row_bits
from pipeline.targets.capture_rows import RowLayout, _tiled

K, H = 3, 16


def _target() -> RowLayout:
    return RowLayout(
        num_aux=K,
        hidden_size=H,
        dtype="bfloat16",
        norm_weight=torch.linspace(0.5, 1.5, H).to(torch.bfloat16),
        norm_eps=1e-6,
    )


def _rows(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, K + 1, H, generator=g).to(torch.bfloat16)


def _reference(parts, num_tokens: int):
    """Every piece copied in arrival order (last write wins), then the contract's layout."""
    fed = num_tokens - 1
    buf = torch.zeros(fed, K + 1, H, dtype=torch.bfloat16)
    for start, rows in parts:
        stop = min(start + rows.shape[0], fed)
        if stop > start:
            buf[start:stop] = rows[: stop - start]
    hidden = torch.zeros(num_tokens, K * H, dtype=torch.bfloat16)
    hidden[:fed] = buf[:, :K].reshape(fed, K * H)
    last = torch.zeros(num_tokens, H, dtype=torch.bfloat16)
    target = _target()
    last[:fed] = rms_norm(buf[:, K], target.norm_weight, target.norm_eps)
    return hidden, last


def _decode_parts(prompt: int, answer: int, seed: int = 0):
    """A prefill piece, then one row per decode step, then a throw-away row past the end."""
    parts = [(0, _rows(prompt, seed))]
    parts += [(prompt + i, _rows(1, seed + 1 + i)) for i in range(answer)]  # last is past fed
    return parts


LAYOUTS = {
    "tiled": lambda: _decode_parts(7, 5),
    "chunked prefill": lambda: [(0, _rows(3, 1)), (3, _rows(4, 2)), (7, _rows(4, 3))],
    "rewrite after preemption": lambda: _decode_parts(7, 5) + [(2, _rows(6, 9))],
    "out of order": lambda: [(4, _rows(7, 1)), (0, _rows(4, 2))],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_the_reference_tensors(layout):
    parts = LAYOUTS[layout]()
    cap = _target().to_states("r", 12, parts)
    hidden, last = _reference(parts, 12)
    assert torch.equal(cap.hidden_states, hidden)
    assert torch.equal(cap.last_hidden_state, last)
    assert cap.hidden_states.shape == (12, K * H) and not cap.hidden_states[-1].any()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_assemblers_numpy_pieces_give_the_same_tensors(layout):
    """The assembler hands out numpy views of the rows' bits (`row_bits`); both paths take them."""
    parts = LAYOUTS[layout]()
    bits = [(start, row_bits(rows)) for start, rows in parts]
    for normed in (False, True):
        want = _target().to_states("r", 12, parts, normed=normed)
        got = _target().to_states("r", 12, bits, normed=normed)
        assert torch.equal(got.hidden_states, want.hidden_states)
        assert torch.equal(got.last_hidden_state, want.last_hidden_state)
        assert got.hidden_states.dtype == torch.bfloat16


def test_fast_path_taken_only_for_in_order_tiles():
    assert _tiled(_decode_parts(7, 5), 11) is not None
    assert _tiled(LAYOUTS["chunked prefill"](), 11) is not None
    assert _tiled(LAYOUTS["rewrite after preemption"](), 11) is None
    assert _tiled(LAYOUTS["out of order"](), 11) is None
    assert _tiled([(0, _rows(5, 0))], 11) is None  # too short: the general path names the hole


def test_a_position_never_written_is_an_error():
    parts = [(0, _rows(4, 0)), (6, _rows(6, 1))]  # positions 4 and 5 missing
    with pytest.raises(RuntimeError, match=r"positions never written: \[4, 5\]"):
        _target().to_states("r", 12, parts)
