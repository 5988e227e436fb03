# ruff: noqa: F811  (fixtures imported from s3_server are redefined as arguments)
"""Refresh and stable planning, end to end in process (transformers backend), local disk and S3.

Regenerations are counted from the engine's requests (the backend's `submit`);
the samples a version holds are checked with DuckDB over the manifest's files.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import duckdb
import pytest
from s3_server import moto_endpoint, s3_uri  # noqa: F401  (fixtures)

from pipeline.corpus.ingest import load_corpus
from pipeline.regenerate.config import parse_config
from pipeline.regenerate.refresh import run_refresh
from pipeline.regenerate.run import run_local
from pipeline.table import lease
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError, LineageMismatch
from pipeline.table.lease import LeaseHeld, LeaseLost, WriteSession
from pipeline.targets.hf_backend import HFTarget
from pipeline.torch_threads import torch_threads


@pytest.fixture
def requests(monkeypatch):
    """Every request the engine is asked to generate, by sample id."""
    seen: list[str] = []
    submit = HFTarget.submit

    def counting(self, request, *args, **kwargs):
        seen.append(request.request_id)
        return submit(self, request, *args, **kwargs)

    monkeypatch.setattr(HFTarget, "submit", counting)
    return seen


def _rows(ids, domain="qa", suffix=""):
    return [{"prompt": f"Where is city {i}{suffix}?", "domain": domain} for i in ids]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _config(corpus, uri, endpoint_url=None, **generation):
    return parse_config(
        {
            "name": "refresh-test",
            "target": {
                "model": "toy:trained",
                "backend": "hf",
                "dtype": "float32",
                "max_model_len": 256,
                "aux_layer_ids": [1, 3],
            },
            "corpus": {"sources": [{"path": str(corpus), "name": "cities"}]},
            "generation": {"temperature": 0.0, "max_new_tokens": 6, **generation},
            "output": {"uri": str(uri), "endpoint_url": endpoint_url},
            "regenerate": {
                "conversations_per_unit": 3,
                "commit_every_units": 2,
                "min_answer_tokens": 4,
            },
        },
        "test",
    )


def _expected(config):
    return {sid for c in load_corpus(config.corpus).conversations for sid in c.sample_ids()}


def live_ids_duckdb(uri) -> list[str]:
    """Sample ids a version holds: its files, minus the rows it tombstones (DuckDB, local files)."""
    ds = Dataset.open(uri)
    m = ds.manifest()
    con = duckdb.connect()
    con.execute("CREATE TABLE dropped (file VARCHAR, sample_id VARCHAR)")
    drops = [(ds.shard_url(e), sid) for e in m.shards for sid in e.dropped]
    if drops:
        con.executemany("INSERT INTO dropped VALUES (?, ?)", drops)
    files = [ds.shard_url(e) for e in m.shards]
    rows = con.execute(
        "SELECT r.sample_id FROM read_parquet(?, filename = true) r "
        "ANTI JOIN dropped d ON r.filename = d.file AND r.sample_id = d.sample_id",
        [files],
    ).fetchall()
    return [r[0] for r in rows]


def test_a_grown_corpus_regenerates_only_the_new_conversations(tmp_path, requests):
    corpus, uri = tmp_path / "corpus.jsonl", tmp_path / "ds"
    _write(corpus, _rows(range(10)))
    config = _config(corpus, uri)
    with torch_threads(1):
        first = run_local(config)
        assert len(requests) == 10 and first.units_done >= 4  # 4 buckets, cut into units of 3
        old_ids = set(live_ids_duckdb(uri))
        _write(corpus, _rows(range(14)))  # 4 new conversations
        requests.clear()
        grown = run_local(config)
    assert len(requests) == 4 and set(requests) == _expected(config) - old_ids
    ids = live_ids_duckdb(uri)
    assert len(ids) == len(set(ids)) == 14 and set(ids) == _expected(config)
    old = {e.path for e in Dataset.open(uri).manifest(first.version).shards}
    assert old <= {e.path for e in Dataset.open(uri).manifest(grown.version).shards}
    requests.clear()
    with torch_threads(1):
        again = run_local(config)
    assert requests == [] and again.version == grown.version  # nothing new: nothing committed


def test_refresh_regenerates_exactly_the_new_and_changed_samples(tmp_path, requests, caplog):
    corpus, uri = tmp_path / "corpus.jsonl", tmp_path / "ds"
    rows = _rows(range(12))
    _write(corpus, rows)
    config = _config(corpus, uri)
    with torch_threads(1):
        v1 = run_refresh(config, local=True).version
    assert len(requests) == 12
    before = Dataset.open(uri).manifest(v1)
    # M=3 added, K=2 changed (one text, one domain tag), R=2 removed.
    rows = rows[:10] + _rows(range(100, 103))
    rows[0] = {"prompt": "Where is city 0, again?", "domain": "qa"}
    rows[1] = {**rows[1], "domain": "geography"}
    _write(corpus, rows)
    requests.clear()
    with torch_threads(1):
        refreshed = run_refresh(config, local=True)
    assert len(requests) == 3 + 2
    ids = live_ids_duckdb(uri)
    assert len(ids) == len(set(ids)) and set(ids) == _expected(config)
    after = Dataset.open(uri).manifest()
    assert after.num_rows == 13 and after.totals.by_domain == {"qa": 12, "geography": 1}
    # Kept shards are not rewritten: same files, same hashes; their removed rows are listed.
    kept = {e.path: e for e in after.shards if e.path in before.entries}
    assert kept and all(e.sha256 == before.entries[p].sha256 for p, e in kept.items())
    assert sum(len(e.dropped) for e in after.shards) >= 3  # 2 removed + 1 edited + 1 re-tagged
    # Nothing changed: nothing regenerated, nothing committed.
    requests.clear()
    with torch_threads(1):
        assert run_refresh(config, local=True).version == refreshed.version
    assert requests == []


def test_new_generation_parameters_start_a_new_lineage(tmp_path, requests, caplog):
    corpus, uri = tmp_path / "corpus.jsonl", tmp_path / "ds"
    _write(corpus, _rows(range(5)))
    with torch_threads(1):
        v1 = run_local(_config(corpus, uri)).version
    changed = _config(corpus, uri, max_new_tokens=5)
    requests.clear()
    with pytest.raises(LineageMismatch, match=r"generation.max_new_tokens: 6 -> 5.*refresh"):
        run_local(changed)  # plain regenerate refuses, before any engine work
    assert requests == []
    caplog.set_level(logging.INFO)
    with torch_threads(1):
        summary = run_refresh(changed, local=True)
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("new lineage:")]
    assert notes == [
        "new lineage: generation.max_new_tokens: 6 -> 5; all 5 conversations are regenerated "
        f"(versions up to {v1} stay readable)"
    ]
    assert len(requests) == 5
    m = Dataset.open(uri).manifest(summary.version)
    assert m.lineage.first_version == v1 + 1 and m.num_rows == 5
    assert m.lineage.id != Dataset.open(uri).manifest(v1).lineage.id
    assert Dataset.open(uri).manifest(v1).num_rows == 5  # the old lineage stays readable


def test_two_refreshes_on_s3_one_commits_the_other_names_the_holder(
    tmp_path, requests, moto_endpoint, s3_uri
):
    corpus = tmp_path / "corpus.jsonl"
    _write(corpus, _rows(range(6)))
    config = _config(corpus, s3_uri, endpoint_url=moto_endpoint)
    barrier, results = threading.Barrier(2), {}

    def refresh(i: int) -> None:
        barrier.wait()
        try:
            with torch_threads(1):
                results[i] = run_refresh(config, local=True)
        except LeaseHeld as err:
            results[i] = err

    threads = [threading.Thread(target=refresh, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    held = [r for r in results.values() if isinstance(r, LeaseHeld)]
    done = [r for r in results.values() if not isinstance(r, Exception)]
    assert len(held) == 1 and len(done) == 1, results
    assert "refresh-test refresh (session s-" in str(held[0])
    assert len(requests) == 6  # one run did the work
    ds = Dataset.open(s3_uri, endpoint_url=moto_endpoint)
    sessions = {ds.manifest(v).commit["session"] for v in ds.versions()}
    assert len(sessions) == 1 and ds.manifest().num_rows == 6
    assert lease.lease_holder(ds) is None  # released at the end


def test_a_refresh_whose_lease_expired_cannot_publish(tmp_path, requests, monkeypatch):
    corpus, uri = tmp_path / "corpus.jsonl", tmp_path / "ds"
    _write(corpus, _rows(range(4)))
    config = _config(corpus, uri)
    monkeypatch.setattr(lease, "DEFAULT_TTL_S", 2.0)
    monkeypatch.setattr(lease, "CLOCK_MARGIN_S", 0.5)
    monkeypatch.setattr(WriteSession, "renew", lambda self: None)  # a paused holder
    submit = HFTarget.submit

    def slow(self, request, *args, **kwargs):
        time.sleep(1.5)  # the run outlives its lease
        return submit(self, request, *args, **kwargs)

    monkeypatch.setattr(HFTarget, "submit", slow)
    with torch_threads(1), pytest.raises(LeaseLost, match="published nothing"):
        run_refresh(config, local=True)
    ds = Dataset.open(uri)
    assert ds.latest_version() is None  # nothing was published
    with WriteSession(ds, owner="next refresh") as taker:  # the expired lease is taken over
        assert lease.read_lease(ds).session == taker.id


def test_cli_refresh_exits_at_once_naming_the_holder(tmp_path):
    import yaml
    from click.testing import CliRunner

    from pipeline.cli import cli

    corpus, uri = tmp_path / "corpus.jsonl", tmp_path / "ds"
    _write(corpus, _rows(range(2)))
    path = tmp_path / "refresh.yaml"
    path.write_text(yaml.safe_dump(_config(corpus, uri).model_dump(mode="json")))
    with WriteSession(Dataset.open(uri), owner="the nightly refresh"):
        started = time.monotonic()
        out = CliRunner().invoke(cli, ["refresh", "--config", str(path), "--local"])
    assert out.exit_code == 1 and time.monotonic() - started < 20
    assert "is being written by the nightly refresh (session s-" in out.output
    assert Dataset.open(uri).latest_version() is None


def test_gc_running_during_a_regeneration_deletes_nothing_it_names(tmp_path, requests, monkeypatch):
    import os

    from pipeline.table.gc import gc_dataset
    from pipeline.table.inspection import verify_dataset

    corpus, uri = tmp_path / "corpus.jsonl", tmp_path / "ds"
    _write(corpus, _rows(range(12)))
    config = _config(corpus, uri)
    ds = Dataset.open(uri)
    # A crashed earlier run's shard: written hours ago, before this run's session.
    dead = "shards/u0000-deadbeef0000.0badcafe.parquet"
    with ds.storage.open_create(dead) as fh:
        fh.write(b"not committed by anyone")
    past = time.time() - 3 * 3600
    os.utime(ds.storage.url(dead), (past, past))
    submit = HFTarget.submit

    def slow(self, request, *args, **kwargs):
        time.sleep(0.25)  # stretch the run so gc passes interleave with writes and commits
        return submit(self, request, *args, **kwargs)

    monkeypatch.setattr(HFTarget, "submit", slow)
    outcome: dict = {}

    def regenerate() -> None:
        with torch_threads(1):
            outcome["summary"] = run_local(config)

    runner = threading.Thread(target=regenerate)
    runner.start()
    deleted: set[str] = set()
    passes = 0
    while runner.is_alive():
        try:
            deleted |= {
                o.key
                for o in gc_dataset(str(uri), delete=True, min_age_s=0, unsafe_min_age=True).garbage
            }
            passes += 1
        except DatasetError:  # an empty root, before the run's first write: not a dataset yet
            pass
        time.sleep(0.02)
    runner.join()
    assert passes >= 5 and outcome["summary"].version >= 2, passes
    assert dead in deleted  # gc did collect garbage meanwhile
    named: set[str] = set()
    for v in ds.versions():
        assert verify_dataset(str(uri), version=v).ok, v
        m = Dataset.open(uri).manifest(v)
        named |= {e.path for e in m.shards} | {e.sidecar for e in m.shards}
        named |= {r.key for r in m.segments}
    assert not deleted & named
    ids = live_ids_duckdb(uri)
    assert len(ids) == len(set(ids)) and set(ids) == _expected(config)
