"""One filesystem layer for datasets on local disk or S3 (and S3-compatible stores).

Everything the shards layer stores goes through a `Storage`: keys are relative
to the dataset root (`shards/u-0001.parquet`, `manifests/v000001.json`). Two
kinds of writes exist and they have different guarantees:

* `open_write(key)`: streaming data files. The object appears under its final
  name only when the writer finishes (local: temp file + rename; S3: one PUT or
  a multipart upload completed at close), so a crash never leaves a partial
  file under a real name. A retried unit overwrites the same key (names derive
  from inputs, never from a random id).
* `put_if_absent` / `put_if_match`: small control objects (manifests, the
  `_latest` pointer). Create-only put (S3 `If-None-Match: *`; local: hard link,
  which fails if the name exists) and compare-and-swap (S3 `If-Match` on the
  ETag; local: content hash compared under an `flock`, then atomic rename).

Transient errors (timeouts, 5xx, throttling) are retried with exponential
backoff and jitter; everything else (412, 403, 404) surfaces at once.
Credentials come from the environment / AWS config as boto would find them;
they are never stored here, logged, or written into manifests. The endpoint is
`endpoint_url` or `AWS_ENDPOINT_URL`, for MinIO, Ceph or a loopback test server.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
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
    def put_if_absent(self, key: str, data: bytes) -> None: ...
    def read_tagged(self, key: str) -> tuple[bytes, str] | None: ...
    def put_if_match(self, key: str, data: bytes, tag: str | None) -> None: ...
    def delete(self, key: str) -> None: ...
    def storage_options(self) -> dict: ...
    def arrow_filesystem(self) -> tuple[Any, str]: ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"invalid storage key {key!r}: use a relative path without '.', '..' or '//'"
        )
    return key


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


def _client_error(err: BaseException) -> dict | None:
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
    response = _client_error(err)
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


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, for transient errors only."""

    num_attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0

    def __post_init__(self) -> None:
        if self.num_attempts < 1:
            raise ValueError(f"RetryPolicy.num_attempts must be >= 1, got {self.num_attempts}")

    def call(self, what: str, fn: Callable[[], T]) -> T:
        for attempt in range(1, self.num_attempts + 1):
            try:
                return fn()
            except Exception as err:
                if attempt == self.num_attempts or not is_transient(err):
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


# --------------------------------------------------------------------------- local


class LocalStorage:
    """A directory on a local or POSIX network filesystem."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = str(self.root)

    def __repr__(self) -> str:
        return f"LocalStorage({self.uri!r})"

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def url(self, key: str) -> str:
        return str(self._path(key))

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def info(self, key: str) -> ObjectInfo:
        st = self._path(key).stat()
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self.root / prefix if prefix else self.root
        if not base.is_dir():
            return []
        out = []
        for dirpath, _, filenames in os.walk(base):
            for name in filenames:
                path = Path(dirpath) / name
                st = path.stat()
                out.append(
                    ObjectInfo(path.relative_to(self.root).as_posix(), st.st_size, st.st_mtime)
                )
        return sorted(out, key=lambda o: o.key)

    def read_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def open_read(self, key: str) -> BinaryIO:
        return open(self._path(key), "rb")

    def _temp(self, path: Path) -> Path:
        # Hidden, per-process name beside the target: same filesystem, so rename is atomic.
        return path.with_name(f".{path.name}.tmp-{os.getpid()}-{time.monotonic_ns()}")

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._temp(path)
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        finally:
            tmp.unlink(missing_ok=True)

    def _write_temp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._temp(path)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def put_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)  # atomic, and fails if `path` exists: never overwrites
        except FileExistsError:
            raise AlreadyExists(f"{self.url(key)} already exists") from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(path.parent)

    def read_tagged(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def put_if_match(self, key: str, data: bytes, tag: str | None) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = path.with_name(f".{path.name}.lock")
        # flock is released by the kernel when the holder dies, so a SIGKILLed
        # committer never leaves the pointer locked.
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                current = self.read_tagged(key)
                current_tag = current[1] if current else None
                if current_tag != tag:
                    raise PreconditionFailed(
                        f"{self.url(key)} changed (expected tag {tag}, found {current_tag})"
                    )
                tmp = self._write_temp(path, data)
                os.replace(tmp, path)
                _fsync_dir(path.parent)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def storage_options(self) -> dict:
        return {}

    def arrow_filesystem(self) -> tuple[Any, str]:
        """(pyarrow filesystem, root path in it), for pyarrow readers of the shards."""
        from pyarrow import fs as pafs

        return pafs.LocalFileSystem(), str(self.root)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Replace a local file all at once: readers see the old text or the new, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- S3


class S3Storage:
    """A prefix in an S3 bucket, through s3fs (which brings botocore/aiobotocore)."""

    def __init__(
        self, uri: str, *, endpoint_url: str | None = None, retry: RetryPolicy = RetryPolicy()
    ) -> None:
        import s3fs

        if not uri.startswith("s3://"):
            raise ValueError(f"S3Storage needs an s3:// URI, got {uri!r}")
        bucket_prefix = uri[len("s3://") :].strip("/")
        if not bucket_prefix:
            raise ValueError(f"{uri!r} names no bucket; use s3://bucket/prefix")
        self.uri = f"s3://{bucket_prefix}"
        self.bucket, _, self.prefix = bucket_prefix.partition("/")
        self.endpoint_url = (
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        self.retry = retry
        # Only the endpoint is ours to pass; keys stay with boto's own lookup.
        self._options = {"endpoint_url": self.endpoint_url} if self.endpoint_url else {}
        self.fs = s3fs.S3FileSystem(**self._options, use_listings_cache=False)

    def __repr__(self) -> str:
        return f"S3Storage({self.uri!r}, endpoint_url={self.endpoint_url!r})"

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _path(self, key: str) -> str:
        return f"{self.bucket}/{self._key(key)}"

    def url(self, key: str) -> str:
        return f"s3://{self._path(key)}"

    def exists(self, key: str) -> bool:
        return self.retry.call("exists", lambda: self.fs.exists(self._path(key)))

    def info(self, key: str) -> ObjectInfo:
        raw = self.retry.call("info", lambda: self.fs.info(self._path(key), refresh=True))
        return ObjectInfo(key, int(raw["size"]), _mtime(raw))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        root = f"{self.bucket}/{self.prefix}".rstrip("/")
        base = f"{root}/{prefix}".rstrip("/") if prefix else root
        try:
            found = self.retry.call("list", lambda: self.fs.find(base, detail=True))
        except FileNotFoundError:
            return []
        out = []
        for path, raw in found.items():
            if raw.get("type") == "directory":
                continue
            out.append(ObjectInfo(path[len(root) + 1 :], int(raw["size"]), _mtime(raw)))
        return sorted(out, key=lambda o: o.key)

    def read_bytes(self, key: str) -> bytes:
        return self.retry.call("read", lambda: self.fs.cat_file(self._path(key)))

    def open_read(self, key: str) -> BinaryIO:
        return self.fs.open(self._path(key), "rb", cache_type="readahead", block_size=8 << 20)

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        # Small files go up in one PUT at close, large ones as a multipart upload
        # completed at close: either way nothing is visible before close.
        f = self.fs.open(self._path(key), "wb", block_size=16 << 20)
        try:
            yield f
        except BaseException:
            f.discard()  # aborts the multipart upload; nothing becomes visible
            f.closed = True
            raise
        try:
            f.close()  # completes the upload: the object appears now
        except BaseException:
            with contextlib.suppress(Exception):
                f.discard()  # do not leave a multipart upload behind
            raise

    def put_if_absent(self, key: str, data: bytes) -> None:
        def put() -> None:
            try:
                self.fs.call_s3(
                    "put_object", Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
                )
            except Exception as err:
                if _precondition(err):
                    raise AlreadyExists(f"{self.url(key)} already exists") from None
                raise

        try:
            self.retry.call("put_if_absent", put)
        except AlreadyExists:
            # A retried PUT whose first attempt landed reports 412; that is our object.
            if self.read_bytes(key) != data:
                raise

    def read_tagged(self, key: str) -> tuple[bytes, str] | None:
        # ETag first, then bytes: if the object changes in between, the CAS that
        # follows fails on the stale ETag, which is the safe direction.
        try:
            raw = self.retry.call("info", lambda: self.fs.info(self._path(key), refresh=True))
            data = self.read_bytes(key)
        except FileNotFoundError:
            return None
        return data, raw["ETag"]

    def put_if_match(self, key: str, data: bytes, tag: str | None) -> None:
        cond = {"IfMatch": tag} if tag is not None else {"IfNoneMatch": "*"}

        def put() -> None:
            try:
                self.fs.call_s3(
                    "put_object", Bucket=self.bucket, Key=self._key(key), Body=data, **cond
                )
            except Exception as err:
                if _precondition(err):
                    raise PreconditionFailed(
                        f"{self.url(key)} changed (expected ETag {tag})"
                    ) from None
                raise

        try:
            self.retry.call("put_if_match", put)
        except PreconditionFailed:
            current = self.read_tagged(key)
            if current is None or current[0] != data:
                raise

    def delete(self, key: str) -> None:
        self.retry.call("delete", lambda: self.fs.rm_file(self._path(key)))

    def storage_options(self) -> dict:
        """fsspec options for other readers (datasets, pandas): the endpoint only."""
        return {"client_kwargs": {"endpoint_url": self.endpoint_url}} if self.endpoint_url else {}

    def arrow_filesystem(self) -> tuple[Any, str]:
        """(pyarrow S3FileSystem with this endpoint, "bucket/prefix"); keys from the environment."""
        from urllib.parse import urlparse

        from pyarrow import fs as pafs

        kwargs: dict[str, Any] = {}
        if self.endpoint_url:
            url = urlparse(self.endpoint_url)
            kwargs = {"endpoint_override": url.netloc, "scheme": url.scheme or "https"}
        return pafs.S3FileSystem(**kwargs), f"{self.bucket}/{self.prefix}".rstrip("/")


def _precondition(err: BaseException) -> bool:
    if isinstance(err, FileExistsError):  # s3fs translates If-None-Match 412 this way
        return True
    response = _client_error(err)
    if response is None:
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return response["Error"].get("Code") == "PreconditionFailed" or status == 412


def _mtime(raw: dict) -> float:
    modified = raw.get("LastModified")
    return modified.timestamp() if modified is not None else 0.0


def open_storage(uri: str | Path, *, endpoint_url: str | None = None) -> Storage:
    """The storage for a dataset root: `s3://bucket/prefix`, `file://...` or a local path."""
    text = str(uri)
    if text.startswith("s3://"):
        return S3Storage(text, endpoint_url=endpoint_url)
    if "://" in text and not text.startswith("file://"):
        raise ValueError(
            f"unsupported storage URI {text!r}: use a local path or s3://bucket/prefix"
        )
    if endpoint_url:
        log.warning("endpoint_url is ignored for local path %s", text)
    return LocalStorage(text.removeprefix("file://"))
