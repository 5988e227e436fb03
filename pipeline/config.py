"""Typed configuration: one pydantic model per stage, loaded from YAML.

Every model forbids unknown keys, so a typo fails loudly instead of silently
running with a default. A validation failure raises `ConfigError`, whose
message names the file, the dotted key and what is wrong with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A config file is missing, unparsable or invalid; the message says where."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- target


class TargetConfig(_Model):
    """The target model whose answers and hidden states become training targets."""

    # A Hugging Face hub name, a local model directory, or a built-in toy target
    # (`toy:trained`, `toy:random`, `toy:large`) that is built and cached on first use.
    model: str
    # Hub revision (branch, tag or commit); recorded in provenance.
    revision: str | None = None
    # Which backend runs the target: vLLM (production) or transformers (reference).
    backend: Literal["vllm", "hf"] = "vllm"
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    max_model_len: int = Field(4096, gt=0)
    # Parallelism inside one replica.
    tensor_parallel_size: int = Field(1, ge=1)
    enable_expert_parallel: bool = False
    # On CPU vLLM reserves this share of RAM for the KV cache (0.2-0.3 on 24 GB).
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    enforce_eager: bool = False
    # Passed through to `vllm.LLM(...)` verbatim, for settings this schema lacks.
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # Residual streams to capture, as aux ids (stream after k decoder layers;
    # DESIGN.md §3). None: the DFlash spacing for the target's depth. The final
    # hidden state (after the final norm) is always captured as well.
    aux_layer_ids: list[int] | None = None

    @field_validator("aux_layer_ids")
    @classmethod
    def _sorted_unique(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value or any(v < 0 for v in value) or sorted(set(value)) != value:
                raise ValueError("must be a non-empty ascending list of distinct non-negative ints")
        return value

    @field_validator("model")
    @classmethod
    def _known_toy(cls, value: str) -> str:
        if value.startswith("toy:"):
            from pipeline.targets.toy import TOY_TARGETS

            name = value.removeprefix("toy:")
            if name not in TOY_TARGETS:
                raise ValueError(
                    f"unknown toy target {value!r}; choose one of "
                    + ", ".join(f"toy:{n}" for n in sorted(TOY_TARGETS))
                )
        return value


class GenerationConfig(_Model):
    """Sampling parameters for regenerating assistant turns."""

    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    max_new_tokens: int = Field(2048, gt=0)
    # Seeds per sample derive from this and the sample id, so reruns agree.
    seed: int = 0


# --------------------------------------------------------------------------- corpus


class SyntheticCorpusConfig(_Model):
    """The project's own multi-domain corpus (see pipeline/corpus/synthetic.py)."""

    num_conversations: int = Field(gt=0)
    seed: int = 0
    # Share of conversations with more than one assistant turn.
    multi_turn_fraction: float = Field(0.3, ge=0.0, le=1.0)
    # Restrict to some domains; empty means all.
    domains: list[str] = Field(default_factory=list)

    @field_validator("domains")
    @classmethod
    def _known_domains(cls, value: list[str]) -> list[str]:
        from pipeline.corpus.synthetic import DOMAINS

        unknown = sorted(set(value) - set(DOMAINS))
        if unknown:
            raise ValueError(f"unknown domains {unknown}; known: {sorted(DOMAINS)}")
        return value


class CorpusSourceConfig(_Model):
    """One input corpus: a file, a directory or a hub dataset."""

    # Local path, s3:// URI, or Hugging Face dataset name.
    path: str
    name: str | None = None
    format: Literal["auto", "jsonl", "parquet", "hf"] = "auto"
    split: str = "train"
    # Column holding a domain tag; else `domain` below applies to every row.
    domain_column: str | None = None
    domain: str | None = None
    # S3-compatible endpoint for s3:// paths (else AWS_ENDPOINT_URL, else AWS).
    endpoint_url: str | None = None
    # Stop after this many rows (for smoke runs); None reads everything.
    max_rows: int | None = Field(None, gt=0)


class CorpusConfig(_Model):
    synthetic: SyntheticCorpusConfig | None = None
    sources: list[CorpusSourceConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _some_input(self) -> CorpusConfig:
        if self.synthetic is None and not self.sources:
            raise ValueError("give `synthetic` or at least one entry in `sources`")
        return self


# --------------------------------------------------------------------------- cluster


class PlacementConfig(_Model):
    """How one replica that spans several GPUs or nodes is placed.

    A 2.8T replica on a GB300 NVL72 rack is 72 one-GPU bundles, PACK, pinned to
    one NVLink domain by a node label (`ray start --labels nvlink_domain=...`).
    """

    num_bundles: int = Field(gt=0)
    bundle: dict[str, float] = Field(default_factory=lambda: {"GPU": 1.0, "CPU": 1.0})
    strategy: Literal["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"] = "PACK"
    # Node-label selector applied to every bundle of every replica.
    bundle_label_selector: dict[str, str] = Field(default_factory=dict)
    # One NVLink domain per replica: replica i's bundles all require
    # `{domain_label: domains[i]}`, so a replica never straddles two racks.
    domain_label: str = "nvlink_domain"
    domains: list[str] = Field(default_factory=list)


class ReplicaConfig(_Model):
    """The pool of Ray actors that each hold one target replica."""

    num_replicas: int = Field(1, gt=0)
    num_cpus: float = Field(1.0, ge=0.0)
    num_gpus: float = Field(0.0, ge=0.0)
    placement: PlacementConfig | None = None
    # Restarts of a dead replica actor before the run gives up on it.
    max_restarts: int = Field(3, ge=0)

    @model_validator(mode="after")
    def _one_domain_per_replica(self) -> ReplicaConfig:
        domains = self.placement.domains if self.placement else []
        if domains and len(domains) != self.num_replicas:
            raise ValueError(
                f"placement.domains lists {len(domains)} domain(s) for {self.num_replicas} "
                "replica(s): give exactly one per replica, or none"
            )
        return self


class RayConfig(_Model):
    # None starts a local Ray; "auto" joins the cluster this process runs on.
    address: str | None = None
    num_cpus: int | None = Field(None, gt=0)
    runtime_env: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- output


class OutputConfig(_Model):
    """Where committed dataset versions live."""

    # Local directory or s3://bucket/prefix.
    uri: str
    # S3-compatible endpoint (MinIO, Ceph, a loopback test server); None = AWS.
    endpoint_url: str | None = None
    codec: Literal["bf16", "fp8"] = "bf16"


# --------------------------------------------------------------------------- regenerate


class RegenerateConfig(_Model):
    """How the regeneration stage cuts the corpus into units and drives the replicas."""

    # Regenerate every assistant turn (each given the regenerated history) or only the last.
    turns: Literal["all", "last"] = "all"
    # Unit size: one shard per unit; a retried unit redoes this much work.
    conversations_per_unit: int = Field(64, gt=0)
    # Fix the number of buckets (units) instead of deriving it from the corpus size;
    # keep it fixed across refreshes so unchanged units keep their ids.
    num_buckets: int | None = Field(None, gt=0)
    # Requests per engine call inside a unit.
    batch_size: int = Field(64, gt=0)
    # Units queued per replica (backpressure: hidden states are written by the
    # replica as they are produced and never travel to the driver).
    max_units_in_flight_per_replica: int = Field(2, gt=0)
    # Publish a version after this many finished units or seconds, and at the end.
    commit_every_units: int = Field(16, gt=0)
    commit_every_seconds: float = Field(300.0, gt=0)
    # A unit whose replica died is retried on another one up to this many times.
    max_unit_attempts: int = Field(3, gt=0)
    # A prompt must leave at least this many tokens of context for the answer.
    min_answer_tokens: int = Field(8, gt=0)


# --------------------------------------------------------------------------- top level


class PipelineConfig(_Model):
    """A whole job: what to read, which target, how to run it, where to write."""

    target: TargetConfig
    corpus: CorpusConfig
    generation: GenerationConfig = GenerationConfig()
    replicas: ReplicaConfig = ReplicaConfig()
    ray: RayConfig = RayConfig()
    output: OutputConfig
    regenerate: RegenerateConfig = RegenerateConfig()
    # Free-form run name, used in logs and provenance.
    name: str = "dspark-targets"


def _format_errors(source: str, err: ValidationError) -> str:
    lines = [f"{source}: invalid config ({err.error_count()} problem(s))"]
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"]) or "<top level>"
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown key (typo? remove it or check the spelling)"
        elif item["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], data: Any, source: str = "<dict>") -> M:
    """Validate a mapping as `model`; errors name `source`, the dotted key and the problem."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None


def load_model_yaml(model: type[M], path: str | Path, overrides: dict[str, Any] | None = None) -> M:
    """Read a YAML file as `model`; `overrides` are dotted keys (`replicas.num_replicas`)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    return parse_model(model, data, str(path))


def parse_config(data: dict[str, Any], source: str = "<dict>") -> PipelineConfig:
    """Validate a pipeline config mapping; `source` names it in errors."""
    return parse_model(PipelineConfig, data, source)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Read a pipeline YAML config; `overrides` are dotted keys (`replicas.num_replicas`)."""
    return load_model_yaml(PipelineConfig, path, overrides)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a mapping")
    node[leaf] = value


def dump_config(config: PipelineConfig) -> str:
    """YAML text of a config (defaults included), for provenance and `--dry-run`."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
