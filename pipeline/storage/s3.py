"""A dataset root under an S3 prefix (s3fs): one PUT or a multipart upload, conditional puts.

Data files go up create-only (`open_create`): a file smaller than one part is
one `PutObject` with `If-None-Match: *`; a larger one is a multipart upload
whose `CompleteMultipartUpload` carries `If-None-Match: *`, so whichever
writer completes first owns the name and a late one gets `AlreadyExists`
(its upload is aborted). AWS S3 has honoured both since 2024; MinIO does too.

Credentials and endpoints: see the package docstring (`pipeline/storage/__init__.py`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from pipeline.storage.base import (
    AlreadyExists,
    ObjectInfo,
    PreconditionFailed,
    RetryPolicy,
    UploadInfo,
    check_key,
    client_error,
)

PART_BYTES = 16 << 20  # multipart part size (S3's minimum is 5 MiB except the last)


class S3Storage:
    """A prefix in an S3 bucket, through s3fs (which brings botocore/aiobotocore)."""

    def __init__(
        self, uri: str, *, endpoint_url: str | None = None, retry: RetryPolicy | None = None
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
        self.retry = retry or RetryPolicy()
        # Only the endpoint is ours to pass; keys stay with boto's own lookup.
        self._options = {"endpoint_url": self.endpoint_url} if self.endpoint_url else {}
        self.fs = s3fs.S3FileSystem(**self._options, use_listings_cache=False)

    def __repr__(self) -> str:
        return f"S3Storage({self.uri!r}, endpoint_url={self.endpoint_url!r})"

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

    @contextlib.contextmanager
    def open_create(self, key: str) -> Iterator[BinaryIO]:
        upload = _CreateOnlyUpload(self, key)
        try:
            yield upload
        except BaseException:
            upload.abort()
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
        self.retry.call(
            "abort_upload",
            lambda: self.fs.call_s3(
                "abort_multipart_upload",
                Bucket=self.bucket,
                Key=self._key(upload.key),
                UploadId=upload.upload_id,
            ),
        )

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


class _CreateOnlyUpload:
    """A write-only file object: buffered parts, published create-only at `finish`."""

    def __init__(self, storage: S3Storage, key: str) -> None:
        self._s3 = storage
        self._key = storage._key(key)
        self._url = storage.url(key)
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self.closed = False

    def _call(self, op: str, **kwargs: Any) -> Any:
        s3 = self._s3
        return s3.retry.call(
            op, lambda: s3.fs.call_s3(op, Bucket=s3.bucket, Key=self._key, **kwargs)
        )

    def write(self, data: bytes | memoryview) -> int:
        self._buffer += data
        while len(self._buffer) >= PART_BYTES:
            self._upload_part(bytes(self._buffer[:PART_BYTES]))
            del self._buffer[:PART_BYTES]
        return len(data)

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def _upload_part(self, body: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = self._call("create_multipart_upload")["UploadId"]
        number = len(self._parts) + 1
        etag = self._call("upload_part", UploadId=self._upload_id, PartNumber=number, Body=body)[
            "ETag"
        ]
        self._parts.append({"PartNumber": number, "ETag": etag})

    def finish(self) -> None:
        self.closed = True
        try:
            if self._upload_id is None:
                body = bytes(self._buffer)
                try:
                    self._call("put_object", Body=body, IfNoneMatch="*")
                except Exception as err:
                    # A retried PUT whose first attempt landed reports 412: that is ours.
                    if not (_precondition(err) and self._s3.read_bytes_raw(self._key) == body):
                        raise
                return
            if self._buffer:
                self._upload_part(bytes(self._buffer))
            self._call(
                "complete_multipart_upload",
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
                IfNoneMatch="*",
            )
            self._upload_id = None
        except Exception as err:
            self.abort()
            if _precondition(err):
                raise AlreadyExists(
                    f"{self._url} already exists; a data file is never written twice"
                ) from None
            raise

    def abort(self) -> None:
        self.closed = True
        if self._upload_id is not None:
            with contextlib.suppress(Exception):  # gc aborts what is left behind
                self._call("abort_multipart_upload", UploadId=self._upload_id)
            self._upload_id = None


def _precondition(err: BaseException) -> bool:
    if isinstance(err, FileExistsError):  # s3fs translates If-None-Match 412 this way
        return True
    response = client_error(err)
    if response is None:
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return response["Error"].get("Code") == "PreconditionFailed" or status == 412


def _mtime(raw: dict) -> float:
    modified = raw.get("LastModified")
    return modified.timestamp() if modified is not None else 0.0
