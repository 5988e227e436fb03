"""Typed configuration of the evaluation stage (`dspark-targets evaluate --config ...`).

Same conventions as the training config: pydantic models, frozen, unknown
keys rejected; `load_eval_config` names the file, the dotted key and the
problem. Paths of drafts are training run directories, checkpoints or
speculators exports (see pipeline/drafts/load.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from pipeline.config import ConfigModel, load_model_yaml, parse_model
from pipeline.drafts.registry import serving_kind


def _known_method(method: str) -> str:
    serving_kind(method)
    return method


# A vLLM speculative method that serves a draft kind of pipeline/drafts/registry.py.
VllmMethod = Annotated[str, AfterValidator(_known_method)]


class EvalDataConfig(ConfigModel):
    """Which samples to evaluate on: the held-out split of a committed dataset version."""

    # Dataset root (local or s3://); None: the training data of the first trained draft.
    uri: str | None = None
    version: int | None = Field(None, ge=0)
    endpoint_url: str | None = None
    # Held-out share by sample-id hash; None: the smallest of the drafts' training
    # values. Must not exceed any draft's (else some evaluated samples were trained on).
    heldout_fraction: float | None = Field(None, gt=0.0, lt=1.0)
    # Keep only these domains; empty keeps all.
    domains: list[str] = Field(default_factory=list)
    # Keep only these corpus sources (empty: all), or leave these out.
    sources: list[str] = Field(default_factory=list)
    exclude_sources: list[str] = Field(default_factory=list)
    # heldout: the held-out split by sample-id hash. all: every row of `sources`, which
    # every trained draft must have left out of training (its data.exclude_sources):
    # the out-of-source figures.
    split: Literal["heldout", "all"] = "heldout"
    # Cap on evaluated samples, drawn evenly over the split by sample-id hash; None: all.
    max_samples: int | None = Field(None, gt=0)
    # The offline T=0 walk is exact acceptance only on the target's greedy output
    # stored losslessly (provenance generation.temperature 0, a lossless codec);
    # other data is refused unless this is true, and then the report calls its
    # T=0 tau teacher-forced agreement.
    report_as_teacher_forced: bool = False

    @model_validator(mode="after")
    def _all_needs_sources(self) -> EvalDataConfig:
        if self.split == "all" and not self.sources:
            raise ValueError(
                "split: all evaluates every row of `sources`: name the source(s) left out of training"
            )
        return self


class DraftEntry(ConfigModel):
    """One draft to evaluate (a row of the report)."""

    name: str = Field(min_length=1)
    # Training run dir, checkpoint dir, or speculators export. None: listed in the
    # report as not available (with `note`), e.g. a baseline the project cannot train yet.
    path: str | None = None
    # Same architecture as `path`, fresh seeded weights: the floor.
    untrained: bool = False
    # False: the backbone alone (Markov and confidence heads off), which is what
    # vLLM's dflash method serves for a DSpark draft's backbone export.
    use_heads: bool = True
    note: str | None = None

    @model_validator(mode="after")
    def _untrained_needs_path(self) -> DraftEntry:
        if self.untrained and self.path is None:
            raise ValueError(
                "untrained: true copies the architecture of `path`: set path to a trained draft"
            )
        return self


class LiveConfig(ConfigModel):
    """The live loop with rejection sampling (temperatures > 0), HF reference target."""

    temperatures: list[float] = Field(default_factory=lambda: [1.0])
    # Prompts (first turns of held-out samples, round-robin over domains).
    num_prompts: int = Field(12, gt=0)
    max_new_tokens: int = Field(128, gt=0)
    # Decodes per prompt (fresh random draws each): more rounds, a tighter interval.
    samples_per_prompt: int = Field(1, gt=0)

    @model_validator(mode="after")
    def _positive(self) -> LiveConfig:
        if any(t <= 0 for t in self.temperatures):
            raise ValueError(
                "live.temperatures must be > 0: temperature 0 is measured exactly offline"
            )
        return self


class CalibrationConfig(ConfigModel):
    """Confidence head: ECE/AUC, sequential temperature scaling, truncation thresholds."""

    enabled: bool = True
    # Share of held-out samples (by a second hash) that fits the temperatures;
    # ECE/AUC and truncation are reported on the rest.
    fit_fraction: float = Field(0.5, gt=0.0, lt=1.0)
    # Write confidence_calibration.json beside each draft's export directory.
    store: bool = True
    thresholds: list[float] = Field(default_factory=lambda: [0.3, 0.5, 0.7, 0.9])
    # The sampling temperature the draft will serve at: the temperatures are fitted
    # on acceptance events drawn at it (0: the exact offline walk; > 0: the live
    # loop's rejection-sampling verdicts), and the stored file records it.
    temperature: float = Field(0.0, ge=0.0)
    # Live-loop prompts per split when temperature > 0 (fit / report halves).
    num_prompts: int = Field(64, gt=0)
    max_new_tokens: int = Field(128, gt=0)


class VllmCheckConfig(ConfigModel):
    """Serve a draft with vLLM and compare its acceptance counters to the offline tau (T=0)."""

    # Name of a draft in `drafts`. vLLM's CPU build runs dflash and eagle3: a DSpark
    # draft is served through its DFlash export (trained in the fill-in layout), its
    # heads included through the project's vLLM plugin.
    draft: str
    # None: the export's speculators_model_type (the only method that serves it).
    method: VllmMethod | None = None
    num_prompts: int = Field(8, gt=0)
    max_tokens: int = Field(160, gt=0)
    # |tau_vllm - tau_offline| / tau_offline must not exceed this.
    tolerance: float = Field(0.03, gt=0.0)
    gpu_memory_utilization: float = Field(0.2, gt=0.0, le=1.0)
    max_model_len: int = Field(1024, gt=0)
    timeout_s: float = Field(900, gt=0)


class ServedDraft(ConfigModel):
    """One draft the serving benchmark serves (a curve of the plot)."""

    # Name of a draft in `drafts` with an export directory.
    name: str
    # None: the export's speculators_model_type. vLLM's CPU build serves dflash and
    # eagle3; dspark needs Model Runner V2 (a GPU): on a host without one that curve
    # is reported as not served, so one config runs on both.
    method: VllmMethod | None = None
    # None: the export's speculative_tokens.
    num_speculative_tokens: int | None = Field(None, gt=0)


class IdentityCheckConfig(ConfigModel):
    """T=0: outputs with and without each draft must agree, up to bf16 near-tie flips."""

    enabled: bool = True
    # Prompts decoded one at a time on each engine (the same batching on both sides);
    # None: every served prompt.
    num_prompts: int | None = Field(None, gt=0)
    # At the first divergent position the target's fp32 logits (transformers, shared
    # prefix) decide: both tokens within this many logits of the best is a near-tie
    # flip; otherwise the draft changed the output and the run fails.
    near_tie_tolerance: float = Field(0.5, gt=0.0)


class ServingConfig(ConfigModel):
    """Serving speed in vLLM with and without the drafts (pipeline/evaluate/serving.py)."""

    # Drafts to serve; empty: every draft in `drafts` whose path holds an export.
    drafts: list[ServedDraft] = Field(default_factory=list)
    # Held-out prompts (first turns, round-robin over domains), as the vLLM check picks them.
    num_prompts: int = Field(16, gt=0)
    max_tokens: int = Field(128, gt=0)
    # Requests in flight at each point of the throughput-vs-interactivity curve.
    concurrency: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 8, 16], min_length=1)
    # Each engine's server is started this many times, the engines alternated (start i
    # serves them in an order rotated by i); the single stream is measured on every
    # start, the sweep on the first. The plain engine's second start is the identity
    # check's plain-against-plain control.
    server_starts: int = Field(3, gt=0)
    # Adaptive drafting (the project's vLLM plugin): the requests in flight at which
    # verifying a token costs as much as generating one; None: every drafted token sent.
    adaptive_requests: float | None = Field(None, gt=0.0)
    # Requests per level: max(num_prompts, this x concurrency), prompts cycled, so
    # every level keeps its slots full for a while.
    requests_per_slot: int = Field(2, gt=0)
    temperature: float = Field(0.0, ge=0.0)
    # True: every request generates max_tokens (equal lengths across engines).
    ignore_eos: bool = False
    num_warmups: int = Field(1, ge=0)
    identity: IdentityCheckConfig = IdentityCheckConfig()
    # Engine: one OpenAI-compatible vLLM server per (target, draft), reused across levels.
    dtype: str = "bfloat16"
    max_model_len: int = Field(2048, gt=0)
    # None: vLLM's default on a GPU, 0.2 on vLLM's CPU backend (where it is the
    # share of host RAM reserved for the KV cache, refused past what is free).
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    enforce_eager: bool = False
    # Further server flags, e.g. {tensor-parallel-size: 8}.
    engine_args: dict[str, str | int | float | bool] = Field(default_factory=dict)
    engine_timeout_s: float = Field(900, gt=0)

    @model_validator(mode="after")
    def _levels(self) -> ServingConfig:
        if any(c <= 0 for c in self.concurrency) or len(set(self.concurrency)) != len(
            self.concurrency
        ):
            raise ValueError(
                f"serving.concurrency {self.concurrency}: give distinct positive request counts"
            )
        if self.identity.enabled and self.temperature > 0:
            raise ValueError(
                "serving.identity compares greedy outputs: set serving.temperature: 0 or "
                "serving.identity.enabled: false"
            )
        return self


class EvalConfig(ConfigModel):
    """A whole evaluation run."""

    # The target (HF directory, hub name or `toy:<name>`): the drafts' verifier.
    target: str
    drafts: list[DraftEntry] = Field(min_length=1)
    # Where report.json, report.md and the PNG plots go.
    out_dir: str
    data: EvalDataConfig = EvalDataConfig()
    # None: no live loop (temperature 0 only).
    live: LiveConfig | None = None
    calibration: CalibrationConfig = CalibrationConfig()
    # None: no vLLM cross-check.
    vllm: VllmCheckConfig | None = None
    # None: no serving benchmark.
    serving: ServingConfig | None = None
    seed: int = 0
    # Torch intra-op threads; 1 avoids OpenMP spin-waiting on small shared machines.
    num_threads: int | None = Field(1, gt=0)

    @model_validator(mode="after")
    def _names(self) -> EvalConfig:
        names = [d.name for d in self.drafts]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"draft names must be unique; repeated: {dupes}")
        if self.vllm is not None and self.vllm.draft not in names:
            raise ValueError(f"vllm.draft {self.vllm.draft!r} is not one of the drafts {names}")
        served = [d.name for d in self.serving.drafts] if self.serving else []
        unknown = [n for n in served if n not in names]
        if unknown:
            raise ValueError(f"serving.drafts {unknown} are not among the drafts {names}")
        if not any(d.path for d in self.drafts):
            raise ValueError("no draft has a path: nothing to evaluate")
        return self

    def served_drafts(self) -> list[str]:
        """The drafts the serving benchmark serves: those named in `serving.drafts`, else
        every trained (not `untrained`) draft with a path, one name per path."""
        if self.serving is None:
            return []
        if self.serving.drafts:
            return [d.name for d in self.serving.drafts]
        seen, names = set(), []
        for d in self.drafts:
            if d.path is not None and not d.untrained and d.path not in seen:
                seen.add(d.path)
                names.append(d.name)
        return names


def parse_eval_config(data: dict[str, Any], source: str = "<dict>") -> EvalConfig:
    """Validate a mapping; `source` names it in errors."""
    return parse_model(EvalConfig, data, source)


def load_eval_config(path: str | Path, overrides: dict[str, Any] | None = None) -> EvalConfig:
    """Read an evaluation YAML; `overrides` are dotted keys (`live.num_prompts`)."""
    return load_model_yaml(EvalConfig, path, overrides)
