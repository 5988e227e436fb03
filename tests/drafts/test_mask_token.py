"""The default mask token: the tokenizer's, else the field's fallbacks (unused row, pad, EOS, unk)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tokenizer():
    from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
    from pipeline.toy.tokenizer import train_tokenizer

    convs = generate(SyntheticCorpusConfig(num_conversations=30, seed=5))
    return train_tokenizer((m["content"] for c in convs for m in c["messages"]), 300)


def _target(path, tokenizer, vocab_size: int, **special):
    """A directory with the tokenizer (special tokens overridden) and a config of `vocab_size`."""
    from transformers import LlamaConfig

    for name, value in special.items():
        setattr(tokenizer, name, value)
    tokenizer.save_pretrained(path)
    LlamaConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1).save_pretrained(path)
    return path


def test_the_tokenizers_mask_token_comes_first(tmp_path, tokenizer):
    from pipeline.drafts.target_head import tokenizer_mask_token_id

    target = _target(tmp_path, tokenizer, len(tokenizer) + 64)
    assert tokenizer_mask_token_id(target) == tokenizer.convert_tokens_to_ids("<|mask|>")


def test_without_one_an_unused_row_then_pad(tmp_path, tokenizer):
    from pipeline.drafts.target_head import tokenizer_mask_token_id

    tokenizer = tokenizer.__class__.from_pretrained(_target(tmp_path / "a", tokenizer, 300))
    padded = _target(tmp_path / "b", tokenizer, len(tokenizer) + 64, mask_token=None)
    assert tokenizer_mask_token_id(padded) == len(tokenizer)  # first row no token uses
    full = _target(tmp_path / "c", tokenizer, len(tokenizer), mask_token=None)
    assert tokenizer_mask_token_id(full) == tokenizer.pad_token_id
    no_pad = _target(tmp_path / "d", tokenizer, len(tokenizer), mask_token=None, pad_token=None)
    assert tokenizer_mask_token_id(no_pad) == tokenizer.eos_token_id
    bare = _target(
        tmp_path / "e", tokenizer, len(tokenizer), mask_token=None, pad_token=None, eos_token=None
    )
    with pytest.raises(ValueError, match="set draft.mask_token_id"):
        tokenizer_mask_token_id(bare)
