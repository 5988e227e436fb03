"""The two streams of an S3 root: a create-only (or plain) upload and a resuming read.

`Upload` buffers `PART_BYTES` parts: a file smaller than one part goes up as one
`PutObject`, a larger one as a multipart upload, both published only at `finish`
(with `If-None-Match: *` when create-only, so a late writer gets `AlreadyExists`).
Each request retries on its own (`RetryPolicy`, transient errors only), so a reset
in part 7 re-sends part 7, not the file; a retried final request whose first try
landed is recognised as ours (a `PutObject` answered 412 whose object holds our
bytes, a `CompleteMultipartUpload` answered 412 or `NoSuchUpload` whose object
carries the multipart ETag of our parts).

`ResumableRead` reopens the object after a transient error at the offset the caller
reached, so no byte is skipped or read twice; if the object's ETag changed
meanwhile it stops with `StorageError` (data files never change: that is damage).
Both reach S3 through the `S3Storage` that opens them (pipeline/storage/s3.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from typing import Any

from pipeline.storage.base import AlreadyExists, StorageError, client_error

PART_BYTES = 16 << 20  # multipart part size (S3's minimum is 5 MiB except the last)

# The `S3Storage` a stream belongs to (pipeline/storage/s3.py), not imported: that
# module imports this one. A stream uses its `fs`, `bucket`, `retry`, `_key`, `_path`,
# `url` and `read_bytes_raw`.
S3Root = Any


class Upload:
    """A write-only file object: buffered parts, published at `finish` (create-only or not)."""

    def __init__(self, storage: S3Root, key: str, *, create_only: bool) -> None:
        self._s3 = storage
        self._key = storage._key(key)
        self._url = storage.url(key)
        self._cond = {"IfNoneMatch": "*"} if create_only else {}
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self.closed = False

    def _call(self, op: str, **kwargs: Any) -> Any:
        s3 = self._s3
        return s3.retry.call(
            f"{op} {self._url}",
            lambda: s3.fs.call_s3(op, Bucket=s3.bucket, Key=self._key, **kwargs),
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
        # Re-sending a part number replaces that part: a retried part is idempotent.
        etag = self._call("upload_part", UploadId=self._upload_id, PartNumber=number, Body=body)[
            "ETag"
        ]
        self._parts.append({"PartNumber": number, "ETag": etag})

    def _multipart_etag(self) -> str:
        """The ETag S3 gives the completed object: md5 of the parts' md5s, then -<parts>."""
        digests = b"".join(bytes.fromhex(p["ETag"].strip('"')) for p in self._parts)
        return f'"{hashlib.md5(digests).hexdigest()}-{len(self._parts)}"'

    def _landed(self, err: BaseException, body: bytes | None) -> bool:
        """Whether a failed final request's object is ours (an earlier try of it landed)."""
        code = (client_error(err) or {}).get("Error", {}).get("Code")
        if not (is_precondition_failure(err) or code == "NoSuchUpload"):
            return False
        try:
            if body is not None:  # a single PUT: compare the bytes
                return self._s3.read_bytes_raw(self._key) == body
            head = self._s3.retry.call(
                f"head_object {self._url}",
                lambda: self._s3.fs.call_s3("head_object", Bucket=self._s3.bucket, Key=self._key),
            )
        except FileNotFoundError:
            return False
        return head.get("ETag") == self._multipart_etag()

    def finish(self) -> None:
        self.closed = True
        try:
            if self._upload_id is None:
                body = bytes(self._buffer)
                try:
                    self._call("put_object", Body=body, **self._cond)
                except Exception as err:
                    if not self._landed(err, body):
                        raise
                return
            if self._buffer:
                self._upload_part(bytes(self._buffer))
            try:
                self._call(
                    "complete_multipart_upload",
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                    **self._cond,
                )
            except Exception as err:
                if not self._landed(err, None):
                    raise
            self._upload_id = None
        except Exception as err:
            self.abort()
            if is_precondition_failure(err):
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


class ResumableRead(io.RawIOBase):
    """A read stream over one object that reopens at its own offset after a transient error.

    The offset is this object's, not s3fs's: a read that fails half-way is
    redone from where the caller stood, so a partial read inside s3fs can
    neither skip nor repeat bytes. The first open happens here, so a missing
    object raises FileNotFoundError at `open_read`, as on local disk.
    """

    _BLOCK = 8 << 20

    def __init__(self, storage: S3Root, key: str) -> None:
        super().__init__()
        self._s3 = storage
        self._path = storage._path(key)
        self._url = storage.url(key)
        self._pos = 0
        self._file: Any = None
        self._etag: str | None = None
        self._size = 0
        self._s3.retry.call(f"open {self._url}", self._open)

    def _open(self) -> Any:
        if self._file is None:
            f = self._s3.fs.open(self._path, "rb", cache_type="readahead", block_size=self._BLOCK)
            etag = (getattr(f, "details", None) or {}).get("ETag")
            if self._etag is not None and etag is not None and etag != self._etag:
                f.close()
                raise StorageError(
                    f"{self._url} changed while it was read (ETag {self._etag} -> {etag})"
                )
            self._etag, self._size, self._file = etag, int(f.size), f
        self._file.seek(self._pos)
        return self._file

    def _drop(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            with contextlib.suppress(Exception):
                f.close()

    def _attempt(self, what: str, fn: Any) -> Any:
        def once() -> Any:
            try:
                return fn(self._open())
            except Exception:
                self._drop()  # the next try reopens at self._pos
                raise

        return self._s3.retry.call(f"{what} {self._url}", once)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if self.closed:
            raise ValueError(f"read of closed stream {self._url}")
        want = -1 if size is None or size < 0 else size
        data = self._attempt("read", lambda f: f.read(want))
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos} in {self._url}")
        self._pos = pos
        return pos

    def tell(self) -> int:
        return self._pos

    @property
    def size(self) -> int:
        return self._size

    def close(self) -> None:
        self._drop()
        super().close()


def is_precondition_failure(err: BaseException) -> bool:
    if isinstance(err, FileExistsError):  # s3fs translates If-None-Match 412 this way
        return True
    response = client_error(err)
    if response is None:
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return response["Error"].get("Code") == "PreconditionFailed" or status == 412
