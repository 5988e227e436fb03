"""The training loop: one process, or many Ray Train workers, same code.

`train(config)` runs `run_worker` in this process (num_workers == 1) or in a
Ray Train `TorchTrainer` (gloo on CPU, NCCL on GPU). The worker:

* validates the dataset against the target and draft before step 0;
* AdamW, linear warmup + cosine, gradient clipping; bf16 autocast on GPU,
  fp32 on CPU;
* normalises the loss by the *global* slot weight (all-reduced), so N workers
  compute exactly the gradient of one worker with the same global batch;
* checkpoints model, optimiser, scheduler, step and data position atomically
  every `checkpoint_every` steps; a restarted run resumes from the latest one
  and continues the same loss curve;
* logs every step to `<out_dir>/metrics.jsonl` (loss parts, accuracy per block
  position, teacher-forced acceptance length) and a progress bar on rank 0.

Checkpoints and metrics are written by rank 0 to `out_dir`: on a multi-node
cluster that must be a shared filesystem.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.logs import kv
from pipeline.storage import write_text_atomic
from pipeline.threads import torch_threads
from pipeline.train.config import TrainConfig

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "latest"


@dataclass
class TrainResult:
    out_dir: Path
    steps: int  # optimiser steps completed (over all runs of this out_dir)
    metrics: list[dict[str, Any]]  # one per step, from metrics.jsonl
    heldout: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    export_dir: Path | None = None
    dflash_dir: Path | None = None


def lr_lambda(
    step: int, *, num_steps: int, warmup_fraction: float, min_lr_fraction: float
) -> float:
    warmup = int(math.ceil(warmup_fraction * num_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, num_steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return min_lr_fraction + (1.0 - min_lr_fraction) * cosine


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    pointer = Path(out_dir) / CHECKPOINTS / LATEST
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not (path / "state.pt").exists():
        raise FileNotFoundError(f"{pointer} names {path}, which has no state.pt")
    return path


def save_checkpoint(
    out_dir: Path, step: int, state: dict[str, Any], spec_json: str, config_yaml: str
) -> Path:
    """Write checkpoints/step-N/ via a temporary directory, then move `latest`."""
    import torch

    root = Path(out_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".step-{step:08d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "spec.json").write_text(spec_json)
    (tmp / "config.yaml").write_text(config_yaml)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_text_atomic(root / LATEST, final.name)
    return final


def teacher_logits(model, batch) -> torch.Tensor:
    """(R, Nb, B, V) the target's logits for the token each block slot drafts, rebuilt
    from the stored post-norm final hidden states through the frozen lm_head."""
    r, nb, b = batch.teacher_index.shape
    idx = batch.teacher_index.view(r, nb * b, 1).expand(-1, -1, batch.last_hidden.shape[-1])
    return model.target_logits(batch.last_hidden.gather(1, idx)).view(r, nb, b, -1)


def train(
    config: TrainConfig, *, stop_after: int | None = None, export: bool = True
) -> TrainResult:
    """Train (or resume) per `config`; export the final draft when `export`.

    `stop_after` ends this run after that many total steps (the schedule still
    spans `num_steps`): how tests and users simulate an interrupted run.
    """
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config.num_workers > 1 or config.use_ray:
        _train_ray(config, stop_after)
    else:
        with torch_threads(config.num_threads):
            run_worker(config.model_dump(mode="json"), stop_after=stop_after)
    summary = json.loads((out_dir / "summary.json").read_text())
    result = TrainResult(
        out_dir=out_dir,
        steps=summary["steps"],
        metrics=read_metrics(out_dir),
        heldout=summary.get("heldout", {}),
        checkpoint=latest_checkpoint(out_dir),
    )
    if export and result.steps >= config.num_steps:
        from pipeline.train.export import export_checkpoint

        paths = export_checkpoint(
            result.checkpoint,
            Path(config.export.dir) if config.export.dir else out_dir / "export",
            dflash_backbone=config.export.dflash_backbone,
        )
        result.export_dir = paths.draft
        result.dflash_dir = paths.dflash_backbone
    return result


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(out_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _train_ray(config: TrainConfig, stop_after: int | None) -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if not ray.is_initialized():
        ray.init(address=config.ray.address, num_cpus=config.ray.num_cpus, include_dashboard=False)
    resources = {"CPU": config.ray.num_cpus_per_worker}
    if config.use_gpu:
        resources["GPU"] = 1
    trainer = TorchTrainer(
        _ray_loop,
        train_loop_config={"config": config.model_dump(mode="json"), "stop_after": stop_after},
        scaling_config=ScalingConfig(
            num_workers=config.num_workers, use_gpu=config.use_gpu, resources_per_worker=resources
        ),
        torch_config=TorchConfig(backend="nccl" if config.use_gpu else "gloo"),
        run_config=RunConfig(
            name="dspark-train", storage_path=str((Path(config.out_dir) / "ray").resolve())
        ),
    )
    trainer.fit()


def _ray_loop(loop_config: dict[str, Any]) -> None:
    with torch_threads(loop_config["config"].get("num_threads")):
        run_worker(loop_config["config"], stop_after=loop_config["stop_after"], distributed=True)


def run_worker(
    config_data: dict[str, Any], *, stop_after: int | None = None, distributed: bool = False
) -> None:
    """One worker's whole run (rank and world size come from torch.distributed)."""
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from pipeline.prefetch import prefetched
    from pipeline.targets.resolve import resolve_model
    from pipeline.train.data import DataPosition, TrainingData, iter_batches
    from pipeline.train.eagle3 import build_draft
    from pipeline.train.loss import BlockStats, block_stats, draft_loss, summarize
    from pipeline.train.model import load_target_head, resolve_spec

    config = TrainConfig.model_validate(config_data)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if config.use_gpu:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if distributed
            else torch.device("cuda")
        )
    else:
        device = torch.device("cpu")
    out_dir = Path(config.out_dir)

    target_dir = Path(resolve_model(config.target))
    target_config = json.loads((target_dir / "config.json").read_text())
    data = TrainingData(config.data)
    data.check(
        target=config.target, target_config=target_config, aux_layer_ids=config.draft.aux_layer_ids
    )
    mask_id = config.draft.mask_token_id
    if mask_id is None and config.draft.kind == "eagle3":
        mask_id = 0  # EAGLE-3 feeds real tokens only; the id is never embedded
    if mask_id is None:
        mask_id = AutoTokenizer.from_pretrained(target_dir).mask_token_id
        if mask_id is None:
            raise ValueError(
                f"{target_dir}: the tokenizer has no mask token; set draft.mask_token_id "
                "to an id whose embedding the draft may use for mask slots"
            )
    spec = resolve_spec(target_dir, config.draft, data.provenance.aux_layer_ids, mask_id)
    embed, head = load_target_head(target_dir)
    torch.manual_seed(config.seed)
    model = build_draft(spec, embed, head).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(
        params,
        lr=config.optim.lr,
        betas=(config.optim.beta1, config.optim.beta2),
        weight_decay=config.optim.weight_decay,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim,
        lambda s: lr_lambda(
            s,
            num_steps=config.num_steps,
            warmup_fraction=config.optim.warmup_fraction,
            min_lr_fraction=config.optim.min_lr_fraction,
        ),
    )
    step, position = 0, DataPosition(0, 0)
    ckpt = latest_checkpoint(out_dir)
    if ckpt is not None:
        state = torch.load(ckpt / "state.pt", map_location=device, weights_only=True)
        saved_spec = json.loads((ckpt / "spec.json").read_text())
        if saved_spec != json.loads(spec.to_json()):
            raise ValueError(
                f"{ckpt}: checkpoint was trained with another draft spec than this config"
            )
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step = state["step"]
        position = DataPosition(**state["position"][rank if config.data.split == "shards" else 0])
        if rank == 0:
            log.info("resumed %s", kv(checkpoint=ckpt, step=step, epoch=position.epoch))
    if rank == 0:
        _truncate_metrics(out_dir, step)

    net = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[device.index] if config.use_gpu else None)

    weights = step_weights(spec, config.loss).to(device)
    ce_w, tv_w, bce_w = config.loss.weights(spec.kind)
    kl_w = config.loss.kl(spec.kind)
    batches = prefetched(
        iter_batches(
            data,
            spec,
            seed=config.seed,
            global_batch_size=config.global_batch_size,
            rank=rank,
            world_size=world,
            start=position,
        ),
        config.data.prefetch,
    )
    last = stop_after if stop_after is not None else config.num_steps
    last = min(last, config.num_steps)
    progress = None
    if rank == 0:
        from tqdm import tqdm

        progress = tqdm(total=config.num_steps, initial=step, desc="train", disable=None)
    spec_json = spec.to_json()
    from pipeline.train.config import dump_train_config

    config_yaml = dump_train_config(config)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=config.use_gpu)
    while step < last:
        started = time.perf_counter()
        batch, position = next(batches)
        batch = batch.to(device)
        local_w = (weights * batch.valid).sum()
        global_w = local_w.detach().clone()
        if distributed:
            dist.all_reduce(global_w)
        with autocast:
            out = net(batch.inputs)
        with torch.no_grad():
            teacher = teacher_logits(model, batch)
        parts = draft_loss(
            logits=out.logits,
            target_logits=teacher,
            target_ids=batch.target_ids,
            valid=batch.valid,
            weights=weights,
            confidence_logit=out.confidence_logit,
            ce_weight=ce_w,
            tv_weight=tv_w,
            bce_weight=bce_w,
            normalizer=global_w,
            kl_weight=kl_w,
        )
        optim.zero_grad(set_to_none=True)
        # DDP averages gradients over workers; each worker holds local_sum/global_w.
        (parts.total * world).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.optim.grad_clip)
        lr = sched.get_last_lr()[0]
        optim.step()
        sched.step()
        step += 1
        stats = block_stats(
            logits=out.logits.detach(),
            target_ids=batch.target_ids,
            valid=batch.valid,
            tv=parts.tv,
            first_offset=spec.first_offset,
        )
        sums = torch.cat(
            [
                torch.stack(
                    [parts.ce_sum, parts.tv_sum, parts.bce_sum, local_w.detach(), parts.kl_sum]
                ).float(),
                torch.tensor(
                    [batch.num_samples, batch.num_tokens], dtype=torch.float32, device=device
                ),
                stats.vector().float(),
            ]
        )
        if distributed:
            dist.all_reduce(sums)
        if rank == 0:
            ce, tv, bce, wsum, kl, samples, tokens = (float(x) for x in sums[:7])
            wsum = max(wsum, 1e-8)
            row = {
                "step": step,
                "lr": lr,
                "loss": (ce_w * ce + tv_w * tv + bce_w * bce + kl_w * kl) / wsum,
                "ce": ce / wsum,
                "tv": tv / wsum,
                "bce": bce / wsum,
                "kl": kl / wsum,
                "grad_norm": float(grad_norm),
                "samples": int(samples),
                "tokens": int(tokens),
                "epoch": position.epoch,
                "seconds": time.perf_counter() - started,
            }
            row.update(
                summarize(
                    stats=BlockStats.from_vector(sums[7:].cpu(), spec.block_size),
                    first_offset=spec.first_offset,
                )
            )
            with open(out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            if step % config.log_every == 0 or step == last:
                log.info(
                    "step %s",
                    kv(
                        step=step,
                        loss=row["loss"],
                        ce=row["ce"],
                        tv=row["tv"],
                        tau_tv=row["tau_tv"],
                        lr=lr,
                    ),
                )
            progress.update(1)
            progress.set_postfix(loss=f"{row['loss']:.3f}", tau=f"{row['tau_tv']:.2f}")
        if step % config.checkpoint_every == 0 or step == last:
            positions = [position.__dict__]
            if distributed and config.data.split == "shards":
                gathered: list[Any] = [None] * world
                dist.all_gather_object(gathered, position.__dict__)
                positions = gathered
            if rank == 0:
                state = {
                    "model": model.state_dict(),
                    "optimizer": optim.state_dict(),
                    "scheduler": sched.state_dict(),
                    "step": step,
                    "position": positions,
                }
                save_checkpoint(out_dir, step, state, spec_json, config_yaml)
            if distributed:
                dist.barrier()
    if progress is not None:
        progress.close()
    if rank == 0:
        heldout = {}
        if step >= config.num_steps:
            heldout = evaluate_heldout(model, data, spec, config, device)
        write_text_atomic(
            out_dir / "summary.json", json.dumps({"steps": step, "heldout": heldout}, indent=2)
        )


def evaluate_heldout(
    model, data, spec, config: TrainConfig, device, limit: int = 64
) -> dict[str, float]:
    """Teacher-forced metrics on the held-out split (never trained on)."""
    import torch

    from pipeline.train.data import heldout_batches
    from pipeline.train.loss import BlockStats, block_stats, draft_loss, summarize

    weights = step_weights(spec, config.loss).to(device)
    total: torch.Tensor | None = None
    count = 0
    model.eval()
    with torch.no_grad():
        for batch in heldout_batches(data, spec, seed=config.seed, batch_size=8, limit=limit):
            batch = batch.to(device)
            out = model(batch.inputs)
            teacher = teacher_logits(model, batch)
            parts = draft_loss(
                logits=out.logits,
                target_logits=teacher,
                target_ids=batch.target_ids,
                valid=batch.valid,
                weights=weights,
                confidence_logit=None,
                ce_weight=1,
                tv_weight=0,
                bce_weight=0,
            )
            vec = block_stats(
                logits=out.logits,
                target_ids=batch.target_ids,
                valid=batch.valid,
                tv=parts.tv,
                first_offset=spec.first_offset,
            ).vector()
            total = vec if total is None else total + vec
            count += batch.num_samples
    model.train()
    if total is None:
        return {}
    out = summarize(
        stats=BlockStats.from_vector(total.cpu(), spec.block_size), first_offset=spec.first_offset
    )
    out["samples"] = count
    return out


def step_weights(spec, loss_config):
    """(B,) loss weight per block slot: exp(-(k-1)/gamma) (DSpark/DFlash), or
    EAGLE-3's decay**s over the unrolled steps s (eagle3)."""
    from pipeline.train.loss import slot_weights, ttt_step_weights

    if spec.kind == "eagle3":
        return ttt_step_weights(num_steps=spec.block_size, decay=loss_config.ttt_step_decay)
    return slot_weights(
        block_size=spec.block_size, first_offset=spec.first_offset, gamma=loss_config.gamma
    )


def _truncate_metrics(out_dir: Path, step: int) -> None:
    """Drop metric rows past the resumed step (written after the last checkpoint)."""
    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return
    rows = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line)["step"] <= step
    ]
    write_text_atomic(path, "".join(r + "\n" for r in rows))


def summary_lines(result: TrainResult) -> list[str]:
    """A short human-readable report of a run (what `jobs.train` and the CLI print)."""
    lines = [f"trained {result.steps} steps -> {result.out_dir}"]
    if result.metrics:
        first, last = result.metrics[0], result.metrics[-1]
        lines.append(
            f"loss {first['loss']:.3f} -> {last['loss']:.3f}; "
            f"teacher-forced tau {first['tau_tv']:.2f} -> {last['tau_tv']:.2f} (last batch)"
        )
    if result.heldout:
        h = result.heldout
        lines.append(
            f"held-out ({h['samples']} samples): tau_tv {h['tau_tv']:.2f}, tau_greedy {h['tau_greedy']:.2f}"
        )
    if result.export_dir:
        lines.append(f"draft (speculators format): {result.export_dir}")
    if result.dflash_dir:
        lines.append(f"DFlash backbone (serves on vLLM CPU): {result.dflash_dir}")
    return lines
