"""The random toy target: deterministic, loadable, with a chat template and a mask token."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.toy.target import TOY_TARGETS, build_toy_target, toy_target_dir
from pipeline.toy.tokenizer import END_OF_TURN, MASK


def test_build_is_deterministic_and_cached(random_target_dir, tmp_path):
    again = build_toy_target("random", tmp_path)
    a = load_file(random_target_dir / "model.safetensors")
    b = load_file(again / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (random_target_dir / "tokenizer.json").read_bytes() == (
        again / "tokenizer.json"
    ).read_bytes()
    # A second call finds the cache and does not rebuild.
    stamp = (again / "dspark_toy.json").stat().st_mtime_ns
    assert build_toy_target("random", tmp_path) == again
    assert (again / "dspark_toy.json").stat().st_mtime_ns == stamp


def test_cache_key_follows_the_spec(tmp_path):
    keys = {name: spec.key() for name, spec in TOY_TARGETS.items()}
    assert len(set(keys.values())) == len(keys)
    assert toy_target_dir("random", tmp_path).name.endswith(keys["random"])
    with pytest.raises(ValueError, match="unknown toy target"):
        toy_target_dir("nope", tmp_path)


def test_loads_as_qwen3_with_special_tokens(random_target_dir):
    model = AutoModelForCausalLM.from_pretrained(random_target_dir)
    tok = AutoTokenizer.from_pretrained(random_target_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert tok.eos_token == END_OF_TURN and tok.mask_token == MASK
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.config.vocab_size >= len(tok) and model.config.vocab_size % 64 == 0
    assert json.loads((random_target_dir / "config.json").read_text())["head_dim"] in (32, 64)


def test_chat_template_roles_and_assistant_mask(random_target_dir):
    tok = AutoTokenizer.from_pretrained(random_target_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of Foo?"},
        {"role": "assistant", "content": "It is Bar."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "Sure!"},
    ]
    out = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    text = tok.decode(ids)
    for role in ("system", "user", "assistant"):
        assert f"<|im_start|>{role}\n" in text
    masked = tok.decode([i for i, m in zip(ids, mask, strict=False) if m])
    assert masked == "It is Bar.<|im_end|>Sure!<|im_end|>"
    # The mask token is one reserved id that ordinary text never produces.
    plain = tok("<|mask|> and mask")["input_ids"]
    assert plain.count(tok.mask_token_id) == 1
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
