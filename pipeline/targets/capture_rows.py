"""A request's captured rows behind one handle, built into tensors by whoever holds them.

The engine's capture code hands rows to a sink one engine step at a time
(`capture.py`: a `CaptureChunk` names, per request, which positions its rows
are). Turning a finished request's pieces into the `CapturedStates` contract
(aux streams as (T, k*H), the final state after the target's final norm as
(T, H), the never-fed last row zero) needs only the layout of the rows
(`RowLayout`), so it can run anywhere. `VLLMTarget.poll` returns each
finished request's rows as a `CapturedRows` handle (targets/base.py):
`PieceRows` when the engine owner read them, `SpooledRows` when they stay in
the spool for a reader in another process (the write-back's, which opens it
with `open_spool` and the picklable `CaptureContract`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.logs import kv
from pipeline.targets.base import CapturedStates
from pipeline.targets.capture import (
    CaptureAssembler,
    CaptureChunk,
    CaptureReader,
    SinkSpec,
    as_bits,
    as_rows,
    from_bits,
    rms_norm,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowLayout:
    """How an engine's captured rows are laid out: k aux streams + the final one, width H."""

    num_aux: int  # k
    hidden_size: int  # H
    dtype: str  # torch dtype name of the rows, e.g. "bfloat16"
    norm_weight: torch.Tensor  # (H,), the target's final norm, in `dtype`
    norm_eps: float

    def norm_final(self, chunks: list[CaptureChunk]) -> None:
        """Apply the final norm to every chunk's last stream in place, once per engine step
        (a few tensor ops over all of a step's rows, instead of the same ops per sample);
        `to_states(..., normed=True)` then copies it as it is."""
        for chunk in chunks:
            final = chunk.rows[:, self.num_aux]
            final.copy_(rms_norm(final, self.norm_weight, self.norm_eps))

    def to_states(
        self,
        request_id: str,
        num_tokens: int,
        parts: list[tuple[int, Any]],
        *,
        normed: bool = False,
    ) -> CapturedStates:
        """Engine row pieces -> the contract's (T, k*H) and (T, H) tensors (thread-safe).

        Raises RuntimeError when nothing was captured.

        Pieces `(start, rows (n, k+1, H))`, tensors or the assembler's numpy
        views (`capture.row_bits`), arrive in step order (a later one
        overwrites an earlier one at the same position) and go straight into
        the output tensors: one copy of the captured bytes, not three. Raises
        RuntimeError when a fed position was never written. `normed`: the
        pieces' last stream already went through `norm_final`.
        """
        import numpy as np
        import torch

        dtype = getattr(torch, self.dtype)
        fed = num_tokens - 1  # the last sampled token is never fed
        k, width = self.num_aux, self.hidden_size
        if not parts:
            raise RuntimeError(f"capture {request_id!r}: no hidden states were captured")
        tiled = _tiled(parts, fed)
        if tiled is not None:
            # The common case (no preemption, no rewrite): the pieces cover 0..fed
            # in order, so one concatenation replaces a copy per engine step, in
            # numpy on the rows' bits (docs/capture.md, "Memory and writing").
            rows = np.concatenate([as_bits(p) for p in tiled])
            hidden_bits = np.empty((num_tokens, k * width), dtype=rows.dtype)
            hidden_bits[:fed].reshape(fed, k, width)[:] = rows[:, :k]
            hidden_bits[fed:] = 0  # the last sampled token, never fed
            last_bits = np.empty((num_tokens, width), dtype=rows.dtype)
            last_bits[:fed] = rows[:, k]
            last_bits[fed:] = 0
            hidden, last = from_bits(hidden_bits, dtype), from_bits(last_bits, dtype)
            if not normed:
                last[:fed] = rms_norm(last[:fed], self.norm_weight, self.norm_eps)
            return CapturedStates(hidden, last)
        hidden = torch.zeros(num_tokens, k * width, dtype=dtype)
        streams = hidden[:fed].view(fed, k, width)
        final = torch.empty(fed, width, dtype=dtype)
        written = torch.zeros(fed, dtype=torch.bool)
        for start, piece in parts:
            rows = as_rows(piece, dtype)
            stop = min(start + rows.shape[0], fed)
            if stop <= start:
                continue  # a throw-away draft row past the last fed token
            streams[start:stop] = rows[: stop - start, :k]
            final[start:stop] = rows[: stop - start, k]
            written[start:stop] = True
        if not bool(written.all()):
            missing = (~written).nonzero().flatten()[:8].tolist()
            raise RuntimeError(f"capture {request_id!r}: positions never written: {missing}")
        last = torch.zeros(num_tokens, width, dtype=dtype)
        last[:fed] = final if normed else rms_norm(final, self.norm_weight, self.norm_eps)
        return CapturedStates(hidden, last)


def _tiled(parts, fed: int):
    """The pieces' rows for positions 0..fed, if they tile them in order exactly once (else None).

    Rows past `fed` (a throw-away draft row) are cut; any gap, overlap or
    out-of-order piece returns None and the caller takes the general path.
    """
    out, at = [], 0
    for start, rows in parts:
        if at >= fed:
            if start < fed:
                return None  # a later piece rewrites a position
            continue
        if start != at:
            return None
        n = min(rows.shape[0], fed - at)
        out.append(rows[:n] if n < rows.shape[0] else rows)
        at += n
    return out if at == fed else None


@dataclass(frozen=True)
class CaptureContract:
    """What a process other than the engine's owner needs to build captured tensors.

    Only the spool transport crosses processes (its files live in a directory
    both can read); the in-process registry does not.
    """

    sink: SinkSpec
    layout: RowLayout

    def __post_init__(self) -> None:
        if self.sink.transport != "spool":
            raise ValueError(
                f"a capture contract needs the spool transport, not {self.sink.transport!r}"
            )


class SpoolRows:
    """Reads an engine's spool and builds finished requests' tensors (one reader per spool).

    `take` drains every complete chunk file first: the engine writes a
    request's rows before its output leaves the engine, so once the owner has
    seen the request finish, all of its rows are on disk. Draining and taking
    hold a lock; building (`RowLayout.to_states`) then runs outside it.
    """

    def __init__(self, contract: CaptureContract) -> None:
        self.layout = contract.layout
        self._reader = CaptureReader(contract.sink)
        self._assembler = CaptureAssembler()
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes of rows read from the spool and held for requests not taken yet."""
        return self._assembler.nbytes

    def drain(self) -> int:
        """Read every complete chunk file now; how many there were."""
        chunks = self._reader.take_chunks()
        self.layout.norm_final(chunks)
        self._assembler.add(chunks)
        return len(chunks)

    def follow(self, idle_s: float = 0.002) -> None:
        """Read the spool as the engine writes it, on a thread of its own, until `close`.

        The engine reuses a file only once it was read (capture_chunks.py); a
        reader that drains only when it builds a sample falls behind whenever
        it encodes or writes a shard, and the engine then makes a new file
        (fresh tmpfs pages) every step, on the model worker's critical path.
        Reading here moves that cost to this process. A chunk that cannot be
        read stops the thread (logged); `take` then meets the same error.
        """
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._follow, args=(idle_s,), name="spool-reader", daemon=True
        )
        self._thread.start()

    def _follow(self, idle_s: float) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    read = self.drain()
            except Exception as err:  # the owner's next take() raises it where it matters
                log.error("stopped reading the capture spool %s", kv(error=repr(err)))
                return
            if not read:
                self._stop.wait(idle_s)

    def close(self) -> None:
        """Stop `follow`'s thread (a no-op where it was not started)."""
        thread = getattr(self, "_thread", None)
        if thread is not None:
            self._stop.set()
            thread.join(timeout=10)

    def take(self, request_id: str, fed: int | None = None) -> list[tuple[int, Any]]:
        """A finished request's pieces (drains first); [] when nothing was captured.

        `fed`: the request's fed positions; when the pieces held already reach
        them, no drain is needed (files appear in step order, so every step up
        to the one that wrote the last position was read, and a finished request
        has no later step). The write-back takes a whole engine step's finished
        requests in a row, and only the first of them lists the spool.
        """
        with self._lock:
            if fed is None or not self._assembler.reaches(request_id, fed):
                self.drain()
            return self._assembler.take_parts(request_id)

    def discard(self, request_id: str) -> None:
        """Drop the rows of a request nobody will build (a failed or empty answer)."""
        with self._lock:
            self.drain()
            self._assembler.discard(request_id)


# The spool readers of this process, by spool directory: `SpooledRows` finds its own here.
_SPOOLS: dict[str, SpoolRows] = {}


def open_spool(contract: CaptureContract, *, follow: bool = False) -> SpoolRows:
    """Read `contract`'s spool in this process from now on (the write-back's, once);
    `follow`: as the engine writes it (`SpoolRows.follow`), not only as samples are built."""
    reader = _SPOOLS[contract.sink.capture_dir] = SpoolRows(contract)
    if follow:
        reader.follow()
    return reader


def close_spool(contract: CaptureContract) -> None:
    reader = _SPOOLS.pop(contract.sink.capture_dir, None)
    if reader is not None:
        reader.close()


@dataclass(frozen=True)
class PieceRows:
    """A request's row pieces, taken from the engine's sink by its owner (not built yet)."""

    request_id: str
    num_tokens: int  # T
    parts: list[tuple[int, Any]] = field(repr=False)
    layout: RowLayout = field(repr=False)
    nbytes: int

    def states(self) -> CapturedStates:
        return self.layout.to_states(self.request_id, self.num_tokens, self.parts, normed=True)

    def release(self) -> None:
        pass  # the pieces are this handle's own


@dataclass(frozen=True)
class SpooledRows:
    """A request's rows left in the engine's spool (`VLLMTarget.hand_off_rows`): plain
    data, picklable; built in the process that opened the spool (`open_spool`)."""

    request_id: str
    num_tokens: int  # T
    spool_dir: str
    nbytes: int

    def states(self) -> CapturedStates:
        spool = self._spool()
        parts = spool.take(self.request_id, self.num_tokens - 1)
        return spool.layout.to_states(self.request_id, self.num_tokens, parts, normed=True)

    def release(self) -> None:
        self._spool().discard(self.request_id)

    def _spool(self) -> SpoolRows:
        spool = _SPOOLS.get(self.spool_dir)
        if spool is None:
            raise LookupError(
                f"capture {self.request_id!r}: this process does not read the spool "
                f"{self.spool_dir} (open_spool was not called)"
            )
        return spool
