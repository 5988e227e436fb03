"""The corpus mixture: weights, stable selection under growth, near-duplicates across sources."""

from __future__ import annotations

import json

from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.ingest import load_corpus
from pipeline.corpus.mixture import quotas
from pipeline.corpus.near_dup import NearDuplicateConfig, NearDuplicateIndex


def _write(path, prompts):
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return str(path)


def test_quotas_follow_the_weights_and_sum_to_size():
    q = quotas(10, {"a": 0.5, "b": 0.3, "c": 0.2})
    assert q == {"a": 5, "b": 3, "c": 2}
    q = quotas(7, {"a": 1.0, "b": 1.0, "c": 1.0})
    assert sum(q.values()) == 7 and sorted(q.values()) == [2, 2, 3]


def test_a_larger_size_keeps_every_earlier_pick(tmp_path):
    a = _write(
        tmp_path / "a.jsonl", [f"question number {i} about topic {i * 7}" for i in range(60)]
    )
    b = _write(
        tmp_path / "b.jsonl", [f"please explain the idea {i} in words {i * 3}" for i in range(60)]
    )

    def picked(size):
        config = CorpusConfig(
            size=size,
            sources=[{"path": a, "name": "a", "weight": 2.0}, {"path": b, "name": "b"}],
        )
        corpus = load_corpus(config)
        return corpus, {c.conversation_id for c in corpus.conversations}

    small, small_ids = picked(30)
    large, large_ids = picked(60)
    assert small_ids < large_ids  # growth only adds
    assert small.stats.by_source["a"].selected == 20 and small.stats.by_source["b"].selected == 10
    assert large.stats.by_source["a"].selected == 40 and large.stats.by_source["b"].selected == 20
    # The order of the rows in a file does not choose: reversed files pick the same.
    _write(
        tmp_path / "a.jsonl",
        [f"question number {i} about topic {i * 7}" for i in reversed(range(60))],
    )
    assert picked(30)[1] == small_ids


def test_a_source_short_of_its_share_gives_all_it_has(tmp_path):
    a = _write(tmp_path / "a.jsonl", [f"a long enough question {i} here" for i in range(5)])
    b = _write(tmp_path / "b.jsonl", [f"another sort of request {i} there" for i in range(50)])
    corpus = load_corpus(
        CorpusConfig(size=20, sources=[{"path": a, "name": "a"}, {"path": b, "name": "b"}])
    )
    assert corpus.stats.by_source["a"].selected == 5 and corpus.stats.by_source["a"].quota == 10
    assert corpus.stats.by_source["b"].selected == 10  # weights mean what they say: no refill


def test_near_duplicates_across_two_sources_collapse_to_one_sample(tmp_path):
    first = _write(
        tmp_path / "first.jsonl",
        ["What is the capital city of France, and why did it become the capital?",
         "How do I sort a list of numbers in Python without changing the original list?"],
    )  # fmt: skip
    second = _write(
        tmp_path / "second.jsonl",
        ["what is the capital city of France and why did it become the capital",  # reworded case/punctuation
         "Name three rivers that flow through Germany and the seas they reach."],
    )  # fmt: skip
    sources = [{"path": first, "name": "first"}, {"path": second, "name": "second"}]
    exact_only = load_corpus(CorpusConfig(sources=sources))
    assert len(exact_only.conversations) == 4  # not equal text: exact dedup keeps both
    corpus = load_corpus(CorpusConfig(sources=sources, near_duplicates={}))
    texts = [c.messages[0]["content"] for c in corpus.conversations]
    assert len(texts) == 3
    assert sum("capital city of France" in t for t in texts) == 1
    assert corpus.stats.near_duplicates == 1
    assert corpus.stats.by_source["second"].near_duplicates == 1  # the earlier source wins


def test_near_duplicate_index_keeps_distinct_texts_apart():
    index = NearDuplicateIndex(NearDuplicateConfig())
    assert index.offer("a", ["the cat sat on the mat by the door today"]) is None
    assert index.offer("b", ["a completely different question about rivers and seas"]) is None
    assert index.offer("c", ["The cat sat on the mat, by the door today!"]) == "a"
