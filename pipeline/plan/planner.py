"""`dspark-targets plan`: gather the planner's inputs, run the arithmetic, show it.

Inputs, later ones overriding earlier ones: what the config itself says (the
codec, captured layers, units, commits, replicas); the corpus and target read
from the config when that needs no network (synthetic or local corpus, a toy or
local target); a planner-inputs file (`--inputs`); inline specs
(`--corpus-stats`, `--target-stats`, `--assume`) and `--replicas`,
`--replica-tok-s`. Figures not given take the project's measured defaults
(`figures.py`, constants naming their benchmark and date; nothing under bench/
is read at run time). A section whose inputs are missing is left out, naming them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.plan import figures
from pipeline.plan.capacity import (
    VLLM_MAX_NUM_SEQS_CPU,
    VLLM_MAX_NUM_SEQS_GPU,
    CapacityPlan,
    RunShape,
    plan_capacity,
)
from pipeline.plan.inputs import (
    Assumptions,
    CorpusStats,
    PlanInputs,
    TargetStats,
    build,
    check_keys,
    load_inputs,
    parse_spec,
)
from pipeline.regenerate.config import PipelineConfig

log = logging.getLogger(__name__)

DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}


@dataclass
class PlanReport:
    config_source: str
    corpus: CorpusStats | None = None
    target: TargetStats | None = None
    assume: Assumptions = field(default_factory=Assumptions)
    shape: RunShape | None = None
    capacity: CapacityPlan | None = None
    missing: list[str] = field(default_factory=list)
    # Figures the plan assumed (given, or an unmeasured default): (Assumptions key, figure).
    assumptions: list[tuple[str, figures.Figure]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config_source,
            "corpus": self.corpus.model_dump() if self.corpus else None,
            "target": self.target.model_dump() if self.target else None,
            "assume": self.assume.model_dump(),
            "run": None if self.shape is None else self.shape.__dict__,
            "capacity": self.capacity.to_dict() if self.capacity else None,
            "missing": self.missing,
            "assumptions": {
                key: {"value": f.value, "source": f.source} for key, f in self.assumptions
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_text(self) -> str:
        from pipeline.plan.report import capacity_table

        return capacity_table(self)


def make_plan(
    config: PipelineConfig,
    config_source: str,
    *,
    inputs_path: str | Path | None = None,
    corpus_spec: str | None = None,
    target_spec: str | None = None,
    assume_spec: str | None = None,
    num_replicas: int | None = None,
    replica_tok_s: float | None = None,
) -> PlanReport:
    """The capacity plan of `config` with whatever inputs are given or can be read."""
    inputs = load_inputs(inputs_path)
    where = str(inputs_path) if inputs_path else "command line"
    report = PlanReport(config_source)
    specs = _checked_specs(inputs, where, corpus_spec, target_spec, assume_spec)
    _read_corpus_and_target(config, inputs, specs, where, report)
    origin = _read_assumptions(inputs, specs, where, replica_tok_s, report)
    if report.corpus is None or report.target is None:
        return report

    report.shape = run_shape(
        config, report.corpus, report.target, report.assume, num_replicas or inputs.num_replicas
    )
    report.capacity = plan_capacity(
        report.corpus,
        report.target,
        report.shape,
        report.assume,
        **_picked_figures(config, report, origin, where),
    )
    if report.capacity.replica_tok_s is None:
        report.missing.append(
            "replica throughput (--replica-tok-s: generated tok/s of one replica, capturing); "
            "no measured figure for this setup, so no data rates or time"
        )
    return report


def _checked_specs(
    inputs: PlanInputs,
    where: str,
    corpus_spec: str | None,
    target_spec: str | None,
    assume_spec: str | None,
) -> dict[str, dict[str, Any]]:
    """The inline specs parsed; their keys and the inputs file's checked per section."""
    specs = {
        "corpus": parse_spec(corpus_spec, "--corpus-stats"),
        "target": parse_spec(target_spec, "--target-stats"),
        "assume": parse_spec(assume_spec, "--assume"),
    }
    for name, model in (("corpus", CorpusStats), ("target", TargetStats), ("assume", Assumptions)):
        check_keys(model, getattr(inputs, name), f"{where}: {name}")
        check_keys(model, specs[name], f"--{name}-stats" if name != "assume" else "--assume")
    return specs


def _read_corpus_and_target(
    config: PipelineConfig,
    inputs: PlanInputs,
    specs: dict[str, dict[str, Any]],
    where: str,
    report: PlanReport,
) -> None:
    """The report's corpus and target stats: the given keys over what a local corpus or
    target reads (None, named in `missing`, when neither has them all)."""
    from pipeline.plan.corpus_stats import corpus_is_local, measure_corpus, measure_target

    given = {**inputs.corpus, **specs["corpus"]}
    report.corpus = _section(
        CorpusStats,
        given,
        where,
        measure=(lambda: measure_corpus(config)) if corpus_is_local(config) else None,
        missing_hint="corpus stats (--corpus-stats num_conversations=..,num_samples=..,"
        "prompt_tokens=..,answer_tokens=..): the corpus is not local",
        report=report,
    )
    given = {**inputs.target, **specs["target"]}
    report.target = _section(
        TargetStats,
        given,
        where,
        measure=(lambda: measure_target(config)) if _target_is_local(config) else None,
        missing_hint="target stats (--target-stats hidden_size=..,num_layers=..,params=..,"
        "vocab_size=..): the target's files are not on this machine",
        report=report,
    )


def _read_assumptions(
    inputs: PlanInputs,
    specs: dict[str, dict[str, Any]],
    where: str,
    replica_tok_s: float | None,
    report: PlanReport,
) -> dict[str, str]:
    """The report's assumptions (file, then --assume, then --replica-tok-s); where each
    given key came from."""
    origin = {key: where for key in inputs.assume} | {key: "--assume" for key in specs["assume"]}
    assume_data = {**inputs.assume, **specs["assume"]}
    if replica_tok_s is not None:
        assume_data["replica_tok_s"] = replica_tok_s
        origin["replica_tok_s"] = "--replica-tok-s"
    report.assume = build(Assumptions, assume_data, f"{where}: assume")
    return origin


def _picked_figures(
    config: PipelineConfig, report: PlanReport, origin: dict[str, str], where: str
) -> dict[str, figures.Figure | None]:
    """The figures plan_capacity takes: each user's figure (an assumption, labelled as
    one) over the project's default; every assumed one listed in `report.assumptions`."""
    assume, shape = report.assume, report.shape
    assert shape is not None
    toy = config.target.model.startswith("toy:")

    def pick(key: str, default: figures.Figure | None) -> figures.Figure | None:
        """The user's figure (an assumption, labelled as one) over the default."""
        value = getattr(assume, key)
        if value is None:
            if default is not None and default.assumed:
                report.assumptions.append((key, default))
            return default
        figure = figures.Figure(value, f"ASSUMPTION, {origin.get(key, 'default')}", True)
        report.assumptions.append((key, figure))
        return figure

    tok_s = pick("replica_tok_s", figures.replica_tok_s(config.target.model, config.target.backend))
    ratio = pick("codec_ratio", figures.codec_ratio(shape.codec, toy))
    encode = pick("encode_mbps_per_core", figures.encode_mbps_per_core(shape.codec))
    assert ratio is not None and encode is not None
    memory = pick("gpu_memory_gb", _gpu_memory(assume, where))
    train_gpu = assume.train_gpu or assume.gpu or figures.DEFAULT_TRAIN_GPU
    tflops = pick("train_gpu_tflops", _train_tflops(assume, train_gpu, where))
    pick("weight_bytes_per_param", None)
    for key in ("train_mfu", "train_epochs"):
        value = getattr(assume, key)
        label = f"ASSUMPTION, {origin.get(key, 'default')}"
        report.assumptions.append((key, figures.Figure(value, label, True)))
    return {
        "codec_ratio": ratio,
        "encode_mbps": encode,
        "replica_tok_s": tok_s,
        "gpu_memory_gb": memory,
        "train_gpu_tflops": tflops,
    }


def _gpu_memory(assume: Assumptions, where: str) -> figures.Figure | None:
    if assume.gpu is None:
        return None
    spec = figures.gpu(assume.gpu, f"{where}: assume.gpu")
    return figures.Figure(spec.memory_gb, f"{assume.gpu.upper()}, NVIDIA datasheet")


def _train_tflops(assume: Assumptions, name: str, where: str) -> figures.Figure:
    spec = figures.gpu(name, f"{where}: assume.train_gpu")
    if assume.train_gpu or assume.gpu:
        return figures.Figure(spec.bf16_tflops, f"{name.upper()} dense BF16, NVIDIA datasheet")
    return figures.Figure(
        spec.bf16_tflops,
        f"ASSUMPTION, default: an {name}, dense BF16",
        True,
    )


def run_shape(
    config: PipelineConfig,
    corpus: CorpusStats,
    target: TargetStats,
    assume: Assumptions,
    num_replicas: int | None,
) -> RunShape:
    """What the regeneration config fixes for the plan."""
    from pipeline.regenerate.driver.partition import num_buckets_for
    from pipeline.targets.resolve import default_aux_layer_ids

    rep, regen = config.replicas, config.regenerate
    aux = config.target.aux_layer_ids or default_aux_layer_ids(target.num_layers)
    if rep.placement is not None:
        gpus = rep.placement.num_bundles * rep.placement.bundle.get("GPU", 0.0)
    else:
        gpus = rep.num_gpus
    concurrency = VLLM_MAX_NUM_SEQS_GPU if gpus else VLLM_MAX_NUM_SEQS_CPU
    requests = regen.requests_in_flight(concurrency)
    return RunShape(
        num_aux_layers=len(aux),
        codec=config.output.codec,
        num_units=regen.num_buckets
        or num_buckets_for(corpus.num_conversations, regen.conversations_per_unit),
        commit_every_units=regen.commit_every_units,
        commit_every_seconds=regen.commit_every_seconds,
        num_replicas=num_replicas or rep.num_replicas,
        gpus_per_replica=gpus,
        weight_bytes_per_param=assume.weight_bytes_per_param
        or DTYPE_BYTES.get(config.target.dtype, 2.0),
        max_capture_bytes=regen.max_capture_memory_mb << 20,
        max_new_tokens=config.generation.max_new_tokens,
        max_model_len=config.target.max_model_len,
        requests_in_flight=requests,
        units_in_flight=regen.max_units_in_flight(requests),
        num_encode_workers=regen.writeback.num_encode_workers,
    )


def _section(model, given, where, *, measure, missing_hint, report):
    """`given` over what `measure` reads (only if `given` is incomplete), validated."""
    required = [name for name, f in model.model_fields.items() if f.is_required()]
    data = dict(given)
    if not all(k in data for k in required):
        if measure is None:
            report.missing.append(missing_hint)
            return None
        measured = measure()
        data = {**measured.model_dump(), **data}
        if given:
            data["source"] = f"{measured.source}; given: {', '.join(sorted(given))}"
    return build(model, data, f"{where}: {model.__name__}")


def _target_is_local(config: PipelineConfig) -> bool:
    model = config.target.model
    return model.startswith("toy:") or Path(model).is_dir()


def compare_with_dataset(
    report: PlanReport, uri: str, *, endpoint_url: str | None = None
) -> dict[str, Any]:
    """Predicted against committed: samples, tokens, bytes, shards, versions, objects."""
    from pipeline.table.dataset import Dataset

    if report.capacity is None:
        raise ValueError("nothing to compare: the plan lacks " + "; ".join(report.missing))
    dataset = Dataset.open(uri, endpoint_url=endpoint_url)
    if dataset.latest_version() is None:
        raise ValueError(f"{dataset.uri}: no committed version to compare with")
    manifest = dataset.manifest()
    # Hidden files are the local store's lock files, not objects of the dataset.
    objects = [o for o in dataset.storage.list("") if not Path(o.key).name.startswith(".")]
    cap = report.capacity
    pairs = {
        "samples": (cap.num_samples, manifest.num_rows),
        "tokens": (cap.num_tokens, manifest.num_tokens),
        "stored_bytes": (cap.stored_bytes, manifest.num_bytes),
        "shards": (cap.num_shards, len(manifest.shards)),
        "versions": (cap.num_versions, len(dataset.versions())),
        "objects": (cap.num_objects, len(objects)),
    }
    return {
        "uri": dataset.uri,
        "version": manifest.version,
        "figures": {
            name: {"predicted": p, "measured": m, "ratio": p / m if m else None}
            for name, (p, m) in pairs.items()
        },
    }
