"""Tensor codecs: how a [T, W] hidden-state tensor becomes bytes in a shard, and back.

Every encoded tensor is a self-describing *frame*:

    magic b"DSPT" | frame version (u8) | codec name (7 bytes, ascii, NUL padded)
    | rows T (u32 LE) | cols W (u32 LE) | codec payload

so a frame decodes without the shard's metadata and `verify` can check its
shape against the row's token count. Codecs are pluggable: anything with the
`Codec` protocol's shape can be `register_codec`-ed under a new name.

Layout decisions, measured on the fixed synthetic stream (bench/storage.py;
seed 0, T=2048 x H=4096, bf16) on one core:

* bf16: Parquet's own BYTE_STREAM_SPLIT over a `fixed_size_binary(2)` /
  `list<uint16>` column reaches 0.69 of raw but writes at only 30-80 MB/s
  (per-element overhead in the Parquet writer), so the codec splits byte planes
  itself (numpy, ~1.5 GB/s) and stores one binary value per tensor. zstd level 3
  gives 0.72 of raw, level 1 gives 0.69: on the near-random mantissa plane the
  match finder only finds spurious short matches that cost more than they save.
  A "literals first" parameter set (fast strategy, min match 7, 128 KiB window,
  a 256-entry hash table that stays in L1) leaves the work to zstd's Huffman
  literal coder: 0.680 at roughly twice the speed of zstd level 1, close to the
  order-0 entropy of the planes (0.676); a 4096-entry table gave 0.684 at half
  the speed (more spurious matches, cache misses). zstd-19 (0.68) is ~30x slower. Splitting exponent and sign+mantissa fields instead of bytes
  and centring exponents per channel reaches 0.674 but costs ~30% speed; not
  worth it at the 200 MB/s floor.
* fp8: e4m3 codes with one float32 scale per token. With only a per-token
  scale the order-0 entropy of the codes is 0.428 of raw bf16 (zstd: 0.432),
  above the 0.42 goal, because the few massive channels set every token's
  scale and the other channels' codes spread over many exponents. A per-channel
  power-of-two pre-scale (one int8 exponent per column, exact to apply and
  undo) equalises the channels: 0.414 of raw, and smaller errors too.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import zstandard

MAGIC = b"DSPT"
FRAME_VERSION = 1
_HEADER = struct.Struct("<4sB7sII")
HEADER_BYTES = _HEADER.size

# See the module docstring: zstd with the match finder all but switched off.
_ZSTD_PARAMS = dict(
    window_log=17, hash_log=8, chain_log=8, search_log=1, min_match=7, target_length=0
)


_LOCAL = threading.local()


def _compressor(literals: bool = True) -> zstandard.ZstdCompressor:
    """This thread's compressor (one per thread: a compressor is not thread-safe, and
    building one per frame costs as much as compressing a short sample's frame).

    `literals=False`: literals stored as they are, for the bf16 mantissa plane,
    which zstd's Huffman coder cannot shrink (0.9951 of raw on the trained toy's
    shards either way) but spent 3/4 of the plane's time trying; matches (runs of
    zeros) are still found. zstd turns literal coding off by itself at the fast
    strategy with a target length above 0; python-zstandard has no direct switch.
    """
    attr = "compressor" if literals else "raw_literals"
    compressor = getattr(_LOCAL, attr, None)
    if compressor is None:
        params = zstandard.ZstdCompressionParameters(
            strategy=1,  # fast
            **{**_ZSTD_PARAMS, "target_length": 0 if literals else 1},
        )
        compressor = zstandard.ZstdCompressor(compression_params=params)
        setattr(_LOCAL, attr, compressor)
    return compressor


class CodecError(ValueError):
    """A frame is malformed, truncated or of an unknown codec."""


@dataclass(frozen=True)
class FrameHeader:
    codec: str
    rows: int  # T
    cols: int  # W


@runtime_checkable
class Codec(Protocol):
    """Turns a 2-D tensor (T, W) into payload bytes and back to bfloat16."""

    name: str  # at most 7 ascii characters; stored in every frame
    lossless: bool

    def encode_payload(self, tensor: torch.Tensor) -> bytes: ...

    def decode_payload(self, payload: memoryview, rows: int, cols: int) -> torch.Tensor: ...


_REGISTRY: dict[str, Codec] = {}


def register_codec(codec: Codec) -> None:
    """Make a codec available by name to writers and to frame decoding."""
    name = codec.name
    if not (0 < len(name) <= 7 and name.isascii() and name.isprintable()):
        raise ValueError(f"codec name {name!r} must be 1-7 printable ascii characters")
    _REGISTRY[name] = codec


def get_codec(name: str) -> Codec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; registered: {sorted(_REGISTRY)}") from None


def codec_names() -> list[str]:
    return sorted(_REGISTRY)


def encode(tensor: torch.Tensor, codec: str | Codec) -> bytes:
    """Encode a (T, W) tensor into a frame with the named codec."""
    codec = get_codec(codec) if isinstance(codec, str) else codec
    if tensor.dim() != 2:
        raise ValueError(
            f"codec {codec.name}: expected a 2-D (T, W) tensor, got {tuple(tensor.shape)}"
        )
    rows, cols = tensor.shape
    header = _HEADER.pack(MAGIC, FRAME_VERSION, codec.name.encode("ascii"), rows, cols)
    return header + codec.encode_payload(tensor.detach().cpu().contiguous())


def read_header(frame: bytes | memoryview) -> FrameHeader:
    if len(frame) < HEADER_BYTES:
        raise CodecError(
            f"frame of {len(frame)} bytes is shorter than its {HEADER_BYTES}-byte header"
        )
    magic, version, name, rows, cols = _HEADER.unpack_from(frame)
    if magic != MAGIC:
        raise CodecError(f"not a tensor frame (magic {magic!r}, expected {MAGIC!r})")
    if version != FRAME_VERSION:
        raise CodecError(f"frame version {version} is not supported (expected {FRAME_VERSION})")
    return FrameHeader(name.rstrip(b"\0").decode("ascii"), rows, cols)


def decode(frame: bytes | memoryview) -> torch.Tensor:
    """Decode a frame to a bfloat16 tensor of shape (T, W)."""
    header = read_header(frame)
    codec = get_codec(header.codec)
    payload = memoryview(frame)[HEADER_BYTES:]
    try:
        out = codec.decode_payload(payload, header.rows, header.cols)
    except zstandard.ZstdError as err:
        raise CodecError(f"{header.codec} frame ({header.rows}x{header.cols}): {err}") from None
    if tuple(out.shape) != (header.rows, header.cols):
        raise CodecError(
            f"{header.codec} frame decoded to {tuple(out.shape)}, header says "
            f"({header.rows}, {header.cols})"
        )
    return out


def _bf16_bits(tensor: torch.Tensor) -> np.ndarray:
    """(T, W) bfloat16 tensor -> (T, W) uint16 numpy view of its bits (no copy)."""
    return tensor.view(torch.int16).numpy().view(np.uint16)


def _from_bits(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


def _decompress(payload: memoryview | bytes, size: int, what: str) -> np.ndarray:
    data = zstandard.ZstdDecompressor().decompress(payload, max_output_size=size)
    if len(data) != size:
        raise CodecError(f"{what}: decompressed {len(data)} bytes, expected {size}")
    return np.frombuffer(data, dtype=np.uint8)


class Bf16Codec:
    """Lossless: the high-byte plane and the low-byte plane, each its own zstd frame.

    The high byte (sign + 7 exponent bits) of activations has ~2.8 bits of
    entropy, the low byte (1 exponent + 7 mantissa bits) ~8; splitting lets
    zstd's Huffman coder see the skew. Separate frames matter for short
    samples: in one frame, a tensor under 64 KiB of values puts both planes in
    one 128 KiB block with one Huffman table, and the skew is lost (measured on
    the toy target: 0.78 of raw instead of 0.68). The low plane's frame codes
    no literals (`_compressor(literals=False)`): nothing to gain there, and
    trying cost 3/4 of its time on short samples. Round trip is bit-exact (NaN
    payloads too). Payload: u32 LE length of the high frame | high frame | low frame.
    """

    name = "bf16"
    lossless = True

    def encode_payload(self, tensor: torch.Tensor) -> bytes:
        if tensor.dtype != torch.bfloat16:
            raise TypeError(
                f"codec bf16 stores bfloat16 tensors losslessly; got {tensor.dtype} "
                "(cast with .to(torch.bfloat16) if rounding is intended, or use codec fp8)"
            )
        bits = _bf16_bits(tensor).reshape(-1)
        n = bits.size
        high = np.empty(n, dtype=np.uint8)
        low = np.empty(n, dtype=np.uint8)
        np.right_shift(bits, 8, out=high, casting="unsafe")
        np.copyto(low, bits, casting="unsafe")  # truncating cast keeps the low byte
        high_frame = _compressor().compress(high)
        low_frame = _compressor(literals=False).compress(low)
        return struct.pack("<I", len(high_frame)) + high_frame + low_frame

    def decode_payload(self, payload: memoryview, rows: int, cols: int) -> torch.Tensor:
        n = rows * cols
        if len(payload) < 4:
            raise CodecError(f"bf16 frame payload of {len(payload)} bytes is truncated")
        (high_len,) = struct.unpack_from("<I", payload)
        if 4 + high_len > len(payload):
            raise CodecError(f"bf16 frame: high plane of {high_len} bytes overruns the payload")
        high = _decompress(payload[4 : 4 + high_len], n, "bf16 frame, high plane")
        low = _decompress(payload[4 + high_len :], n, "bf16 frame, low plane")
        bits = high.astype(np.uint16)
        bits <<= 8
        bits |= low
        return _from_bits(bits.reshape(rows, cols))


# e4m3 ("fn": no infinities) largest finite value.
E4M3_MAX = 448.0
# Error bound of `Fp8Codec`, see its docstring.
FP8_REL_BOUND = 2.0**-4 + 2.0**-8 * (1 + 2.0**-4) + 2.0**-20
FP8_ABS_BOUND = 2.0**-10 * (1 + 2.0**-8) + 2.0**-20
# float32 value of every e4m3fn code (index = code byte).
_E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()


class Fp8Codec:
    """Lossy: float8 e4m3 codes with a float32 scale per token (row).

    Encoding: c_j = 2^round(log2 max_t |x_tj|) per column j (int8 exponent),
    s_t = max_j |x_tj / c_j| / 448 per row t, q_tj = e4m3(x_tj / (c_j s_t)),
    rounded to nearest even. Decoding: x'_tj = bf16(float32(q_tj) * s_t * c_j).

    Error bound, for every element (`fp8_error_bound` computes it):

        |x' - x| <= FP8_REL_BOUND * |x| + FP8_ABS_BOUND * s_t * c_j
                 ~= 0.0667 |x| + 0.00098 s_t c_j

    e4m3 keeps 3 mantissa bits, so a normal code is within 2^-4 relative; codes
    below 2^-6 are subnormal with spacing 2^-9 (absolute 2^-10 after scaling
    back); rounding the result to bf16 adds 2^-8 relative. Inputs must be finite.

    Payload: s (T float32) | channel exponents (W int8) | zstd(codes, T*W bytes).
    """

    name = "fp8"
    lossless = False

    def encode_payload(self, tensor: torch.Tensor) -> bytes:
        if not tensor.is_floating_point():
            raise TypeError(f"codec fp8 needs a floating-point tensor, got {tensor.dtype}")
        x = tensor.to(torch.float32, copy=True)  # (T, W); modified in place below
        # max |x| per column without materialising |x|; NaN propagates through amax.
        col_max = torch.maximum(x.amax(dim=0), x.amin(dim=0).neg_())  # (W,)
        if not bool(torch.isfinite(col_max).all()):
            raise ValueError("codec fp8 cannot encode non-finite values (NaN/inf in the tensor)")
        exps = torch.where(col_max > 0, torch.log2(col_max).round(), torch.zeros_like(col_max))
        exps = exps.clamp(-126, 126).to(torch.int8)  # (W,)
        x.mul_(torch.exp2(-exps.float()))  # exact: powers of two
        row_max = torch.maximum(x.amax(dim=1), x.amin(dim=1).neg_())  # (T,)
        scales = torch.where(row_max > 0, row_max / E4M3_MAX, torch.ones_like(row_max))
        # |x / s| <= 448 up to one float32 rounding, far below 464 where e4m3fn
        # conversion would overflow to NaN, so no clamp is needed.
        x.div_(scales[:, None])
        codes = x.to(torch.float8_e4m3fn).view(torch.uint8).numpy()  # (T, W)
        return (
            scales.numpy().astype("<f4").tobytes()
            + exps.numpy().tobytes()
            + _compressor().compress(codes)
        )

    def decode_payload(self, payload: memoryview, rows: int, cols: int) -> torch.Tensor:
        head = 4 * rows + cols
        if len(payload) < head:
            raise CodecError(f"fp8 frame payload of {len(payload)} bytes is truncated")
        scales = torch.from_numpy(np.frombuffer(payload[: 4 * rows], dtype="<f4").copy())
        exps = torch.from_numpy(np.frombuffer(payload[4 * rows : head], dtype=np.int8).copy())
        codes = _decompress(payload[head:], rows * cols, "fp8 frame").reshape(rows, cols)
        # A 256-entry lookup table is ~4x faster than torch's fp8 -> float32 cast on CPU.
        q = torch.from_numpy(np.take(_E4M3_VALUES, codes))  # (T, W) float32
        q.mul_(scales[:, None]).mul_(torch.exp2(exps.float()))
        return q.to(torch.bfloat16)

    @staticmethod
    def scales(frame: bytes | memoryview) -> tuple[torch.Tensor, torch.Tensor]:
        """(s_t (T,), c_j (W,)) of an fp8 frame, for error bounds and inspection."""
        header = read_header(frame)
        payload = memoryview(frame)[HEADER_BYTES:]
        rows, cols = header.rows, header.cols
        s = torch.from_numpy(np.frombuffer(payload[: 4 * rows], dtype="<f4").copy())
        e = torch.from_numpy(
            np.frombuffer(payload[4 * rows : 4 * rows + cols], dtype=np.int8).copy()
        )
        return s, torch.exp2(e.float())


def fp8_error_bound(x: torch.Tensor, frame: bytes | memoryview) -> torch.Tensor:
    """Per-element bound on |decode(frame) - x| for an fp8 frame of x (see Fp8Codec)."""
    s, c = Fp8Codec.scales(frame)
    return FP8_REL_BOUND * x.float().abs() + FP8_ABS_BOUND * s[:, None] * c[None, :]


register_codec(Bf16Codec())
register_codec(Fp8Codec())
