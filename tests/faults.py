"""Fault injection for tests: a filesystem wrapper that fails calls, and a disk that fills up.

`FaultyFS` wraps the s3fs filesystem *beneath* `S3Storage`'s retry policy, so
what it injects is what a flaky network does to the production code path:

* a share `rate` of calls fails with a transient error (connection reset,
  timeout, 500/503 the way s3fs hands them over), never more than
  `max_in_a_row` times in a row for one (operation, key), so a retry policy
  with more attempts than that always gets through and a run is repeatable;
* half of the failed writes fail *after* the request landed (the answer is
  lost): a retried PUT, part or complete must recognise its own object;
* a failed read first consumes part of what it was asked for, as a reset in
  the middle of a body does: the reader must resume at its own offset.

`FullDisk` wraps a `LocalStorage`: once `free_bytes` are written it raises
`OSError(ENOSPC)` from the write that crosses it, as a full filesystem does
(mounting a small tmpfs or loop device needs privileges this machine's
tests do not have, and a wrapper fails at an exact, repeatable byte).

`install_faults(monkeypatch, faults)` makes every `S3Storage` this process
opens use a `FaultyFS`.
"""

from __future__ import annotations

import contextlib
import errno
import random
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError

# s3fs methods S3Storage calls, and whether they change the store.
_READS = {"exists", "info", "find", "cat_file"}
_WRITES = {"rm_file"}
_S3_WRITES = {
    "put_object",
    "create_multipart_upload",
    "upload_part",
    "complete_multipart_upload",
    "abort_multipart_upload",
    "delete_object",
}


class Faults:
    """Which calls fail (see the module docstring); counts what it injected."""

    def __init__(
        self,
        rate: float = 0.1,
        *,
        seed: int = 0,
        max_in_a_row: int = 2,
        ops: set[str] | None = None,
    ) -> None:
        self.rate, self.max_in_a_row, self.ops = rate, max_in_a_row, ops
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._streak: Counter[tuple[str, str]] = Counter()
        self.calls: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.enabled = True

    def decide(self, op: str, key: str, *, write: bool) -> str | None:
        """None (the call goes through), "before" (it never ran) or "after" (its answer is lost)."""
        with self._lock:
            self.calls[op] += 1
            if not self.enabled or (self.ops is not None and op not in self.ops):
                return None
            streak = self._streak[(op, key)]
            if streak >= self.max_in_a_row or self._rng.random() >= self.rate:
                self._streak[(op, key)] = 0
                return None
            self._streak[(op, key)] = streak + 1
            when = "after" if write and self._rng.random() < 0.5 else "before"
            self.injected[f"{op}:{when}"] += 1
            return when

    def withdraw(self, op: str, key: str, when: str) -> None:
        """Take back a decided fault whose call failed by itself (nothing was injected)."""
        with self._lock:
            self.injected[f"{op}:{when}"] -= 1
            self._streak[(op, key)] = max(0, self._streak[(op, key)] - 1)

    def error(self, op: str) -> BaseException:
        with self._lock:
            kind = self._rng.randrange(4)
        if kind == 0:
            return ConnectionResetError(errno.ECONNRESET, f"injected: connection reset ({op})")
        if kind == 1:
            return TimeoutError(f"injected: read timed out ({op})")
        code, status = ("SlowDown", 503) if kind == 2 else ("InternalError", 500)
        cause = ClientError(
            {
                "Error": {"Code": code, "Message": "injected"},
                "ResponseMetadata": {"HTTPStatusCode": status},
            },
            op,
        )
        err = OSError(errno.EIO, f"injected: {code} ({op})")  # as s3fs translates it
        err.__cause__ = cause
        return err

    @property
    def num_injected(self) -> int:
        return sum(self.injected.values())

    @property
    def num_calls(self) -> int:
        return sum(self.calls.values())


class FaultyFS:
    """An s3fs filesystem whose calls fail as `faults` decides (the module docstring)."""

    def __init__(self, fs: Any, faults: Faults) -> None:
        self._fs, self._faults = fs, faults

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name in _READS or name in _WRITES:

            def call(path: str, *args: Any, **kwargs: Any) -> Any:
                return self._around(
                    name, str(path), name in _WRITES, lambda: attr(path, *args, **kwargs)
                )

            return call
        return attr

    def _around(self, op: str, key: str, write: bool, fn: Any) -> Any:
        when = self._faults.decide(op, key, write=write)
        if when == "before":
            raise self._faults.error(op)
        try:
            result = fn()
        except BaseException:
            if when == "after":  # the call failed on its own: nothing was injected
                self._faults.withdraw(op, key, when)
            raise
        if when == "after":
            raise self._faults.error(op)
        return result

    def call_s3(self, method: str, *args: Any, **kwargs: Any) -> Any:
        key = f"{kwargs.get('Key', '')}#{kwargs.get('PartNumber', '')}"
        return self._around(
            method, key, method in _S3_WRITES, lambda: self._fs.call_s3(method, *args, **kwargs)
        )

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        inner = self._around("open", str(path), False, lambda: self._fs.open(path, mode, **kwargs))
        return _FaultyRead(inner, self._faults, str(path)) if "r" in mode else inner


class _FaultyRead:
    """A read file whose `read` fails part-way through (after consuming some bytes)."""

    def __init__(self, inner: Any, faults: Faults, path: str) -> None:
        self._inner, self._faults, self._path = inner, faults, path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, size: int = -1) -> bytes:
        when = self._faults.decide("read", self._path, write=False)
        if when is not None:
            if size and size > 1:
                self._inner.read(size // 2)  # half a body arrived, then the reset
            raise self._faults.error("read")
        return self._inner.read(size)

    def close(self) -> None:
        self._inner.close()


def install_faults(monkeypatch, faults: Faults) -> None:
    """Every S3Storage opened in this process from now on goes through a FaultyFS."""
    from pipeline.storage.s3 import S3Storage

    original = S3Storage.__init__

    def init(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.fs = FaultyFS(self.fs, faults)

    monkeypatch.setattr(S3Storage, "__init__", init)


class FullDisk:
    """A LocalStorage with `free_bytes` of room: the write that crosses it raises ENOSPC."""

    def __init__(self, inner: Any, free_bytes: int) -> None:
        self._inner, self.free_bytes = inner, free_bytes
        self._lock = threading.Lock()
        self.refusals = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"FullDisk({self._inner!r})"

    def _spend(self, n: int) -> None:
        with self._lock:
            if n > self.free_bytes:
                self.refusals += 1
                self.free_bytes = 0
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            self.free_bytes -= n

    @contextlib.contextmanager
    def _stream(self, opener: Any, key: str) -> Iterator[Any]:
        with opener(key) as fh:
            yield _Spending(fh, self._spend)

    def open_create(self, key: str) -> contextlib.AbstractContextManager:
        return self._stream(self._inner.open_create, key)

    def open_write(self, key: str) -> contextlib.AbstractContextManager:
        return self._stream(self._inner.open_write, key)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self._spend(len(data))
        self._inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, tag: str | None) -> str:
        self._spend(len(data))
        return self._inner.put_if_match(key, data, tag)


class _Spending:
    def __init__(self, fh: Any, spend: Any) -> None:
        self._fh, self._spend = fh, spend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)

    def write(self, data: bytes | memoryview) -> int:
        self._spend(len(data))
        return self._fh.write(data)
