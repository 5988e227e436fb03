"""Codecs: bf16 is bit-exact, fp8 stays within its documented bound, frames fail loudly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.shards import codecs

from .helpers import activations


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def test_bf16_round_trip_is_bit_exact_for_every_bit_pattern():
    # All 65536 bf16 bit patterns: NaNs with payloads, +-inf, -0, subnormals.
    every = torch.from_numpy(np.arange(65536, dtype=np.uint16).view(np.int16)).view(torch.bfloat16)
    x = every.reshape(256, 256)
    y = codecs.decode(codecs.encode(x, "bf16"))
    assert y.dtype == torch.bfloat16 and y.shape == (256, 256)
    assert torch.equal(_bits(y), _bits(x))


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (64, 96), (0, 16)])
def test_bf16_round_trip_on_activations(shape):
    x = activations(shape[0], shape[1], seed=3)
    assert torch.equal(_bits(codecs.decode(codecs.encode(x, "bf16"))), _bits(x))


@pytest.mark.parametrize("shape", [(512, 1024), (50, 256)])
def test_bf16_compresses_activations_below_raw(shape):
    # (50, 256) is a short sample: both planes would share one zstd block.
    x = activations(*shape, seed=0)
    frame = codecs.encode(x, "bf16")
    assert len(frame) < 0.72 * x.numel() * 2


def test_bf16_low_plane_keeps_repeats_compressed_without_coding_literals():
    # The mantissa plane's compressor codes no literals (they do not shrink on
    # activations), but repeated bytes still become matches: a tensor of few
    # distinct values stays small, and both kinds of plane round trip exactly.
    import struct

    steps = torch.arange(64 * 512, dtype=torch.float32).reshape(64, 512) % 4
    x = (steps * 0.25 + 1.0).to(torch.bfloat16)  # 4 values, repeating
    frame = codecs.encode(x, "bf16")
    payload = frame[codecs.HEADER_BYTES :]
    (high_len,) = struct.unpack_from("<I", payload)
    low_len = len(payload) - 4 - high_len
    assert low_len < 0.05 * x.numel()
    assert torch.equal(codecs.decode(frame).view(torch.int16), x.view(torch.int16))
    noise = activations(64, 512, seed=1)
    low_frame = codecs.encode(noise, "bf16")[codecs.HEADER_BYTES :]
    (high_len,) = struct.unpack_from("<I", low_frame)
    assert len(low_frame) - 4 - high_len <= 1.01 * noise.numel()  # raw, plus framing


def test_bf16_refuses_float32_instead_of_rounding_silently():
    with pytest.raises(TypeError, match="bfloat16"):
        codecs.encode(torch.zeros(2, 2), "bf16")


def test_fp8_error_within_documented_bound():
    x = activations(256, 512, seed=1)
    frame = codecs.encode(x, "fp8")
    y = codecs.decode(frame)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    err = (y.float() - x.float()).abs()
    bound = codecs.fp8_error_bound(x, frame)
    assert bool((err <= bound).all()), f"max err/bound {float((err / bound).max()):.3f}"
    # The bound is not vacuous: the codec is lossy and gets close to it.
    assert float(err.max()) > 0
    assert float((err / bound).max()) > 0.5
    # Typical relative error of 3-mantissa-bit codes is a few percent.
    big = x.float().abs() > 0.1
    assert float((err[big] / x.float().abs()[big]).mean()) < 0.04


def test_fp8_is_smaller_than_bf16():
    x = activations(256, 512, seed=2)
    assert len(codecs.encode(x, "fp8")) < 0.65 * len(codecs.encode(x, "bf16"))


def test_fp8_rejects_non_finite():
    x = torch.ones(4, 4, dtype=torch.bfloat16)
    x[1, 2] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        codecs.encode(x, "fp8")


def test_fp8_zero_rows_and_columns_round_trip_to_zero():
    x = torch.zeros(3, 5, dtype=torch.bfloat16)
    x[1, 1] = 2.0
    y = codecs.decode(codecs.encode(x, "fp8"))
    assert torch.equal(y, x)


def test_corrupt_frames_raise_codec_error():
    frame = codecs.encode(activations(16, 16, seed=0), "bf16")
    with pytest.raises(codecs.CodecError, match="magic"):
        codecs.decode(b"XXXX" + frame[4:])
    with pytest.raises(codecs.CodecError):
        codecs.decode(frame[: len(frame) // 2])
    with pytest.raises(codecs.CodecError, match="shorter"):
        codecs.decode(frame[:5])
    unknown = frame[:5] + b"nope\0\0\0" + frame[12:]
    with pytest.raises(ValueError, match="unknown codec 'nope'"):
        codecs.decode(unknown)


def test_header_records_codec_and_shape():
    header = codecs.read_header(codecs.encode(activations(5, 12, seed=0), "fp8"))
    assert (header.codec, header.rows, header.cols) == ("fp8", 5, 12)


class _RawCodec:
    """A third-party codec: stores bf16 bits uncompressed."""

    name = "rawtest"
    lossless = True

    def encode_payload(self, tensor):
        return tensor.view(torch.int16).numpy().tobytes()

    def decode_payload(self, payload, rows, cols):
        arr = np.frombuffer(payload, dtype=np.int16).copy().reshape(rows, cols)
        return torch.from_numpy(arr).view(torch.bfloat16)


def test_codecs_are_pluggable():
    codec = _RawCodec()
    assert isinstance(codec, codecs.Codec)
    codecs.register_codec(codec)
    x = activations(4, 8, seed=0)
    frame = codecs.encode(x, "rawtest")
    assert len(frame) == codecs.HEADER_BYTES + x.numel() * 2
    assert torch.equal(_bits(codecs.decode(frame)), _bits(x))
    with pytest.raises(ValueError, match="1-7"):
        codecs.register_codec(type("C", (), {"name": "much-too-long"})())


def test_fp8_leaves_a_float32_input_untouched():
    x = activations(8, 16, seed=4).float()
    before = x.clone()
    codecs.encode(x, "fp8")
    assert torch.equal(x, before)
