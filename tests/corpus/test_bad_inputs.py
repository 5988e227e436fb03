"""The bad-input suite: damaged files and malformed rows become named error records.

One corpus holds every kind of damage we know of next to good rows, in real
files on disk (JSONL with a byte-order mark and CRLF line ends, gzip and zstd,
Parquet, a JSON array). `load_corpus` must finish, keep every good row, and
give every bad row or file its own record: the file, the line (or row), the
reason code, and the byte offset where one applies.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from reliability import record

from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.ingest import load_corpus

MAX_ROW_BYTES = 1 << 20  # the configured limit; one row below is 50 MB


def _pair(i: int | str) -> dict:
    return {"prompt": f"good question {i}", "response": f"good answer {i}"}


def _line(row) -> bytes:
    return json.dumps(row).encode() + b"\r\n"


GOOD_SHAPES = [
    {
        "messages": [
            {"role": "user", "content": "plain openai"},
            {"role": "assistant", "content": "ok"},
        ]
    },
    {
        "messages": [
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": [{"type": "text", "text": "content parts"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18}'},
            {"role": "assistant", "content": "18 degrees."},
        ]
    },
    {"conversations": [{"from": "human", "value": "sharegpt"}, {"from": "gpt", "value": "ok"}]},
    {"conversations": [{"role": "user", "content": "sharegpt with roles"}]},
    {"instruction": "alpaca", "input": "", "output": "ok"},
    {"question": "pair", "answer": "ok", "domain": "qa"},
    {"messages": [{"role": "user", "content": "surrogate pair \ud83d\ude00 is fine"}]},
]


def _bad_jsonl_lines() -> list[tuple[bytes, str]]:
    """(raw line, expected reason) for every malformed line kind."""
    deep = b"[" * 10_000 + b"]" * 10_000
    return [
        (b'\xff\xfe{"prompt": "latin-1 junk \xe9"}\r\n', "invalid_utf8"),
        (b'{"prompt": "nul\x00byte", "response": "x"}\r\n', "nul_byte"),
        (b'{"prompt": "unterminated\r\n', "unparsable_row"),
        (b'{"nested": ' + deep + b"}\r\n", "too_deeply_nested"),
        (b'{"prompt": "lone \\ud800 surrogate", "response": "x"}\r\n', "lone_surrogate"),
        (b"[1, 2]\r\n", "not_an_object"),
        (b'"just a string"\r\n', "not_an_object"),
        (b"null\r\n", "not_an_object"),
        (_line({"foo": 1}), "unknown_format"),
        (_line({"messages": {"role": "user"}}), "not_a_list"),
        (_line({"messages": ["hi"]}), "bad_turn"),
        (_line({"messages": [{"role": 7, "content": "x"}]}), "unknown_role"),
        (_line({"messages": [{"role": "user", "content": 3}]}), "content_not_text"),
        (_line({"messages": [{"role": "user", "content": "   "}]}), "empty_content"),
        (_line({"messages": []}), "empty_conversation"),
        (_line({"messages": [{"role": "system", "content": "only"}]}), "no_user_turn"),
        (
            _line(
                {
                    "messages": [
                        {"role": "assistant", "content": "x"},
                        {"role": "user", "content": "y"},
                    ]
                }
            ),
            "roles_do_not_alternate",
        ),
        (
            _line(
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "image_url", "image_url": {"url": "x"}}],
                        }
                    ]
                }
            ),
            "non_text_part",
        ),
        (
            _line(
                {
                    "messages": [
                        {"role": "user", "content": "q"},
                        {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]},
                    ]
                }
            ),
            "bad_tool_call",
        ),
        (
            _line(
                {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]}
            ),
            "tool_result_without_call",
        ),
        (
            _line(
                {
                    "messages": [
                        {"role": "user", "content": "q"},
                        {
                            "role": "assistant",
                            "content": "",
                            "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
                        },
                    ]
                }
            ),
            "tool_call_without_result",
        ),
        (_line({"text": "<|im_start|>user\nhi<|im_end|>"}), "pre_rendered_text"),
        (b'{"prompt": "' + b"x" * (50 << 20) + b'", "response": "y"}\r\n', "row_too_large"),
    ]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def damaged_corpus(tmp_path_factory):
    """Sources holding every kind of damage; returns (config, expected errors, good prompts)."""
    root = tmp_path_factory.mktemp("damaged")
    jsonl_dir, parquet_dir = root / "jsonl", root / "parquet"
    jsonl_dir.mkdir()
    parquet_dir.mkdir()
    expected: set[tuple[str, int | str, str]] = set()  # (file, line or "#row", reason)
    good: list[str] = []  # the first prompt of every good row

    # A: BOM + CRLF, good rows of every shape interleaved with every bad line kind.
    body = b"\xef\xbb\xbf"
    number = 0
    bad = _bad_jsonl_lines()
    for i, shape in enumerate(GOOD_SHAPES):
        body += _line(shape)
        number += 1
        if i < len(bad):
            body += bad[i][0]
            number += 1
            expected.add(("a.jsonl", number, bad[i][1]))
        body += b"\r\n"  # blank lines are skipped, not errors
        number += 1
    for raw, reason in bad[len(GOOD_SHAPES) :]:
        body += raw
        number += 1
        expected.add(("a.jsonl", number, reason))
    body += _line(_pair(0))
    _write(jsonl_dir / "a.jsonl", body)
    good += [
        "plain openai",
        "content parts",
        "Weather in Paris?",
        "sharegpt",
        "sharegpt with roles",
        "alpaca",
        "pair",
        "surrogate pair \U0001f600 is fine",
        "good question 0",
    ]

    # B: gzip cut in half: the rows before the cut survive, then one truncated_file.
    rows_b = [_pair(f"b{i}") for i in range(2000)]
    gz = gzip.compress(b"".join(_line(r) for r in rows_b))
    _write(jsonl_dir / "b.jsonl.gz", gz[: len(gz) // 2])
    expected.add(("b.jsonl.gz", "*", "truncated_file"))

    # C: zstd with a flipped byte (the frame checksum catches it): corrupt_file.
    zst = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(_line(_pair(9))))
    zst[len(zst) // 2] ^= 0xFF
    _write(jsonl_dir / "c.jsonl.zst", bytes(zst))
    expected.add(("c.jsonl.zst", "*", "corrupt_file"))

    # D: zstd cut short: rows before survive, then truncated_file.
    rows_d = [_pair(f"d{i}") for i in range(20_000)]  # several 128 KB zstd blocks
    zst_d = zstandard.ZstdCompressor(write_checksum=True).compress(
        b"".join(_line(r) for r in rows_d)
    )
    _write(jsonl_dir / "d.jsonl.zst", zst_d[: len(zst_d) // 2])
    expected.add(("d.jsonl.zst", "*", "truncated_file"))

    # E: an empty file; F: a UTF-16 export; G: a file that is not gzip at all.
    _write(jsonl_dir / "e.jsonl", b"")
    expected.add(("e.jsonl", "*", "empty_file"))
    _write(jsonl_dir / "f.jsonl", json.dumps(_pair(7)).encode("utf-16"))
    expected.add(("f.jsonl", "*", "unsupported_encoding"))
    _write(jsonl_dir / "g.jsonl.gz", b"this is not gzip\n")
    expected.add(("g.jsonl.gz", "*", "corrupt_file"))

    # H: a JSON array document (Alpaca style), one element not an object.
    _write(jsonl_dir / "h.json", json.dumps([_pair("h0"), 5, _pair("h1")]).encode())
    expected.add(("h.json", "#1", "not_an_object"))
    good += ["good question h0", "good question h1"]

    # Parquet: a good file with one oversized row, a corrupt file, a truncated one.
    rows_p = [_pair(f"p{i}") for i in range(5)] + [
        {"prompt": "y" * (2 * MAX_ROW_BYTES), "response": "z"}
    ]
    pq.write_table(pa.Table.from_pylist(rows_p), parquet_dir / "p0.parquet")
    expected.add(("p0.parquet", "#5", "row_too_large"))
    good += [f"good question p{i}" for i in range(5)]
    whole = (parquet_dir / "p0.parquet").read_bytes()
    _write(parquet_dir / "p1.parquet", whole[: len(whole) // 2])
    expected.add(("p1.parquet", "*", "corrupt_file"))
    _write(parquet_dir / "p2.parquet", b"PAR1" + b"\x00garbage" * 100 + b"PAR1")
    expected.add(("p2.parquet", "*", "corrupt_file"))

    config = CorpusConfig.model_validate(
        {
            "sources": [
                {"path": str(jsonl_dir), "name": "jsonl", "domain": "mixed"},
                {"path": str(parquet_dir), "name": "parquet"},
            ],
            "max_row_bytes": MAX_ROW_BYTES,
        }
    )
    return config, expected, good, rows_b, rows_d


def _where(location: str) -> tuple[str, str]:
    """("a.jsonl", "17") for ".../a.jsonl:17", ("p0.parquet", "#5") for ".../p0.parquet#5"."""
    name = location.rsplit("/", 1)[-1]
    if "#" in name:
        file, row = name.split("#", 1)
        return file, f"#{row}"
    file, _, line = name.rpartition(":")
    return file, line


def test_every_bad_input_is_its_own_named_record_and_the_run_completes(damaged_corpus):
    config, expected, good, rows_b, rows_d = damaged_corpus
    corpus = load_corpus(config)

    # Every good row survives (gzip/zstd rows before the cut included).
    firsts = [
        c.messages[0]["content"] if c.messages[0]["role"] != "system" else c.messages[1]["content"]
        for c in corpus.conversations
    ]
    for prompt in good:
        assert prompt in firsts, prompt
    kept_b = sum(f.startswith("good question b") for f in firsts)
    kept_d = sum(f.startswith("good question d") for f in firsts)
    assert 0 < kept_b < len(rows_b) and 0 < kept_d < len(rows_d)

    # Every bad row or file is exactly one record, with its reason.
    got = set()
    for err in corpus.errors:
        file, line = _where(err.location)
        assert file in {e[0] for e in expected}, err
        key_line: int | str = int(line) if line.isdigit() else line
        if (file, "*", err.reason) in expected:
            key_line = "*"
        got.add((file, key_line, err.reason))
        assert err.detail, err
    assert got == expected
    assert len({reason for _, _, reason in expected}) >= 15  # kinds of damage, each named
    assert len(corpus.errors) == len(expected)

    # Line records carry the byte offset of their line (the BOM counts: it is in the file).
    raw = (Path(config.sources[0].path) / "a.jsonl").read_bytes()
    line_starts = [0] + [m.end() for m in re.finditer(b"\n", raw)]
    for err in corpus.errors:
        file, line = _where(err.location)
        if file == "a.jsonl":
            assert err.byte_offset == line_starts[int(line) - 1], err
            assert err.to_dict()["byte_offset"] == err.byte_offset
    utf8 = next(e for e in corpus.errors if e.reason == "invalid_utf8")
    assert "0xff" in utf8.detail and "column 0" in utf8.detail

    # File-level records name how far the reader got.
    truncated = next(e for e in corpus.errors if e.location.rsplit("/", 1)[-1].startswith("b."))
    assert "after line" in truncated.detail

    # Counts, and the default domains: the source's, else "unknown".
    assert corpus.stats.errors_by_reason["not_an_object"] == 4
    assert {c.domain for c in corpus.conversations if c.source == "jsonl"} == {"mixed"}
    assert {c.domain for c in corpus.conversations if c.source == "parquet"} == {"unknown"}

    for reason in sorted({r for _, _, r in expected}):
        where = sorted({f for f, _, r in expected if r == reason})
        record(
            "bad-input",
            reason,
            inputs_tried=sum(r == reason for _, _, r in expected),
            error_records=corpus.stats.errors_by_reason[reason],
            files=", ".join(where),
        )
    record(
        "bad-input",
        "all sources together",
        inputs_tried=len(expected),
        error_records=len(corpus.errors),
        good_rows_kept=len(good),
        good_rows_lost=sum(prompt not in firsts for prompt in good),
        result="completed",
    )


def test_a_row_that_raises_anything_becomes_an_unexpected_error_record(tmp_path, monkeypatch):
    import pipeline.corpus.ingest as ingest

    real = ingest.to_messages

    def flaky(row, **kwargs):
        if row.get("prompt") == "boom":
            raise KeyError("surprise")
        return real(row, **kwargs)

    monkeypatch.setattr(ingest, "to_messages", flaky)
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"prompt": "boom"}) + "\n" + json.dumps(_pair(1)) + "\n")
    corpus = load_corpus(CorpusConfig.model_validate({"sources": [{"path": str(path)}]}))
    assert len(corpus.conversations) == 1
    [err] = corpus.errors
    assert err.reason == "unexpected_error" and "KeyError" in err.detail
    assert err.location.endswith("c.jsonl:1")
