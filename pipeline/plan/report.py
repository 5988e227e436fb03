"""The capacity plan as a table: each figure with how it was computed or where it came from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.plan.capacity import CapacityPlan, RunShape
    from pipeline.plan.inputs import Assumptions, CorpusStats, TargetStats

# `report` below is a `planner.PlanReport`; not imported, since the planner
# renders itself through this module.

Row = tuple[str, str, str]  # (figure, value, how it was computed or where it came from)


def human_bytes(n: float) -> str:
    for unit, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def human_count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if abs(n) >= size:
            return f"{n / size:,.2f}{unit}"
    return f"{n:,.0f}"


def num(x: float) -> str:
    """1,234 / 12.3 / 0.0123: three significant figures below 100."""
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _rows(report: Any) -> list[Row]:
    c, t, a, s, p = report.corpus, report.target, report.assume, report.shape, report.capacity
    assert c is not None and t is not None and s is not None and p is not None
    return [
        *_input_rows(c, t, s, p),
        *_storage_rows(t, a, s, p),
        *_replica_rows(s, p),
        *_memory_rows(s, p),
        *_training_rows(a, p),
    ]


def _input_rows(c: CorpusStats, t: TargetStats, s: RunShape, p: CapacityPlan) -> list[Row]:
    """The corpus, target, captured layers and replicas the plan is for."""
    rows: list[Row] = [("inputs", "", "")]
    rows.append(
        (
            "corpus",
            f"{c.num_conversations:,} conversations, {c.num_samples:,} samples; per sample "
            f"{c.prompt_tokens:,.1f} prompt + {c.answer_tokens:,.1f} answer tokens",
            c.source,
        )
    )
    if c.num_dropped:
        rows.append(("  dropped rows", f"{c.num_dropped:,}", "prompt_too_long and later turns"))
    active = f" ({human_count(t.active_params)} active)" if t.active_params else ""
    params = f", {human_count(t.params)} params{active}" if t.params else ""
    vocab = f", vocab {t.vocab_size:,}" if t.vocab_size else ""
    rows.append(
        ("target", f"hidden {t.hidden_size:,}, {t.num_layers} layers{params}{vocab}", t.source)
    )
    rows.append(
        (
            "captured",
            f"{s.num_aux_layers} aux layers + the final state = {s.num_aux_layers + 1} x "
            f"{t.hidden_size:,}, codec {s.codec}",
            "config: target.aux_layer_ids (default: DFlash spacing), output.codec",
        )
    )
    tok_s = p.replica_tok_s
    rows.append(
        (
            "replicas",
            f"{s.num_replicas} x "
            + (f"{s.gpus_per_replica:g} GPUs" if s.gpus_per_replica else "CPU")
            + (f", {tok_s.value:,.0f} generated tok/s each" if tok_s else ""),
            tok_s.source if tok_s else "config: replicas",
        )
    )
    return rows


def _storage_rows(t: TargetStats, a: Assumptions, s: RunShape, p: CapacityPlan) -> list[Row]:
    """What one version stores: bytes by part, shards, manifests, objects."""
    rows: list[Row] = [("storage per version", "", "")]
    rows.append(("tokens", human_count(p.num_tokens), "samples x (prompt + answer)"))
    rows.append(
        (
            "raw hidden states / token",
            human_bytes(p.raw_bytes_per_token),
            f"{s.num_aux_layers + 1} states x {t.hidden_size:,} x 2 B (bf16)",
        )
    )
    rows.append(
        (
            "hidden states stored",
            human_bytes(p.hidden_state_bytes),
            f"tokens x raw x {p.codec_ratio.value:.4f} ({p.codec_ratio.source})",
        )
    )
    rows.append(
        ("tokens stored", human_bytes(p.token_bytes), f"tokens x {a.token_bytes:g} B (ids, mask)")
    )
    rows.append(("total stored", human_bytes(p.stored_bytes), "+ one Parquet footer per shard"))
    rows.append(
        (
            "shards",
            f"{p.num_shards:,} of {human_bytes(p.mean_shard_bytes)}",
            f"one per unit ({s.num_units:,} buckets)",
        )
    )
    rows.append(
        (
            "manifests",
            f"{p.num_versions:,} versions, {human_bytes(p.manifest_bytes)}",
            f"a commit every {s.commit_every_units} units or {s.commit_every_seconds:g} s",
        )
    )
    rows.append(
        (
            "objects",
            f"{p.num_objects:,}",
            f"2 x {p.num_shards:,} shards and sidecars + {p.num_versions:,} roots + "
            f"{p.num_segments:,} segments + 3 (_latest, lease, card) + "
            f"{p.num_error_objects} error files",
        )
    )
    return rows


def _replica_rows(s: RunShape, p: CapacityPlan) -> list[Row]:
    """A replica's requests in flight, data rates and (with a tok/s) the run's time."""
    rows: list[Row] = [("per replica", "", "")]
    rows.append(
        (
            "requests in flight",
            f"{p.admitted_requests:,} admitted by the capture memory bound",
            f"wanted {s.requests_in_flight:,}; max_capture_memory_mb {s.max_capture_bytes >> 20:,}",
        )
    )
    if p.captured_tok_s is not None:
        assert p.raw_hidden_bytes_per_s is not None and p.stored_bytes_per_s is not None
        rows.append(("captured tok/s", f"{p.captured_tok_s:,.0f}", "generated x tokens / answer"))
        rows.append(
            (
                "hidden states produced",
                f"{human_bytes(p.raw_hidden_bytes_per_s)}/s",
                "raw bf16, all through one node (rank 0's capture spool)",
            )
        )
        rows.append(
            (
                "encode cores",
                num(p.encode_cores),
                f"at {p.encode_mbps_per_core.value:,.0f} MB/s per core "
                f"({p.encode_mbps_per_core.source})",
            )
        )
        rate = p.stored_bytes_per_s
        rows.append(
            (
                "upload",
                f"{human_bytes(rate)}/s ({rate * 8 / 1e9:,.2f} Gbit/s)",
                f"all replicas: {human_bytes(rate * s.num_replicas)}/s "
                f"({rate * 8 * s.num_replicas / 1e9:,.1f} Gbit/s)",
            )
        )
        rows.append(("time", "", ""))
        rows.append(("replica-hours", num(p.replica_hours), "answer tokens / generated tok/s"))
        if p.regen_gpu_hours is not None:
            rows.append(
                (
                    "regeneration GPU-hours",
                    num(p.regen_gpu_hours),
                    f"replica-hours x {s.gpus_per_replica:g} GPUs per replica",
                )
            )
        rows.append(("wall days", num(p.wall_days), f"on {s.num_replicas} replica(s)"))
    return rows


def _memory_rows(s: RunShape, p: CapacityPlan) -> list[Row]:
    """The weights against a replica's GPU memory (nothing when either is unknown)."""
    rows: list[Row] = []
    if p.weight_bytes is not None and p.replica_hbm_bytes and p.gpu_memory_gb is not None:
        rows.append(("replica memory", "", ""))
        rows.append(
            (
                "weights",
                f"{human_bytes(p.weight_bytes)} of {human_bytes(p.replica_hbm_bytes)} GPU memory",
                f"{s.weight_bytes_per_param:g} B/param; {p.gpu_memory_gb.value:g} GB per GPU "
                f"({p.gpu_memory_gb.source})",
            )
        )
    return rows


def _training_rows(a: Assumptions, p: CapacityPlan) -> list[Row]:
    """The draft's training tokens, drafted positions and GPU-hours."""
    rows: list[Row] = [("draft training", "", "")]
    rows.append(
        (
            "training tokens",
            human_count(p.train_tokens),
            f"{a.train_epochs:g} epoch(s) over every stored token",
        )
    )
    rows.append(
        (
            "drafted positions",
            human_count(p.train_positions),
            f"min({a.num_anchors} anchors, answer) x block {a.block_size} per sample",
        )
    )
    if p.train_gpu_hours is not None:
        assert p.train_flops is not None
        rows.append(
            (
                "draft GPU-hours",
                f"{num(p.train_gpu_hours)} ({p.train_flops:.2e} FLOPs)",
                f"{a.draft_layers}-layer draft at {p.train_gpu_tflops.value:g} TFLOPS "
                f"({p.train_gpu_tflops.source}) x {a.train_mfu:g} MFU",
            )
        )
    return rows


def source_table(by_source: dict[str, dict]) -> list[str]:
    """Per corpus source: conversations, rows, mean tokens (answers: the corpus' own), licence."""
    width = max(len(name) for name in by_source) + 2
    lines = [
        "corpus sources (tokens: mean per row; answers are the corpus' reference answers)",
        f"  {'source':<{width}}{'convs':>8}{'rows':>8}{'prompt':>9}{'answer':>9}  licence",
    ]
    for name, s in by_source.items():
        prompt = "-" if s["prompt_tokens"] is None else f"{s['prompt_tokens']:.0f}"
        answer = "-" if s["answer_tokens"] is None else f"{s['answer_tokens']:.0f}"
        lines.append(
            f"  {name:<{width}}{s['conversations']:>8,}{s['rows']:>8,}{prompt:>9}{answer:>9}"
            f"  {s.get('licence') or 'not stated'}"
        )
    return lines


def capacity_table(report: Any) -> str:
    lines = [f"capacity plan for {report.config_source}"]
    if report.capacity is not None:
        rows = _rows(report)
        width = max(len(label) for label, value, _ in rows if value) + 2
        value_width = min(60, max(len(value) for _, value, _ in rows))
        for label, value, note in rows:
            if not value:
                lines.append(label)
                continue
            lines.append(f"  {label:<{width}}{value:<{value_width}}  {note}".rstrip())
        if report.assumptions:
            from pipeline.plan.figures import HOW_TO_MEASURE

            lines.append("assumptions (chosen, not measured; a measured figure comes from)")
            key_width = max(len(key) for key, _ in report.assumptions) + 2
            for key, figure in report.assumptions:
                lines.append(
                    f"  {key:<{key_width}}{figure.value:<12,g}{figure.source}: "
                    f"{HOW_TO_MEASURE.get(key, 'a measurement of your own')}"
                )
        if report.capacity.warnings:
            lines.append("warnings")
            lines += [f"  - {w}" for w in report.capacity.warnings]
    if report.corpus is not None and report.corpus.by_source:
        lines += source_table(report.corpus.by_source)
    if report.missing:
        lines.append("not computed, for want of")
        lines += [f"  - {m}" for m in report.missing]
    return "\n".join(lines)


def comparison_table(comparison: dict) -> str:
    lines = [
        f"prediction against {comparison['uri']} (version {comparison['version']})",
        f"  {'':<14}{'predicted':>16}{'measured':>16}{'ratio':>8}",
    ]
    for name, row in comparison["figures"].items():
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        lines.append(f"  {name:<14}{row['predicted']:>16,.0f}{row['measured']:>16,.0f}{ratio:>8}")
    return "\n".join(lines)
