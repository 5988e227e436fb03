"""Typed config of a regeneration job: the target, the corpus, the replicas, Ray, the output.

`PipelineConfig` is the whole YAML file of `dspark-targets regenerate`, `refresh`
and `plan`; the target and corpus sections are the stages' own configs
(`targets/config.py`, `corpus/config.py`), `regenerate.writeback` the
write-back's (`replica/writeback.py`) and `cpu_host` the CPU-engine tuning's
(`replica/cpu_host.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from pipeline.config import ConfigModel, dump_yaml, load_model_yaml, parse_model
from pipeline.corpus.config import CorpusConfig
from pipeline.regenerate.replica.cpu_host import CpuHostConfig
from pipeline.regenerate.replica.writeback import WritebackConfig
from pipeline.targets.config import GenerationConfig, TargetConfig


class PlacementConfig(ConfigModel):
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
    # Seconds to wait for every replica's placement group before the run stops
    # with PlacementTimeout (a rack that is full or missing never spills into
    # another). Leave room for an autoscaler to bring up a rack's nodes.
    timeout_s: float = Field(1800.0, gt=0)


class ReplicaConfig(ConfigModel):
    """The pool of Ray actors that each hold one target replica."""

    num_replicas: int = Field(1, gt=0)
    num_cpus: float = Field(1.0, ge=0.0)
    num_gpus: float = Field(0.0, ge=0.0)
    placement: PlacementConfig | None = None
    # Restarts of a dead replica actor before the run gives up on it.
    max_restarts: int = Field(3, ge=0)
    # How long a replica may take to be scheduled and load its engine before
    # the run stops with a named error (a replica that cannot get its
    # resources, or an engine stuck loading, never hangs the job silently).
    start_timeout_s: float = Field(1800.0, gt=0)

    @model_validator(mode="after")
    def _one_domain_per_replica(self) -> ReplicaConfig:
        domains = self.placement.domains if self.placement else []
        if domains and len(domains) != self.num_replicas:
            raise ValueError(
                f"placement.domains lists {len(domains)} domain(s) for {self.num_replicas} "
                "replica(s): give exactly one per replica, or none"
            )
        return self


class RayConfig(ConfigModel):
    # None starts a local Ray; "auto" joins the cluster this process runs on.
    address: str | None = None
    num_cpus: int | None = Field(None, gt=0)
    runtime_env: dict[str, Any] = Field(default_factory=dict)


class OutputConfig(ConfigModel):
    """Where committed dataset versions live."""

    # Local directory or s3://bucket/prefix.
    uri: str
    # S3-compatible endpoint (MinIO, Ceph, a loopback test server); None = AWS.
    endpoint_url: str | None = None
    codec: Literal["bf16", "fp8"] = "bf16"


# How far a replica's units in flight may grow past the engine-filling start.
UNIT_GROWTH = 4


class RegenerateConfig(ConfigModel):
    """How the regeneration stage cuts the corpus into units and feeds the replicas."""

    # Regenerate every assistant turn (each given the regenerated history) or only the last.
    turns: Literal["all", "last"] = "all"
    # Unit size: one shard per unit; a retried unit redoes this much work.
    conversations_per_unit: int = Field(64, gt=0)
    # Fix the number of buckets (units) instead of deriving it from the corpus size;
    # keep it fixed across refreshes so unchanged units keep their ids.
    num_buckets: int | None = Field(None, gt=0)
    # Requests a replica keeps in its engine at once, from many units and turns
    # (there is no batch barrier: a finished request's slot is refilled at once).
    # None: the engine's own concurrency (vLLM max_num_seqs) plus a quarter, so
    # the engine never waits for the next request.
    max_requests_in_flight: int | None = Field(None, gt=0)
    # Units a replica works on at once. None: start with enough to fill
    # max_requests_in_flight with one conversation each, plus one, and add one
    # each time the engine would run short of work with those (every request
    # of every unit held is in it: units in their last, long turns), up to
    # four times that. A number: exactly that many.
    max_units_in_flight_per_replica: int | None = Field(None, gt=0)
    # Captured hidden states a replica holds in host memory (rows of requests in
    # flight, reserved at prompt + answer budget; samples waiting to be encoded;
    # encoded rows of units not yet written). Admission waits below this bound.
    max_capture_memory_mb: int = Field(4096, gt=0)
    # Where and with how many workers shards are built, encoded and written
    # (replica/writeback.py); past half the bound above, encoded rows of unfinished units
    # go to its spill_dir.
    writeback: WritebackConfig = WritebackConfig()
    # Publish a version after this many finished units or seconds, and at the end.
    commit_every_units: int = Field(16, gt=0)
    commit_every_seconds: float = Field(300.0, gt=0)
    # A unit whose replica died, or that hit a transient error, is retried
    # (preferably on another replica) up to this many times in all.
    max_unit_attempts: int = Field(3, gt=0)
    # A unit running longer than this, or a replica whose engine completes no
    # step for this long while it has work, is taken for a hung engine: the
    # replica is killed (Ray restarts it) and its units go elsewhere.
    unit_timeout_s: float = Field(7200.0, gt=0)
    replica_stall_timeout_s: float = Field(600.0, gt=0)
    # A prompt must leave at least this many tokens of context for the answer.
    min_answer_tokens: int = Field(8, gt=0)

    @property
    def spill_above_bytes(self) -> int:
        """Encoded rows in memory past which the write-back spills: half the capture bound
        (the rest of a unit waits on disk)."""
        return (self.max_capture_memory_mb << 20) // 2

    def units_in_flight(self, max_requests_in_flight: int) -> int:
        """Units per replica: the configured number, else enough to fill the engine."""
        if self.max_units_in_flight_per_replica is not None:
            return self.max_units_in_flight_per_replica
        return -(-max_requests_in_flight // self.conversations_per_unit) + 1

    def max_units_in_flight(self, max_requests_in_flight: int) -> int:
        """The most units a replica may hold once it asked for more (see the key)."""
        base = self.units_in_flight(max_requests_in_flight)
        return base if self.max_units_in_flight_per_replica is not None else UNIT_GROWTH * base

    def requests_in_flight(self, engine_concurrency: int) -> int:
        if self.max_requests_in_flight is not None:
            return self.max_requests_in_flight
        return engine_concurrency + max(4, engine_concurrency // 4)


class PipelineConfig(ConfigModel):
    """A whole regeneration job: what to read, which target, how to run it, where to write."""

    target: TargetConfig
    corpus: CorpusConfig
    generation: GenerationConfig = GenerationConfig()
    replicas: ReplicaConfig = ReplicaConfig()
    ray: RayConfig = RayConfig()
    output: OutputConfig
    regenerate: RegenerateConfig = RegenerateConfig()
    # Only for a CPU engine on a small host; a GPU config leaves it out (replica/cpu_host.py).
    cpu_host: CpuHostConfig = CpuHostConfig()
    # Free-form run name, used in logs, actor names and provenance.
    name: str = "dspark-targets"


def parse_config(data: dict[str, Any], source: str = "<dict>") -> PipelineConfig:
    """Validate a regeneration config mapping; `source` names it in errors."""
    return parse_model(PipelineConfig, data, source)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Read a regeneration YAML config; `overrides` are dotted keys (`replicas.num_replicas`)."""
    return load_model_yaml(PipelineConfig, path, overrides)


def dump_config(config: PipelineConfig, *, redacted: bool = True) -> str:
    """YAML text of a config (defaults included), for `plan`: secrets masked unless asked."""
    if not redacted:
        return dump_yaml(config)
    import yaml

    from pipeline.redact import redact

    return yaml.safe_dump(redact(config.model_dump(mode="json")), sort_keys=False)
