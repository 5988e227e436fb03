"""What the capacity planner needs to know, typed: the corpus, the target, the assumptions.

Each section can come from a planner-inputs YAML file (`--inputs`), from inline
`key=value,...` specs on the command line, or — for the corpus and the target —
be read from the config itself (`corpus_stats.py`, `target_stats`). Every value
carries where it came from (`source`), which the plan prints beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from pipeline.config import ConfigError, ConfigModel, parse_model


class CorpusStats(ConfigModel):
    """The rows a regeneration produces and their mean lengths in tokens."""

    num_conversations: int = Field(gt=0)
    # Rows: regenerated assistant turns (one per user turn with turns=all).
    num_samples: int = Field(gt=0)
    # Mean tokens per row of the prompt (with turns=all: the whole history before
    # the answer) and of the answer (end-of-turn token included).
    prompt_tokens: float = Field(ge=0)
    answer_tokens: float = Field(gt=0)
    # Rows that would be error records (prompt_too_long and the later turns of
    # their conversation); already excluded from num_samples.
    num_dropped: int = Field(0, ge=0)
    source: str = "given"
    # Per corpus source (measured only): conversations, rows, mean prompt and answer
    # tokens, weight, licence.
    by_source: dict[str, dict] = Field(default_factory=dict)


class TargetStats(ConfigModel):
    """The target's shape. Parameters are counts (2.8e12), not bytes."""

    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    params: float | None = Field(None, gt=0)
    # Parameters a token passes through (MoE); None: all (dense).
    active_params: float | None = Field(None, gt=0)
    vocab_size: int | None = Field(None, gt=0)
    # The dense MLP width; the draft's layers copy it (DraftConfig.intermediate_size).
    intermediate_size: int | None = Field(None, gt=0)
    source: str = "given"


class Assumptions(ConfigModel):
    """Figures the planner cannot read from the config or the corpus (docs/cluster.md).

    A value given here is printed as an ASSUMPTION beside where a measured one
    would come from; one left unset takes the project's measured default
    (`figures.py`, which names the benchmark and date) or the named GPU's spec.
    """

    # Generated tokens/s of one replica in steady state, capturing (None: the
    # project's measured figure for a known setup, else the plan has no time section).
    replica_tok_s: float | None = Field(None, gt=0)
    # Stored / raw bf16 bytes of the hidden states (None: the codec's measured ratio).
    codec_ratio: float | None = Field(None, gt=0)
    # Raw bf16 MB the codec encodes per second on one core (None: measured).
    encode_mbps_per_core: float | None = Field(None, gt=0)
    # Bytes per token of input_ids (int32) + loss_mask (uint8), before compression.
    token_bytes: float = Field(5.0, ge=0)
    # Parquet footer with the provenance, per shard (measured on the toy: ~3.8 KB).
    shard_footer_bytes: float = Field(4096.0, ge=0)
    # One manifest lists every shard: its fixed part and each shard's entry (toy: ~0.9 KB, ~0.3 KB).
    manifest_base_bytes: float = Field(900.0, ge=0)
    manifest_entry_bytes: float = Field(300.0, ge=0)
    # The replicas' GPU (figures.GPUS: H100, H200, B200, GB200, GB300), which gives
    # the GPU memory; or the memory itself. Neither: no replica-memory check.
    gpu: str | None = None
    gpu_memory_gb: float | None = Field(None, gt=0)
    # Bytes per weight (None: the target's dtype).
    weight_bytes_per_param: float | None = Field(None, gt=0)
    # Draft training (the DSpark reference recipe, docs/design.md#the-draft-dspark).
    train_epochs: float = Field(1.0, gt=0)
    draft_layers: int = Field(5, gt=0)
    block_size: int = Field(8, gt=0)
    num_anchors: int = Field(512, gt=0)
    # The training GPU (default: `gpu`, else an H100) or its dense BF16 TFLOPS.
    train_gpu: str | None = None
    train_gpu_tflops: float | None = Field(None, gt=0)
    train_mfu: float = Field(0.3, gt=0, le=1)


class PlanInputs(ConfigModel):
    """A planner-inputs file: any of the three sections, and the replica (rack) count."""

    corpus: dict[str, Any] = Field(default_factory=dict)
    target: dict[str, Any] = Field(default_factory=dict)
    assume: dict[str, Any] = Field(default_factory=dict)
    num_replicas: int | None = Field(None, gt=0)


def load_inputs(path: str | Path | None) -> PlanInputs:
    if path is None:
        return PlanInputs()
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise ConfigError(f"{path}: cannot read planner inputs: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return parse_model(PlanInputs, data, str(path))


def parse_spec(spec: str | None, what: str) -> dict[str, Any]:
    """`key=value,key=value` (YAML values: 2.8e12, 7168) or a YAML/JSON file's mapping."""
    if not spec:
        return {}
    path = Path(spec)
    if "=" not in spec and path.suffix in (".yaml", ".yml", ".json"):
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"{path}: cannot read {what}: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: {what} must be a mapping")
        return data
    out: dict[str, Any] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what}: {item!r} is not key=value (e.g. hidden_size=7168)")
        out[key.strip()] = yaml.safe_load(value)
    return out


def build(model: type, data: dict[str, Any], source: str):
    """Validate a section; errors name where it came from and the key."""
    check_keys(model, data, source)
    return parse_model(model, data, source)


def check_keys(model: type, data: dict[str, Any], source: str) -> None:
    """Refuse a key `model` does not have, naming it and the closest one."""
    import difflib

    fields = list(model.model_fields)
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean {close[0]}?" if close else f" (keys: {', '.join(fields)})"
            raise ConfigError(f"{source}: unknown key {key!r}{hint}")
