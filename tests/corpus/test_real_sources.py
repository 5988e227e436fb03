"""The real target's prompt sources, each read from a small slice shipped as a fixture.

The sources of pipeline/demo/configs/real-smollm2.yaml, pointed at the fixture
slices instead of the installed packages: every source yields conversations
of its row shape, and every source's licence reaches the corpus' licences
(what regeneration records in the dataset's provenance)."""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.ingest import load_corpus
from pipeline.demo import CONFIG_DIR
from pipeline.regenerate.driver.provenance import run_identity
from pipeline.shards.schema import Provenance

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
SLICES = {
    "chitchat": "chitchat-slice.json",
    "nq-open": "nq-open-slice.jsonl",
    "mmlu": "mmlu-slice.jsonl",
    "commonsenseqa": "commonsenseqa-slice.jsonl",
    "codeio": "codeio-slice.jsonl.gz",
    "truthfulqa": "truthfulqa-slice.jsonl",
}


def _real_corpus_on_fixtures() -> CorpusConfig:
    """The real config's corpus with every packaged source read from its fixture slice."""
    corpus = yaml.safe_load((CONFIG_DIR / "real-smollm2.yaml").read_text())["corpus"]
    corpus["sources"] = [
        {**s, "path": str(FIXTURES / SLICES[s["name"]])}
        for s in corpus["sources"]
        if s["name"] in SLICES
    ]
    del corpus["self_prompts"], corpus["size"]
    return CorpusConfig.model_validate(corpus)


def test_every_real_source_reads_its_slice_with_its_licence():
    config = _real_corpus_on_fixtures()
    assert {s.name for s in config.sources} == set(SLICES)
    corpus = load_corpus(config)
    assert corpus.errors == []
    by_source: dict[str, list] = {}
    for conv in corpus.conversations:
        by_source.setdefault(conv.source, []).append(conv)
    assert set(by_source) == set(SLICES)
    licences = corpus.licences()
    assert licences == {s.name: s.licence for s in config.sources}
    assert licences["nq-open"] == "CC-BY-SA-3.0" and licences["chitchat"] == "MIT"
    for name, convs in by_source.items():
        for conv in convs:
            assert conv.messages[0]["role"] == "user" and conv.messages[0]["content"], name
    # Chit Chat's speaker groups alternate user/assistant, cut in windows of 3 exchanges.
    chat = by_source["chitchat"]
    assert any(c.location.endswith("/w1") for c in chat) and len(chat) > 3
    for conv in chat:
        assert 1 <= conv.num_answers <= 3
        roles = [m["role"] for m in conv.messages]
        assert roles[::2] == ["user"] * len(roles[::2])
        assert set(roles[1::2]) <= {"assistant"}
    # CodeI/O rows are read through the configured prompt column.
    assert by_source["codeio"][0].messages[0]["content"].startswith("Given")


def test_licences_ride_in_provenance_but_not_in_unit_identity():
    base = {
        "target_name": "t",
        "target_revision": "r",
        "tokenizer_hash": "h",
        "aux_layer_ids": (1, 2),
        "hidden_size": 8,
        "codec": "bf16",
        "corpus_version": "c1",
        "code_version": "v",
    }
    with_sources = Provenance(**base, corpus_sources={"chitchat": "MIT"})
    again = Provenance.from_dict(with_sources.to_dict())
    assert again.corpus_sources == {"chitchat": "MIT"}
    # A corpus grown by another source keeps its units (and its lineage).
    grown = Provenance(**base, corpus_sources={"chitchat": "MIT", "mmlu": "MIT"})
    assert run_identity(with_sources, 1) == run_identity(grown, 1)
    assert with_sources.lineage_key() == grown.lineage_key()
