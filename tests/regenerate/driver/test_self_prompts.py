"""Prompts the target writes itself, sampled from the trained toy target (transformers backend)."""

from __future__ import annotations

import json

from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.ingest import load_corpus
from pipeline.corpus.self_prompts import SelfPromptsConfig, user_turn_prefix
from pipeline.regenerate.driver.self_prompts import ensure_self_prompts, synthesize
from pipeline.targets.config import TargetConfig


def _target(model_dir) -> TargetConfig:
    return TargetConfig(model=str(model_dir), backend="hf", dtype="float32")


def test_user_turn_prefix_ends_where_the_user_text_begins(trained_target_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_target_dir)
    prefix = tokenizer.decode(user_turn_prefix(tokenizer))
    full = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello there"}], tokenize=False
    )
    assert full.startswith(prefix) and full[len(prefix) :].startswith("hello there")


def test_self_prompts_are_distinct_non_empty_and_reproducible(trained_target_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    from pipeline.targets.loader import load_target

    tokenizer = AutoTokenizer.from_pretrained(trained_target_dir)
    config = SelfPromptsConfig(
        path=str(tmp_path / "p.jsonl"), num_prompts=6, seed=3, max_new_tokens=48, min_words=2
    )
    backend = load_target(_target(trained_target_dir))
    try:
        first = synthesize(tokenizer, backend, config)
        capsys.readouterr()
        again = synthesize(tokenizer, backend, config, show_progress=True)
        bar = capsys.readouterr().err  # minutes on a real target: a bar of prompts kept
        other = synthesize(tokenizer, backend, config.model_copy(update={"seed": 4}))
    finally:
        backend.close()
    prompts = [r["prompt"] for r in first]
    assert len(prompts) == 6
    assert all(p.strip() for p in prompts)
    assert len(set(prompts)) == len(prompts)
    assert first == again  # same target, seed and settings: the same prompts
    assert "self prompts" in bar and "6/6" in bar
    assert [r["prompt"] for r in other] != prompts


def test_ensure_writes_once_and_the_corpus_reads_it_as_a_source(trained_target_dir, tmp_path):
    path = tmp_path / "self.jsonl"
    config = SelfPromptsConfig(
        path=str(path), num_prompts=4, seed=0, max_new_tokens=48, min_words=2
    )
    ensure_self_prompts(config, _target(trained_target_dir))
    written = path.read_text()
    stamp = path.stat().st_mtime_ns
    ensure_self_prompts(config, _target(trained_target_dir))  # same recipe: reused
    assert path.stat().st_mtime_ns == stamp and path.read_text() == written
    meta = json.loads(path.with_name("self.jsonl.meta.json").read_text())
    assert meta["rows"] == 4 and meta["recipe"]["seed"] == 0
    corpus = load_corpus(CorpusConfig(self_prompts=config))
    assert [c.source for c in corpus.conversations] == ["self-prompts"] * 4
    assert "written by the target" in corpus.licences()["self-prompts"]
