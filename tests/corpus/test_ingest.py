"""Ingestion from JSONL, Parquet, HF datasets on disk and S3 (loopback server); errors and dedup."""

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from s3_server import moto_endpoint, s3_uri  # noqa: F401  (fixtures)

from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.identity import sample_id
from pipeline.corpus.ingest import load_corpus

GOOD = [
    {
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        "topic": "chat",
    },
    {
        "conversations": [
            {"from": "human", "value": "2+2?"},
            {"from": "gpt", "value": "4"},
            {"from": "human", "value": "and 3+3?"},
            {"from": "gpt", "value": "6"},
        ],
        "topic": "math",
    },
    {"prompt": "Name a colour", "response": "Blue", "topic": "qa"},
]


def _jsonl(path, rows, extra_lines=()):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(extra_lines))
    return path


def _corpus(**source):
    return CorpusConfig.model_validate({"sources": [source]})


def test_jsonl_with_malformed_rows_reports_each_by_reason(tmp_path):
    bad_roles = {"messages": [{"role": "assistant", "content": "x"}], "topic": "chat"}
    no_topic = {"prompt": "a", "response": "b"}
    extra = [
        "not json\n",
        '{"foo": 1}\n',
        "[1, 2]\n",
        json.dumps(bad_roles) + "\n",
        json.dumps(no_topic) + "\n",
    ]
    path = _jsonl(tmp_path / "c.jsonl", GOOD, extra)
    corpus = load_corpus(_corpus(path=str(path), domain_column="topic"))
    # A row without a domain is tagged with the default, never an error.
    assert [c.domain for c in corpus.conversations] == ["chat", "math", "qa", "unknown"]
    assert corpus.conversations[1].num_answers == 2
    reasons = {e.location.rsplit(":", 1)[1]: e.reason for e in corpus.errors}
    assert reasons == {
        "4": "unparsable_row",
        "5": "unknown_format",
        "6": "not_an_object",
        "7": "roles_do_not_alternate",
    }
    assert all(str(path) in e.location for e in corpus.errors)
    with_default = load_corpus(_corpus(path=str(path), domain_column="topic", domain="general"))
    assert [c.domain for c in with_default.conversations] == ["chat", "math", "qa", "general"]


def test_duplicates_across_formats_are_kept_once_and_ids_are_content_hashes(tmp_path):
    same = {"prompt": "Hi", "response": "Hello"}  # equals GOOD[0] after normalisation
    path = _jsonl(tmp_path / "c.jsonl", GOOD + [same])
    corpus = load_corpus(_corpus(path=str(path), domain="general"))
    assert corpus.stats.duplicates == 1 and len(corpus.conversations) == 3
    again = load_corpus(_corpus(path=str(path), domain="general"))
    assert [c.sample_ids() for c in again.conversations] == [
        c.sample_ids() for c in corpus.conversations
    ]
    ids = corpus.conversations[1].sample_ids()
    assert (
        ids == [sample_id(corpus.conversations[1].conversation_id, t) for t in (0, 1)]
        and ids[0] != ids[1]
    )


def test_parquet_directory_and_hf_dataset_on_disk(tmp_path):
    folder = tmp_path / "pq"
    folder.mkdir()
    rows = [{"prompt": f"q{i}", "response": f"a{i}", "topic": "qa"} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows[:3]), folder / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[3:]), folder / "part-1.parquet")
    corpus = load_corpus(_corpus(path=str(folder), domain_column="topic"))
    assert [c.messages[0]["content"] for c in corpus.conversations] == [f"q{i}" for i in range(5)]
    assert corpus.conversations[3].location.endswith("part-1.parquet#0")

    hf_dir = tmp_path / "hf"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(hf_dir))
    corpus_hf = load_corpus(_corpus(path=str(hf_dir), domain="qa"))
    assert [c.conversation_id for c in corpus_hf.conversations] == [
        c.conversation_id for c in corpus.conversations
    ]


def test_jsonl_on_s3(moto_endpoint, s3_uri, tmp_path):  # noqa: F811
    import boto3

    bucket = s3_uri.removeprefix("s3://").split("/")[0]
    body = "".join(json.dumps(r) + "\n" for r in GOOD) + "broken\n"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").put_object(
        Bucket=bucket, Key="corpus/c.jsonl", Body=body.encode()
    )
    corpus = load_corpus(
        _corpus(path=f"s3://{bucket}/corpus/", endpoint_url=moto_endpoint, domain="mix")
    )
    assert len(corpus.conversations) == 3
    assert [e.reason for e in corpus.errors] == ["unparsable_row"]
    assert corpus.errors[0].location.startswith(f"s3://{bucket}/corpus/c.jsonl:")


def test_synthetic_and_max_rows(tmp_path):
    path = _jsonl(tmp_path / "c.jsonl", GOOD)
    config = CorpusConfig.model_validate(
        {
            "synthetic": {"num_conversations": 12},
            "sources": [{"path": str(path), "max_rows": 2, "domain": "x"}],
        }
    )
    corpus = load_corpus(config)
    assert corpus.stats.rows == 14
    assert len(corpus.by_domain()) == 7


def test_the_issue_export_bom_crlf_and_one_bad_line(tmp_path):
    # The reported file: a UTF-8 BOM, Windows line ends, one line of invalid UTF-8.
    lines = [json.dumps(r).encode() for r in GOOD]
    body = b"\xef\xbb\xbf" + b"\r\n".join([lines[0], b"\xff\xfe garbage", *lines[1:]]) + b"\r\n"
    path = tmp_path / "export.jsonl"
    path.write_bytes(body)
    corpus = load_corpus(_corpus(path=str(path), domain="chat"))
    assert len(corpus.conversations) == 3  # the first, BOM-prefixed row included
    [err] = corpus.errors
    assert err.reason == "invalid_utf8" and err.location == f"{path}:2"
    assert err.byte_offset == len(lines[0]) + 5  # BOM (3) + first line + CRLF
    assert "0xff" in err.detail


def test_a_missing_source_is_one_config_error_naming_the_path(tmp_path):
    from pipeline.config import ConfigError

    good = _jsonl(tmp_path / "good.jsonl", GOOD)
    for missing in (tmp_path / "nope.jsonl", tmp_path / "no_dir" / "x.parquet", tmp_path / "empty"):
        if missing.name == "empty":
            missing.mkdir()
        config = CorpusConfig.model_validate(
            {"sources": [{"path": str(good)}, {"path": str(missing)}]}
        )
        with pytest.raises(ConfigError) as err:
            load_corpus(config)
        message = str(err.value)
        assert "\n" not in message and str(missing) in message and "sources[1]" in message


def test_explicit_format_reads_a_file_of_any_name(tmp_path):
    path = tmp_path / "export.txt"
    path.write_text("".join(json.dumps(r) + "\n" for r in GOOD))
    corpus = load_corpus(_corpus(path=str(path), format="jsonl", domain="x"))
    assert len(corpus.conversations) == 3 and not corpus.errors


def test_non_text_parts_skip_mode_counts_what_it_dropped(tmp_path):
    row = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe the weather."},
                    {"type": "image_url", "image_url": {"url": "https://x/sky.png"}},
                    {"type": "input_audio", "input_audio": {"data": "..."}},
                ],
            }
        ]
    }
    path = _jsonl(tmp_path / "c.jsonl", [row, row | {"id": 2}])  # the second is a duplicate
    strict = load_corpus(_corpus(path=str(path)))
    assert [e.reason for e in strict.errors] == ["non_text_part", "non_text_part"]
    config = CorpusConfig.model_validate(
        {"sources": [{"path": str(path)}], "non_text_parts": "skip"}
    )
    lenient = load_corpus(config)
    assert [c.messages for c in lenient.conversations] == [
        ({"role": "user", "content": "Describe the weather."},)
    ]
    assert lenient.stats.skipped_parts == {"image_url": 2, "input_audio": 2}


def test_parquet_structs_with_null_fields_hash_like_jsonl(tmp_path):
    # Arrow gives every message struct every field: None where a turn lacks it.
    rows = [
        {
            "messages": [
                {"role": "user", "content": "Weather?", "tool_calls": None, "tool_call_id": None},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "w", "arguments": "{}"},
                        }
                    ],
                    "tool_call_id": None,
                },
                {"role": "tool", "content": "sunny", "tool_calls": None, "tool_call_id": "c1"},
                {
                    "role": "assistant",
                    "content": "Sunny.",
                    "tool_calls": None,
                    "tool_call_id": None,
                },
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "Hi", "tool_calls": None, "tool_call_id": None},
                {"role": "assistant", "content": "Hello", "tool_calls": None, "tool_call_id": None},
            ]
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    from_parquet = load_corpus(_corpus(path=str(tmp_path / "c.parquet"), domain="x"))
    jsonl = [
        {"messages": [{k: v for k, v in m.items() if v is not None} for m in r["messages"]]}
        for r in rows
    ]
    from_jsonl = load_corpus(_corpus(path=str(_jsonl(tmp_path / "c.jsonl", jsonl)), domain="x"))
    assert not from_parquet.errors and not from_jsonl.errors
    assert [c.conversation_id for c in from_parquet.conversations] == [
        c.conversation_id for c in from_jsonl.conversations
    ]
    plain = load_corpus(_corpus(path=str(_jsonl(tmp_path / "g.jsonl", GOOD[:1])), domain="x"))
    assert from_parquet.conversations[1].conversation_id == plain.conversations[0].conversation_id


def test_a_transient_storage_error_stops_the_run_naming_the_file():
    from pipeline.corpus.records import ReadProgress
    from pipeline.corpus.sources import _guarded
    from pipeline.errors import PipelineError

    def rows():
        yield from ()
        raise ConnectionError("connection reset by peer")

    with pytest.raises(PipelineError, match=r"s3://b/c\.jsonl: transient storage error"):
        list(_guarded("s3://b/c.jsonl", rows(), ReadProgress(rows=7), "line"))


def test_missing_s3_paths_are_config_errors(moto_endpoint, s3_uri):  # noqa: F811
    from pipeline.config import ConfigError

    for path in (f"{s3_uri}/nope.jsonl", f"{s3_uri}/empty-prefix/"):
        with pytest.raises(ConfigError, match="sources\\[0\\].path: .*nope|empty-prefix"):
            load_corpus(_corpus(path=path, endpoint_url=moto_endpoint))


def test_error_records_without_an_offset_keep_their_four_keys():
    from pipeline.corpus.records import RowError

    assert list(RowError("s", "f.parquet#3", "unknown_format", "d").to_dict()) == [
        "source",
        "location",
        "reason",
        "detail",
    ]


def test_a_prompt_set_shipped_inside_a_package(tmp_path, monkeypatch):
    """`package:<module>/<file>`: a data file of an installed package, read like any JSONL."""
    import gzip

    pkg = tmp_path / "prompt_pkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    rows = [
        {"task_id": f"t/{i}", "prompt": f"def f{i}(x):\n    '''Return x + {i}.'''\n"}
        for i in range(3)
    ]
    with gzip.open(pkg / "data" / "prompts.jsonl.gz", "wt") as out:
        out.writelines(json.dumps(r) + "\n" for r in rows)
    monkeypatch.syspath_prepend(str(tmp_path))
    source = {"path": "package:prompt_pkg/data/prompts.jsonl.gz", "domain": "code-stubs"}
    corpus = load_corpus(CorpusConfig(sources=[source]))
    assert [list(c.messages) for c in corpus.conversations] == [
        [{"role": "user", "content": r["prompt"].strip()}] for r in rows
    ]
    assert {c.domain for c in corpus.conversations} == {"code-stubs"}


def test_a_package_that_is_not_installed_is_one_line_naming_it():
    from pipeline.config import ConfigError

    source = {"path": "package:no_such_prompt_pkg/data/x.jsonl"}
    with pytest.raises(ConfigError, match="package 'no_such_prompt_pkg' is not installed") as err:
        load_corpus(CorpusConfig(sources=[source]))
    assert "\n" not in str(err.value)
