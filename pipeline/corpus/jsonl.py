"""Reading JSONL (plain, .gz, .zst) and JSON-array files as bytes, one line at a time.

A line is never read past `max_row_bytes` (the rest of an oversized line is
skipped in bounded chunks); each line is decoded and parsed on its own, so an
undecodable line is one record, not the end of the file. A UTF-8 byte-order mark
(at the start of the file, or of a file concatenated onto another) and CRLF line
ends are accepted; a UTF-16 file is one `unsupported_encoding` record. A `.json`
file whose first byte is `[` is a JSON array document (Alpaca style), read whole;
a source with `format: json_object` is one JSON object whose values are the rows,
keyed by id (the Chit Chat Challenge layout), also read whole.
Exceptions raised while reading a file (truncated or corrupt compression) are
left to the caller, which turns them into one record per file (sources.py).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

from pipeline.corpus.records import RawRow, ReadProgress

JSON_ARRAY_SUFFIXES = (".json", ".json.gz", ".json.zst")  # a JSON array, or JSONL
JSONL_SUFFIXES = (".jsonl", ".jsonl.zst", ".jsonl.gz", *JSON_ARRAY_SUFFIXES)
_BOM = b"\xef\xbb\xbf"


class _ZstdReader(io.RawIOBase):
    """zstd frames one after another; input that ends inside a frame raises EOFError.

    zstandard's `stream_reader` returns what it has and stops silently when a file
    is cut short, so a truncated .zst would read as a shorter, valid corpus.
    """

    def __init__(self, raw) -> None:
        import zstandard

        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = self._dctx.decompressobj()
        self._in_frame = False
        self._out = bytearray()
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._out and not self._eof:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                self._eof = True
                if self._in_frame:
                    raise EOFError("zstd stream ended inside a frame (truncated file)")
                break
            while chunk:
                self._out += self._frame.decompress(chunk)
                self._in_frame = True
                if self._frame.eof:  # next frame, if the rest of the chunk holds one
                    chunk = self._frame.unused_data
                    self._frame = self._dctx.decompressobj()
                    self._in_frame = False
                else:
                    chunk = b""
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        del self._out[:n]
        return n


def _decompressed(raw, key: str):
    """A binary stream with `readline(limit)` over the file's (decompressed) bytes."""
    if key.endswith(".zst"):
        return io.BufferedReader(_ZstdReader(raw), buffer_size=1 << 20)
    if key.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw, 1 << 20)


def _parse_line(body: bytes, column0: int) -> tuple[dict | None, str | None, str | None]:
    """(row, reason, detail) of one line's bytes (no line end, no BOM)."""
    nul = body.find(b"\x00")
    if nul >= 0:
        return (
            None,
            "nul_byte",
            f"NUL byte at column {nul + column0} (a zero-filled or binary line)",
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        return (
            None,
            "invalid_utf8",
            (
                f"byte 0x{body[err.start]:02x} at column {err.start + column0} is not UTF-8 ({err.reason})"
            ),
        )
    try:
        row = json.loads(text)
    except RecursionError:
        return None, "too_deeply_nested", "JSON nested deeper than the parser allows"
    except ValueError as err:  # JSONDecodeError, or an integer literal too long to convert
        return None, "unparsable_row", f"invalid JSON: {err}"
    if not isinstance(row, dict):
        return None, "not_an_object", f"a JSON {type(row).__name__}, not an object"
    return row, None, None


def _json_document(where: str, data: bytes, what: str) -> tuple[object, RawRow | None]:
    """A whole-file JSON document, or the one record saying why it does not parse."""
    try:
        return json.loads(data.decode("utf-8")), None
    except UnicodeDecodeError as err:
        reason, detail, offset = "invalid_utf8", f"byte offset {err.start} is not UTF-8", err.start
    except RecursionError:
        reason, detail, offset = "too_deeply_nested", f"the JSON {what} is nested too deeply", 0
    except ValueError as err:
        reason, detail, offset = "unparsable_row", f"the JSON {what} does not parse: {err}", 0
    return None, RawRow(f"{where}:1", None, reason, detail, offset)


def _rows(where: str, items) -> Iterator[RawRow]:
    """(key, value) pairs of a document as rows located `path#key`; a non-object is a record."""
    for key, row in items:
        if isinstance(row, dict):
            yield RawRow(f"{where}#{key}", row)
        else:
            yield RawRow(
                f"{where}#{key}",
                None,
                "not_an_object",
                f"a JSON {type(row).__name__}, not an object",
            )


def _json_array(where: str, data: bytes) -> Iterator[RawRow]:
    """A whole-file JSON array (Alpaca style): one row per element, located `path#index`."""
    rows, failed = _json_document(where, data, "array")
    if failed is not None:
        yield failed
        return
    yield from _rows(where, enumerate(rows))


def read_json_object_file(storage, key: str, progress: ReadProgress) -> Iterator[RawRow]:
    """A whole-file JSON object of rows keyed by id: one row per value, located `path#key`."""
    where = storage.url(key)
    with storage.open_read(key) as raw:
        data = _decompressed(raw, key).read()
    progress.offset = len(data)
    document, failed = _json_document(where, data.removeprefix(_BOM), "object")
    if failed is not None:
        yield failed
        return
    if not isinstance(document, dict):
        yield RawRow(
            f"{where}:1", None, "not_an_object",
            f"format json_object needs one JSON object of rows keyed by id, not a {type(document).__name__}", 0,
        )  # fmt: skip
        return
    for row in _rows(where, document.items()):
        progress.rows += 1
        yield row


def read_jsonl_file(
    storage, key: str, max_row_bytes: int, progress: ReadProgress
) -> Iterator[RawRow]:
    where = storage.url(key)
    limit = max_row_bytes + 2  # room for the CRLF of a line that is exactly at the limit
    num_rows = 0
    with storage.open_read(key) as raw:
        stream = _decompressed(raw, key)
        while True:
            start = progress.offset
            line = stream.readline(limit)
            if not line:
                break
            progress.rows += 1
            progress.offset += len(line)
            location = f"{where}:{progress.rows}"
            complete = line.endswith(b"\n")
            if not complete and len(line) == limit:  # over the limit: skip to the line end
                while line and not line.endswith(b"\n"):
                    line = stream.readline(1 << 20)
                    progress.offset += len(line)
                size = progress.offset - start
                yield RawRow(
                    location, None, "row_too_large",
                    f"the line is {size} bytes, over max_row_bytes {max_row_bytes}", start, size,
                )  # fmt: skip
                num_rows += 1
                continue
            body = line[:-1] if complete else line
            if body.endswith(b"\r"):
                body = body[:-1]
            column0 = 0
            if body.startswith(_BOM):  # the file's start, or a file concatenated onto another
                body, column0 = body[3:], 3
            if (
                progress.rows == 1
                and body.startswith((b"\xff\xfe", b"\xfe\xff"))
                and b"\x00" in body
            ):
                yield RawRow(
                    f"{where}:1", None, "unsupported_encoding",
                    "the file is UTF-16 (byte-order mark 0xff 0xfe / 0xfe 0xff); convert it to UTF-8", 0,
                )  # fmt: skip
                return
            if not body.strip():
                continue
            if (
                num_rows == 0
                and key.endswith(JSON_ARRAY_SUFFIXES)
                and body.lstrip().startswith(b"[")
            ):
                yield from _json_array(where, body + b"\n" + stream.read())
                return
            num_rows += 1
            if len(body) > max_row_bytes:
                yield RawRow(
                    location, None, "row_too_large",
                    f"the line is {len(body)} bytes, over max_row_bytes {max_row_bytes}", start, len(body),
                )  # fmt: skip
                continue
            row, reason, detail = _parse_line(body, column0)
            if reason == "unparsable_row" and not complete:
                detail += " (the last line has no line end: is the file cut short?)"
            yield RawRow(location, row, reason, detail, start, len(body))
    if num_rows == 0:
        yield RawRow(f"{where}:1", None, "empty_file", "the file holds no rows", 0)
