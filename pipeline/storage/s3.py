"""A dataset root under an S3 prefix (s3fs): one PUT or a multipart upload, conditional puts.

Data files go up create-only (`open_create`): a file smaller than one part is
one `PutObject` with `If-None-Match: *`; a larger one is a multipart upload
whose `CompleteMultipartUpload` carries `If-None-Match: *`, so whichever
writer completes first owns the name and a late one gets `AlreadyExists`
(its upload is aborted). AWS S3 has honoured both since 2024; MinIO does too.
`open_write` is the same upload without the condition.

Streams retry like every other call (`RetryPolicy`, transient errors only):

* an upload retries each request on its own (`CreateMultipartUpload`, every
  `UploadPart` with the part's bytes, `CompleteMultipartUpload`, the single
  `PutObject`), so a reset in part 7 re-sends part 7, not the file. A retried
  request whose first try landed is recognised: a `PutObject` answered 412
  whose object holds our bytes, a `CompleteMultipartUpload` answered 412 or
  `NoSuchUpload` whose object carries the multipart ETag of our parts (S3's
  md5 of the parts' md5s), is ours, not another writer's;
* a read (`open_read`) that fails mid-stream reopens the object and resumes
  at the offset the caller reached, so no byte is skipped or read twice; if
  the object's ETag changed meanwhile the read stops with `StorageError`
  (data files never change, so that is damage, not a retry).

Credentials and endpoints: see the package docstring (`pipeline/storage/__init__.py`).
The upload and the resuming read are pipeline/storage/s3_streams.py.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from pipeline.redact import strip_userinfo
from pipeline.storage.base import (
    AlreadyExists,
    ObjectInfo,
    PreconditionFailed,
    RetryPolicy,
    UploadInfo,
    check_key,
)
from pipeline.storage.s3_streams import (
    PART_BYTES,
    ResumableRead,
    Upload,
    is_precondition_failure,
)

__all__ = ["PART_BYTES", "S3Storage"]

# A connection to an S3 endpoint opens in milliseconds; past this, the try fails
# and `RetryPolicy` tries again.
CONNECT_TIMEOUT_S = 3.0


class S3Storage:
    """A prefix in an S3 bucket, through s3fs (which brings botocore/aiobotocore)."""

    def __init__(
        self, uri: str, *, endpoint_url: str | None = None, retry: RetryPolicy | None = None
    ) -> None:
        import s3fs

        if not uri.startswith("s3://"):
            raise ValueError(f"S3Storage needs an s3:// URI, got {strip_userinfo(uri)!r}")
        bucket_prefix = uri[len("s3://") :].strip("/")
        if not bucket_prefix:
            raise ValueError(f"{uri!r} names no bucket; use s3://bucket/prefix")
        if "@" in bucket_prefix.partition("/")[0]:
            raise ValueError(
                f"{strip_userinfo(uri)}: a dataset URI cannot carry credentials (the S3 client "
                "does not use them); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                "AWS_PROFILE) and drop the user:password@ part"
            )
        self.uri = f"s3://{bucket_prefix}"
        self.bucket, _, self.prefix = bucket_prefix.partition("/")
        self.endpoint_url = (
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        if self.endpoint_url and strip_userinfo(self.endpoint_url) != self.endpoint_url:
            raise ValueError(
                f"endpoint URL {strip_userinfo(self.endpoint_url)} carries a user and password, "
                "which the S3 client refuses; give the endpoint without them and the keys as "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        self.retry = retry or RetryPolicy()
        # Only the endpoint is ours to pass; keys stay with boto's own lookup.
        self._options = {"endpoint_url": self.endpoint_url} if self.endpoint_url else {}
        # `self.retry` is the one retry loop: botocore tries each request once, and an
        # endpoint that accepts no connection fails in seconds, not minutes.
        self.fs = s3fs.S3FileSystem(
            **self._options,
            use_listings_cache=False,
            config_kwargs={
                "connect_timeout": CONNECT_TIMEOUT_S,
                "retries": {"max_attempts": 1, "mode": "standard"},
            },
        )
        self.fs.retries = 1  # s3fs's own loop (5 tries) would nest inside `self.retry`

    def __repr__(self) -> str:
        endpoint = strip_userinfo(self.endpoint_url) if self.endpoint_url else None
        return f"S3Storage({self.uri!r}, endpoint_url={endpoint!r})"

    def _key(self, key: str) -> str:
        check_key(key)
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

    def read_bytes_raw(self, bucket_key: str) -> bytes:
        """Bytes of a bucket key (prefix included)."""
        return self.retry.call("read", lambda: self.fs.cat_file(f"{self.bucket}/{bucket_key}"))

    def open_read(self, key: str) -> BinaryIO:
        """A seekable read stream that resumes at its offset after a transient error."""
        return ResumableRead(self, key)  # type: ignore[return-value]

    @contextlib.contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        """All or nothing, replacing an existing object (side files, never data files)."""
        with self._upload(Upload(self, key, create_only=False)) as f:
            yield f

    @contextlib.contextmanager
    def open_create(self, key: str) -> Iterator[BinaryIO]:
        """All or nothing, create-only: `AlreadyExists` if the name was taken first."""
        with self._upload(Upload(self, key, create_only=True)) as f:
            yield f

    @contextlib.contextmanager
    def _upload(self, upload: Upload) -> Iterator[BinaryIO]:
        # Small files go up in one PUT at close, large ones as a multipart upload
        # completed at close: either way nothing is visible before close.
        try:
            yield upload  # type: ignore[misc]
        except BaseException:
            upload.abort()  # nothing becomes visible; no multipart upload stays behind
            raise
        upload.finish()

    def list_uploads(self, prefix: str = "") -> list[UploadInfo]:
        """Multipart uploads started under this root (and `prefix`) and not completed."""
        base = f"{self.prefix}/" if self.prefix else ""
        root = base + prefix
        out: list[UploadInfo] = []
        markers: dict[str, str] = {}
        while True:
            page = self.retry.call(
                "list_uploads",
                lambda m=markers: self.fs.call_s3(
                    "list_multipart_uploads", Bucket=self.bucket, Prefix=root, **m
                ),
            )
            for up in page.get("Uploads", []):
                key = up["Key"][len(self.prefix) + 1 :] if self.prefix else up["Key"]
                out.append(UploadInfo(key, up["UploadId"], up["Initiated"].timestamp()))
            if not page.get("IsTruncated"):
                return out
            markers = {
                "KeyMarker": page["NextKeyMarker"],
                "UploadIdMarker": page["NextUploadIdMarker"],
            }

    def abort_upload(self, upload: UploadInfo) -> None:
        """Abort an unfinished upload; one already gone (a retried abort) is not an error."""
        try:
            self.retry.call(
                "abort_upload",
                lambda: self.fs.call_s3(
                    "abort_multipart_upload",
                    Bucket=self.bucket,
                    Key=self._key(upload.key),
                    UploadId=upload.upload_id,
                ),
            )
        except FileNotFoundError:  # NoSuchUpload
            pass

    def put_if_absent(self, key: str, data: bytes) -> None:
        attempts = 0

        def put() -> None:
            nonlocal attempts
            attempts += 1
            try:
                self.fs.call_s3(
                    "put_object", Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
                )
            except Exception as err:
                if is_precondition_failure(err):
                    raise AlreadyExists(f"{self.url(key)} already exists") from None
                raise

        try:
            self.retry.call("put_if_absent", put)
        except AlreadyExists:
            # A retried PUT whose first attempt landed reports 412; that is our object.
            # A 412 on the first attempt is an object that was there before.
            if attempts == 1 or self.read_bytes(key) != data:
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

    def put_if_match(self, key: str, data: bytes, tag: str | None) -> str:
        """Replace `key` if its ETag is still `tag` (None: if absent); the new ETag."""
        cond = {"IfMatch": tag} if tag is not None else {"IfNoneMatch": "*"}

        def put() -> dict:
            try:
                return self.fs.call_s3(
                    "put_object", Bucket=self.bucket, Key=self._key(key), Body=data, **cond
                )
            except Exception as err:
                if is_precondition_failure(err):
                    raise PreconditionFailed(
                        f"{self.url(key)} changed (expected ETag {tag})"
                    ) from None
                raise

        try:
            return self.retry.call("put_if_match", put)["ETag"]
        except PreconditionFailed:
            current = self.read_tagged(key)
            if current is None or current[0] != data:
                raise
            return current[1]  # a retried PUT whose first attempt landed: our object

    def delete(self, key: str) -> None:
        self.retry.call("delete", lambda: self.fs.rm_file(self._path(key)))

    def clock(self) -> float:
        """The store's time: the `Date` of a one-key listing (the clock of `LastModified`)."""
        from email.utils import parsedate_to_datetime

        reply = self.retry.call(
            "clock",
            lambda: self.fs.call_s3(
                "list_objects_v2", Bucket=self.bucket, Prefix=self._key("_clock"), MaxKeys=1
            ),
        )
        return parsedate_to_datetime(reply["ResponseMetadata"]["HTTPHeaders"]["date"]).timestamp()

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


def _mtime(raw: dict) -> float:
    modified = raw.get("LastModified")
    return modified.timestamp() if modified is not None else 0.0
