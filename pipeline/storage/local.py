"""A dataset root on a local or POSIX network filesystem: temp + rename, hard links, flock."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from pipeline.storage.base import (
    AlreadyExists,
    ObjectInfo,
    PreconditionFailed,
    UploadInfo,
    check_key,
)


class LocalStorage:
    """A directory on a local or POSIX network filesystem."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = str(self.root)

    def __repr__(self) -> str:
        return f"LocalStorage({self.uri!r})"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

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
                try:
                    st = path.stat()
                except FileNotFoundError:  # renamed or removed since the walk saw it
                    continue
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
            fsync_dir(path.parent)
        finally:
            tmp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def open_create(self, key: str) -> Iterator[BinaryIO]:
        """Like `open_write`, but the final hard link fails if the name exists (AlreadyExists)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._temp(path)
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # atomic, never replaces: the first complete file stays
            except FileExistsError:
                raise AlreadyExists(
                    f"{self.url(key)} already exists; a data file is never written twice"
                ) from None
            fsync_dir(path.parent)
        finally:
            tmp.unlink(missing_ok=True)

    def list_uploads(self, prefix: str = "") -> list[UploadInfo]:
        # Unfinished local writes are hidden temp files, which `list` already shows.
        return []

    def abort_upload(self, upload: UploadInfo) -> None:
        self._path(upload.key).with_name(upload.upload_id).unlink(missing_ok=True)

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
        fsync_dir(path.parent)

    def read_tagged(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def put_if_match(self, key: str, data: bytes, tag: str | None) -> str:
        """Replace `key` if its tag is still `tag` (None: if absent); the new tag."""
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
                fsync_dir(path.parent)
                return hashlib.sha256(data).hexdigest()
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def clock(self) -> float:
        """The store's time: this host's, which stamps the files' mtimes."""
        return time.time()

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
    fsync_dir(path.parent)  # the rename itself survives a power loss
    return path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
