"""Toy target models: small Qwen3 checkpoints built on the spot, cached on disk.

A random-weight target answers with one repeated token, which a draft learns
trivially, so acceptance numbers from it mean nothing. `trained` is therefore
trained by the project's own code on the synthetic corpus (a few minutes on two
CPU cores) and answers with the structure of each domain. `random` is instant
and tiny, for unit tests that only need shapes and plumbing. `large` has the
shape used by throughput benchmarks (hidden 512, 8 layers; random weights).

Every toy is an ordinary Hugging Face model directory (config.json,
model.safetensors, tokenizer files with a chat template) that transformers and
vLLM both load. Its cache key hashes the spec and this module's build version,
so a changed spec builds a new directory and never reuses a stale one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.cache import cache_root
from pipeline.logs import kv

log = logging.getLogger(__name__)

# Bump when the build procedure changes in a way the spec does not capture.
BUILD_VERSION = 1


@dataclass(frozen=True)
class ToyTrainSpec:
    """How the `trained` toy learns the synthetic corpus."""

    num_conversations: int = 6000
    corpus_seed: int = 0
    num_steps: int = 240
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    seed: int = 0


@dataclass(frozen=True)
class ToyTargetSpec:
    """Shape of a toy Qwen3 target; `train=None` keeps the random initialisation."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # vLLM's CPU attention supports 32, 64, 80, 96, 112, 128, ...
    intermediate_size: int
    tokenizer_vocab: int = 2048
    tokenizer_corpus_size: int = 3000
    max_position_embeddings: int = 4096
    init_seed: int = 0
    train: ToyTrainSpec | None = None

    def key(self) -> str:
        from pipeline.corpus.synthetic import CORPUS_VERSION

        payload = json.dumps(
            {"spec": asdict(self), "build": BUILD_VERSION, "corpus": CORPUS_VERSION}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


TOY_TARGETS: dict[str, ToyTargetSpec] = {
    "random": ToyTargetSpec(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=128,
    ),
    # Sized to train in under five minutes on two CPU cores (~1 s per 4k-token step).
    "trained": ToyTargetSpec(
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=384,
        train=ToyTrainSpec(),
    ),
    "large": ToyTargetSpec(
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        intermediate_size=1536,
    ),
}


def toy_target_dir(name: str, cache_dir: Path | None = None) -> Path:
    if name not in TOY_TARGETS:
        raise ValueError(f"unknown toy target {name!r}; known: {sorted(TOY_TARGETS)}")
    return (cache_dir or cache_root()) / "targets" / f"toy-{name}-{TOY_TARGETS[name].key()}"


def build_toy_target(name: str, cache_dir: Path | None = None) -> Path:
    """Build the named toy target unless its cached directory exists; return the directory.

    The directory appears atomically (built in a temporary sibling, then
    renamed), so a crashed build never leaves a half model that later runs trust.
    """
    final = toy_target_dir(name, cache_dir)
    if (final / "dspark_toy.json").exists():
        return final
    spec = TOY_TARGETS[name]
    final.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log.info("building toy target %s", kv(name=name, dir=final))
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.") as tmp:
        work = Path(tmp) / "model"
        report = _build(spec, work)
        report.update(name=name, key=spec.key(), build_seconds=round(time.monotonic() - started, 1))
        (work / "dspark_toy.json").write_text(json.dumps(report, indent=2))
        try:
            work.rename(final)
        except OSError:
            # Another process finished the same build first; theirs is identical.
            if not (final / "dspark_toy.json").exists():
                raise
    log.info("toy target ready %s", kv(name=name, seconds=report["build_seconds"]))
    return final


def _build(spec: ToyTargetSpec, out: Path) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
    from pipeline.toy.tokenizer import train_tokenizer

    tok_corpus = generate(
        SyntheticCorpusConfig(num_conversations=spec.tokenizer_corpus_size, seed=10_000)
    )
    tokenizer = train_tokenizer(
        (m["content"] for c in tok_corpus for m in c["messages"]), spec.tokenizer_vocab
    )
    # Pad the embedding table to a multiple of 64, as real checkpoints do.
    vocab_size = int(math.ceil(len(tokenizer) / 64) * 64)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.init_seed)
    model = Qwen3ForCausalLM(config)
    report: dict = {"num_parameters": sum(p.numel() for p in model.parameters())}
    if spec.train is not None:
        from pipeline.toy.training import train_toy

        report["training"] = train_toy(model, tokenizer, spec.train)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return report


def remove_toy_target(name: str, cache_dir: Path | None = None) -> None:
    """Delete a cached toy target (the next build starts from scratch)."""
    shutil.rmtree(toy_target_dir(name, cache_dir), ignore_errors=True)
