"""The capacity arithmetic: storage, objects, data rates, time and training cost of a corpus.

A pure function of its inputs (`plan_capacity`), so every figure can be checked
by hand; docs/cluster.md writes out each formula and the worked example of the
2.8T target. Units: bytes, seconds and FLOPs inside, converted only for display.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from pipeline.plan.figures import Figure
from pipeline.plan.inputs import Assumptions, CorpusStats, TargetStats

BF16 = 2  # bytes per captured value in memory
# vLLM 0.32's default max_num_seqs for the LLM class (EngineArgs
# _get_default_max_num_seqs_and_batched_tokens): 1024 on GPUs of >= 70 GB
# (H100, H200, B200, B300), 256 per CPU worker. The feeder keeps a quarter more.
VLLM_MAX_NUM_SEQS_GPU = 1024
VLLM_MAX_NUM_SEQS_CPU = 256


@dataclass(frozen=True)
class RunShape:
    """What the regeneration config fixes: captured layers, codec, units, commits, placement."""

    num_aux_layers: int  # captured residual streams; the final normed state comes on top
    codec: str
    num_units: int  # buckets: one shard each
    commit_every_units: int
    commit_every_seconds: float
    num_replicas: int
    gpus_per_replica: float
    weight_bytes_per_param: float
    # The replica's host-memory bound on captured rows and what reserves it.
    max_capture_bytes: int
    max_new_tokens: int
    max_model_len: int
    requests_in_flight: int  # what the feeder keeps in the engine (config or engine default)
    units_in_flight: int  # the most units a replica works on at once
    num_encode_workers: int


@dataclass(frozen=True)
class CapacityPlan:
    # storage of one version
    num_samples: int
    num_tokens: float
    num_answer_tokens: float
    raw_bytes_per_token: float  # (k+1) x H x 2
    codec_ratio: Figure
    hidden_state_bytes: float
    token_bytes: float
    shard_footer_bytes: float
    stored_bytes: float
    num_shards: int
    mean_shard_bytes: float
    # data rates (None without a replica throughput)
    replica_tok_s: Figure | None
    captured_tok_s: float | None
    raw_hidden_bytes_per_s: float | None  # per replica, produced in memory
    stored_bytes_per_s: float | None  # per replica, to upload
    encode_mbps_per_core: Figure
    encode_cores: float | None  # per replica
    replica_hours: float | None
    regen_gpu_hours: float | None  # replica-hours x GPUs per replica
    wall_days: float | None
    num_replicas: int
    # requests the capture memory bound lets a replica hold at once
    admitted_requests: int
    # objects written by the run
    num_versions: int
    num_segments: int
    manifest_bytes: float
    num_error_objects: int
    num_objects: int
    # replica memory
    weight_bytes: float | None
    gpu_memory_gb: Figure | None
    replica_hbm_bytes: float | None
    # draft training
    train_tokens: float
    train_positions: float  # drafted block slots (anchors x block size) over all epochs
    train_flops: float | None
    train_gpu_tflops: Figure
    train_gpu_hours: float | None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = asdict(self)
        for key in (
            "codec_ratio",
            "replica_tok_s",
            "encode_mbps_per_core",
            "gpu_memory_gb",
            "train_gpu_tflops",
        ):
            figure = getattr(self, key)
            out[key] = None if figure is None else {"value": figure.value, "source": figure.source}
        return out


def expected_nonempty(num_buckets: int, num_items: int) -> float:
    """Buckets holding at least one of `num_items` conversations hashed uniformly."""
    return num_buckets * (1.0 - (1.0 - 1.0 / num_buckets) ** num_items)


def draft_flops_per_row(
    target: TargetStats, assume: Assumptions, num_aux: int, prompt: float, answer: float
) -> float | None:
    """Training FLOPs of one row for a DFlash/DSpark draft of width H (forward + backward).

    Per drafted slot (anchors x block): 6 x the draft layers' parameters
    (attention 4 H^2 + gated MLP 3 H I), the frozen lm_head (forward and input
    gradient, 4 V H) and the target's logits rebuilt from the stored final state
    (2 V H), plus attention over the context (12 H L c, c the mean context);
    per context token: the trainable fusion Linear(k H -> H) and each layer's
    context K/V projections (6 (k H^2 + 2 L H^2)).
    """
    if target.vocab_size is None:
        return None
    h, v, layers = target.hidden_size, target.vocab_size, assume.draft_layers
    inter = target.intermediate_size or 3 * h
    layer_params = 4 * h * h + 3 * h * inter
    slots = min(assume.num_anchors, answer) * assume.block_size
    context = prompt + answer / 2
    per_slot = 6 * layers * layer_params + 6 * v * h + 12 * h * layers * context
    per_token = 6 * (num_aux * h * h + 2 * layers * h * h)
    return slots * per_slot + (prompt + answer) * per_token


def plan_capacity(
    corpus: CorpusStats,
    target: TargetStats,
    shape: RunShape,
    assume: Assumptions,
    *,
    codec_ratio: Figure,
    encode_mbps: Figure,
    replica_tok_s: Figure | None,
    gpu_memory_gb: Figure | None,
    train_gpu_tflops: Figure,
) -> CapacityPlan:
    warnings: list[str] = []
    size = _stored_size(corpus, target, shape, assume, codec_ratio)
    rate = _regeneration_rate(size, shape, assume, codec_ratio, encode_mbps, replica_tok_s)
    admitted = _admitted_requests(corpus, shape, size, warnings)
    _check_encode_cores(shape, rate, replica_tok_s, warnings)
    objects = _objects(corpus, shape, assume, size, rate.days)
    weights, hbm = _replica_memory(target, shape, gpu_memory_gb, warnings)
    positions, flops, train_hours = _training(corpus, target, shape, assume, train_gpu_tflops)
    return CapacityPlan(
        num_samples=size.rows,
        num_tokens=size.tokens,
        num_answer_tokens=size.answers,
        raw_bytes_per_token=size.raw_bpt,
        codec_ratio=codec_ratio,
        hidden_state_bytes=size.hidden_bytes,
        token_bytes=size.token_bytes,
        shard_footer_bytes=size.footers,
        stored_bytes=size.stored,
        num_shards=size.shards,
        mean_shard_bytes=size.stored / size.shards,
        replica_tok_s=replica_tok_s,
        captured_tok_s=rate.captured,
        raw_hidden_bytes_per_s=rate.raw_rate,
        stored_bytes_per_s=rate.stored_rate,
        encode_mbps_per_core=encode_mbps,
        encode_cores=rate.cores,
        replica_hours=rate.hours,
        regen_gpu_hours=rate.gpu_hours,
        wall_days=rate.days,
        num_replicas=shape.num_replicas,
        num_versions=objects.versions,
        num_segments=objects.segments,
        manifest_bytes=objects.manifests,
        num_error_objects=objects.errors,
        num_objects=objects.objects,
        weight_bytes=weights,
        gpu_memory_gb=gpu_memory_gb,
        replica_hbm_bytes=hbm,
        admitted_requests=admitted,
        train_tokens=size.tokens * assume.train_epochs,
        train_positions=positions,
        train_flops=flops,
        train_gpu_tflops=train_gpu_tflops,
        train_gpu_hours=train_hours,
        warnings=warnings,
    )


@dataclass(frozen=True)
class _Size:
    """What one version stores: rows, tokens, bytes by part, shards."""

    rows: int
    tokens: float
    answers: float
    raw_bpt: int  # captured bytes per token in memory (aux layers + final, bf16)
    hidden_bytes: float
    token_bytes: float
    shards: int
    footers: float
    stored: float


def _stored_size(
    corpus: CorpusStats,
    target: TargetStats,
    shape: RunShape,
    assume: Assumptions,
    codec_ratio: Figure,
) -> _Size:
    rows = corpus.num_samples
    tokens = rows * (corpus.prompt_tokens + corpus.answer_tokens)
    raw_bpt = (shape.num_aux_layers + 1) * target.hidden_size * BF16
    hidden_bytes = tokens * raw_bpt * codec_ratio.value
    token_bytes = tokens * assume.token_bytes
    shards = max(1, round(expected_nonempty(shape.num_units, corpus.num_conversations)))
    footers = shards * assume.shard_footer_bytes
    return _Size(
        rows=rows,
        tokens=tokens,
        answers=rows * corpus.answer_tokens,
        raw_bpt=raw_bpt,
        hidden_bytes=hidden_bytes,
        token_bytes=token_bytes,
        shards=shards,
        footers=footers,
        stored=hidden_bytes + token_bytes + footers,
    )


@dataclass(frozen=True)
class _Rate:
    """A replica's capture and encode rates, the regeneration's time (None: no tok/s)."""

    captured: float | None = None
    raw_rate: float | None = None
    stored_rate: float | None = None
    cores: float | None = None
    hours: float | None = None
    gpu_hours: float | None = None
    days: float | None = None


def _regeneration_rate(
    size: _Size,
    shape: RunShape,
    assume: Assumptions,
    codec_ratio: Figure,
    encode_mbps: Figure,
    replica_tok_s: Figure | None,
) -> _Rate:
    if replica_tok_s is None:
        return _Rate()
    captured = replica_tok_s.value * size.tokens / size.answers
    raw_rate = captured * size.raw_bpt
    hours = size.answers / replica_tok_s.value / 3600
    return _Rate(
        captured=captured,
        raw_rate=raw_rate,
        stored_rate=raw_rate * codec_ratio.value + captured * assume.token_bytes,
        cores=raw_rate / (encode_mbps.value * 1e6),
        hours=hours,
        gpu_hours=hours * shape.gpus_per_replica if shape.gpus_per_replica else None,
        days=hours / shape.num_replicas / 24,
    )


def _admitted_requests(
    corpus: CorpusStats, shape: RunShape, size: _Size, warnings: list[str]
) -> int:
    """The requests the feeder's capture-memory bound admits at once; warns when they
    fall short of what it keeps in the engine, or a unit's rows outgrow the bound."""
    # The feeder's bound covers the raw rows every request in flight reserves (its
    # prompt + answer budget) and the encoded rows of units not written yet (about
    # half a shard per unit in flight, on average; past half the bound they spill
    # to local disk, so never more than that).
    stored, shards = size.stored, size.shards
    budget = min(corpus.prompt_tokens + shape.max_new_tokens, shape.max_model_len)
    per_request = budget * size.raw_bpt
    unfinished = shape.units_in_flight * stored / shards / 2
    held = min(unfinished, shape.max_capture_bytes / 2)
    admitted = max(0, int((shape.max_capture_bytes - held) // per_request))
    wanted = shape.requests_in_flight
    if admitted < wanted:
        # The smallest bound B with B - min(unfinished, B / 2) >= the reservations.
        reserved = wanted * per_request
        need_mb = math.ceil((reserved + min(unfinished, reserved)) / 2**20)
        warnings.append(
            f"regenerate.max_capture_memory_mb={shape.max_capture_bytes >> 20} admits "
            f"{admitted} request(s) at once (each reserves {budget:.0f} tokens x "
            f"{size.raw_bpt / 1e3:.1f} KB of rows; units not yet written hold ~{held / 1e9:.1f} GB), "
            f"fewer than the {wanted} the feeder keeps in the engine: set it to {need_mb} or "
            "more (host memory of the tray of bundle 0), or lower generation.max_new_tokens "
            "or regenerate.max_requests_in_flight"
        )
    if stored / shards > shape.max_capture_bytes / 2:
        warnings.append(
            f"a unit's encoded rows (~{stored / shards / 1e9:.1f} GB) outgrow half of "
            f"max_capture_memory_mb={shape.max_capture_bytes >> 20} before its shard is written: "
            "they wait in local spill files (regenerate.writeback.spill_dir), so give that disk room for "
            "the units in flight, or lower regenerate.conversations_per_unit"
        )
    return admitted


def _check_encode_cores(
    shape: RunShape, rate: _Rate, replica_tok_s: Figure | None, warnings: list[str]
) -> None:
    """Warns when encoding a replica's rows needs more cores than its encode workers."""
    cores = rate.cores
    if cores is not None and cores > shape.num_encode_workers:
        assert replica_tok_s is not None
        capped = replica_tok_s.value * shape.num_encode_workers / cores
        warnings.append(
            f"encoding needs {cores:.1f} cores per replica but regenerate.writeback.num_encode_workers="
            f"{shape.num_encode_workers}: the codec caps a replica at ~{capped:,.0f} generated "
            f"tok/s; set num_encode_workers to {math.ceil(cores * 1.25)} (and replicas.num_cpus)"
        )


@dataclass(frozen=True)
class _Objects:
    """The versions a run commits and the objects and manifest bytes they leave."""

    versions: int
    segments: int
    manifests: float
    errors: int
    objects: int


def _objects(
    corpus: CorpusStats, shape: RunShape, assume: Assumptions, size: _Size, days: float | None
) -> _Objects:
    shards = size.shards
    # Versions: a commit every `commit_every_units` units or `commit_every_seconds`.
    versions = math.ceil(shards / shape.commit_every_units)
    if days is not None:
        versions = max(versions, math.ceil(days * 86400 / shape.commit_every_seconds))
    versions = min(versions, shards)
    # Manifest format 2 (table/segments.py): a small root per version naming
    # immutable delta segments, merged FANOUT at a time, so each shard entry is
    # written about 1 + log_FANOUT(versions) times and a root stays bounded.
    from pipeline.table.segments import FANOUT

    levels = max(1.0, math.log(max(versions, 1), FANOUT))
    segments = versions + math.ceil(versions / (FANOUT - 1))
    manifests = versions * (
        assume.manifest_base_bytes + 100 * (FANOUT - 1) * levels
    ) + assume.manifest_entry_bytes * shards * (1 + levels)
    errors = 0
    if corpus.num_dropped:
        errors = round(expected_nonempty(shards, corpus.num_dropped))
    # A shard and its sample-id sidecar; a root and its segments per version;
    # `_latest`, the writer lease and the dataset card.
    objects = 2 * shards + versions + segments + 3 + errors
    return _Objects(versions, segments, manifests, errors, objects)


def _replica_memory(
    target: TargetStats, shape: RunShape, gpu_memory_gb: Figure | None, warnings: list[str]
) -> tuple[float | None, float | None]:
    """(the target's weight bytes, a replica's GPU memory bytes); warns when the weights
    leave under 10% of it for the KV cache."""
    weights = hbm = None
    if target.params is not None:
        weights = target.params * shape.weight_bytes_per_param
    if shape.gpus_per_replica and gpu_memory_gb is not None:
        hbm = shape.gpus_per_replica * gpu_memory_gb.value * 1e9
        if weights is not None and weights > 0.9 * hbm:
            warnings.append(
                f"the weights ({weights / 1e12:.1f} TB) leave under 10% of a replica's "
                f"{hbm / 1e12:.1f} TB of GPU memory for the KV cache"
            )
    return weights, hbm


def _training(
    corpus: CorpusStats,
    target: TargetStats,
    shape: RunShape,
    assume: Assumptions,
    train_gpu_tflops: Figure,
) -> tuple[float, float | None, float | None]:
    """(drafted positions trained on over the epochs, training FLOPs, draft GPU-hours)."""
    rows = corpus.num_samples
    flops_row = draft_flops_per_row(
        target, assume, shape.num_aux_layers, corpus.prompt_tokens, corpus.answer_tokens
    )
    train_flops = None if flops_row is None else flops_row * rows * assume.train_epochs
    gpu_hours = None
    if train_flops is not None:
        gpu_hours = train_flops / (train_gpu_tflops.value * 1e12 * assume.train_mfu) / 3600
    slots = min(assume.num_anchors, corpus.answer_tokens) * assume.block_size
    return slots * rows * assume.train_epochs, train_flops, gpu_hours
