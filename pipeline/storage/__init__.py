"""One filesystem layer for datasets on local disk or S3 (and S3-compatible stores).

Everything the shards layer stores goes through a `Storage`: keys are relative
to the dataset root (`shards/u-0001.parquet`, `manifests/v000001.json`). Two
kinds of writes exist and they have different guarantees:

* `open_create(key)`: streaming data files, create-only. The object appears
  under its final name only when the writer finishes (local: temp file + hard
  link; S3: one PUT or a multipart upload completed at close, both with
  `If-None-Match: *`), so a crash never leaves a partial file under a real
  name, and a name that exists is never written again: the late writer gets
  `AlreadyExists` and the first bytes stay. Unfinished S3 uploads are listed by
  `list_uploads` (gc aborts stale ones).
* `open_write(key)`: the same all-or-nothing streaming write, but it replaces
  an existing object: for side files that are meant to be rewritten (error
  records, the dataset card), never for data files.
* `put_if_absent` / `put_if_match`: small control objects (manifests, the
  `_latest` pointer). Create-only put (S3 `If-None-Match: *`; local: hard link,
  which fails if the name exists) and compare-and-swap (S3 `If-Match` on the
  ETag; local: content hash compared under an `flock`, then atomic rename).

Transient errors (timeouts, 5xx, throttling) are retried with exponential
backoff and jitter; everything else (412, 403, 404) surfaces at once.
Credentials come from the environment / AWS config as boto would find them;
they are never stored here, logged, or written into manifests. The endpoint is
`endpoint_url` or `AWS_ENDPOINT_URL`, for MinIO, Ceph or a loopback test server.
A URI or endpoint carrying a user and password is refused (the S3 client
cannot use them), with the password masked in the message.

`clock()` is the store's own time (S3: the `Date` of a response; local: this
host's), the clock that stamps `ObjectInfo.mtime`: ages of objects are judged
against it, never against a writer's clock.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.redact import strip_userinfo
from pipeline.storage.base import (
    AlreadyExists,
    ObjectInfo,
    PreconditionFailed,
    RetryPolicy,
    Storage,
    StorageError,
    UnsafePath,
    UploadInfo,
    check_key,
    is_transient,
    is_unreachable,
    path_under,
)
from pipeline.storage.local import LocalStorage, write_text_atomic

__all__ = [
    "AlreadyExists",
    "LocalStorage",
    "ObjectInfo",
    "PreconditionFailed",
    "RetryPolicy",
    "Storage",
    "StorageError",
    "UnsafePath",
    "UploadInfo",
    "check_key",
    "is_transient",
    "is_unreachable",
    "open_storage",
    "path_under",
    "write_text_atomic",
]

log = logging.getLogger(__name__)


def open_storage(uri: str | Path, *, endpoint_url: str | None = None) -> Storage:
    """The storage for a dataset root: `s3://bucket/prefix`, `file://...` or a local path."""
    text = str(uri)
    if text.startswith("s3://"):
        from pipeline.storage.s3 import S3Storage  # s3fs/botocore only when used

        return S3Storage(text, endpoint_url=endpoint_url)
    if "://" in text and not text.startswith("file://"):
        raise ValueError(
            f"unsupported storage URI {strip_userinfo(text)!r}: use a local path or "
            "s3://bucket/prefix"
        )
    if endpoint_url:
        log.warning("endpoint_url is ignored for local path %s", text)
    return LocalStorage(text.removeprefix("file://"))
