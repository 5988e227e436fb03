"""The storage contract: the `Storage` protocol, its errors, keys, and the retry policy.

See `pipeline/storage/__init__.py` for the guarantees each kind of write gives.
Transient errors (timeouts, 5xx, throttling) are retried with exponential
backoff and jitter; everything else (412, 403, 404) surfaces at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class StorageError(OSError):
    """A storage operation failed for a reason other than a failed precondition."""


class AlreadyExists(FileExistsError):
    """A create-only put found the key already present."""


class PreconditionFailed(RuntimeError):
    """A compare-and-swap found a different version of the object than expected."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the storage root
    size: int
    mtime: float  # seconds since the epoch


@dataclass(frozen=True)
class UploadInfo:
    """A streaming write that has started and not finished (S3: a multipart upload)."""

    key: str  # the key it will create, relative to the storage root
    upload_id: str
    initiated: float  # seconds since the epoch


class Storage(Protocol):
    """What the shards layer needs from a filesystem; see the module docstring."""

    uri: str  # root, as given (local path or s3://bucket/prefix)

    def url(self, key: str) -> str: ...
    def exists(self, key: str) -> bool: ...
    def info(self, key: str) -> ObjectInfo: ...
    def list(self, prefix: str = "") -> list[ObjectInfo]: ...
    def read_bytes(self, key: str) -> bytes: ...
    def open_read(self, key: str) -> BinaryIO: ...
    def open_write(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]: ...
    def open_create(self, key: str) -> contextlib.AbstractContextManager[BinaryIO]: ...
    def list_uploads(self, prefix: str = "") -> list[UploadInfo]: ...
    def abort_upload(self, upload: UploadInfo) -> None: ...
    def put_if_absent(self, key: str, data: bytes) -> None: ...
    def read_tagged(self, key: str) -> tuple[bytes, str] | None: ...
    def put_if_match(self, key: str, data: bytes, tag: str | None) -> str: ...
    def delete(self, key: str) -> None: ...
    def clock(self) -> float: ...
    def storage_options(self) -> dict: ...
    def arrow_filesystem(self) -> tuple[Any, str]: ...


class UnsafePath(ValueError):
    """A path built from data (a manifest, a pointer, an index) would leave its root."""


def check_key(key: str) -> str:
    """`key` if it is a plain relative key that stays under the storage root, else ValueError."""
    if not isinstance(key, str):
        raise UnsafePath(f"invalid storage key {key!r}: not a string")
    parts = key.split("/")
    if not key or key.startswith("/") or "\0" in key or any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(
            f"invalid storage key {key!r}: use a relative path without '.', '..' or '//'"
        )
    return key


def path_under(root: str | Path, name: str, what: str) -> Path:
    """`root / name` for a `name` read from data, refused (UnsafePath) if it could leave `root`.

    The check is on the name itself: absolute, empty, '.' or '..' parts, or a
    NUL are refused, so no pointer, manifest entry or index can climb
    out of the directory it is joined to. Symlinks are not resolved: links the
    directory's owner made (the Hugging Face cache's snapshot links into its
    blobs) are theirs to make.
    """
    try:
        check_key(name)
    except UnsafePath:
        raise UnsafePath(
            f"{what}: {name!r} is not a plain relative path under {root} "
            "(absolute, '..', '.' or empty parts): refusing to follow it"
        ) from None
    return Path(root) / name


# --------------------------------------------------------------------------- retries


_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "ConditionalRequestConflict",  # S3: a concurrent conditional write is in flight; retry
}


def client_error(err: BaseException) -> dict | None:
    """The botocore error dict behind an s3fs-translated exception, if any."""
    for candidate in (err, err.__cause__, err.__context__):
        response = getattr(candidate, "response", None)
        if isinstance(response, dict) and "Error" in response:
            return response
    return None


def is_transient(err: BaseException) -> bool:
    """True for errors worth retrying: timeouts, connection resets, 5xx, throttling."""
    if isinstance(err, (AlreadyExists, PreconditionFailed, FileNotFoundError, PermissionError)):
        return False
    response = client_error(err)
    if response is not None:
        code = response["Error"].get("Code", "")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in _TRANSIENT_CODES or status >= 500
    if isinstance(err, (TimeoutError, ConnectionError)):
        return True
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError

        if isinstance(err, (BotoConnectionError, HTTPClientError)):
            return True
    except ImportError:  # pragma: no cover - botocore comes with s3fs
        pass
    return isinstance(err, OSError) and err.errno in (
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.EAGAIN,
    )


def is_unreachable(err: BaseException) -> bool:
    """True when no connection to the endpoint could be made at all (nothing was sent)."""
    if isinstance(err, ConnectionRefusedError):
        return True
    try:
        from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

        return isinstance(err, (ConnectTimeoutError, EndpointConnectionError))
    except ImportError:  # pragma: no cover - botocore comes with s3fs
        return False


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, for transient errors only.

    An endpoint that accepts no connection is retried only within
    `unreachable_budget_s` (a restarting server comes back in seconds; a wrong
    endpoint should fail quickly, in one line)."""

    num_attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0
    unreachable_budget_s: float = 6.0

    def __post_init__(self) -> None:
        if self.num_attempts < 1:
            raise ValueError(f"RetryPolicy.num_attempts must be >= 1, got {self.num_attempts}")

    def call(self, what: str, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        for attempt in range(1, self.num_attempts + 1):
            try:
                return fn()
            except Exception as err:
                over_budget = (
                    is_unreachable(err) and time.monotonic() - started >= self.unreachable_budget_s
                )
                if attempt == self.num_attempts or not is_transient(err) or over_budget:
                    # How many tries it took, for the one-line message the CLI prints.
                    err.storage_attempts = attempt  # type: ignore[attr-defined]
                    raise
                delay = random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**attempt))
                log.warning(
                    "transient storage error, retrying: op=%s attempt=%d error=%s delay_s=%.2f",
                    what,
                    attempt,
                    type(err).__name__,
                    delay,
                )
                time.sleep(delay)
        raise AssertionError("unreachable")
