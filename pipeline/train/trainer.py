"""The training loop: one process, or many Ray Train workers, same code.

`train(config)` runs a `Trainer` in this process (num_workers == 1) or one per
Ray Train worker in a `TorchTrainer` (gloo on CPU, NCCL on GPU). A Trainer is
set up in `__init__` (dataset checked against the target and draft before
step 0, draft built, AdamW + warmup/cosine), `resume`s from the run's latest
checkpoint, and `train()` loops over named steps:

    micro-batches -> forward_backward -> optimizer_step -> log_step -> checkpoint
    ... -> evaluate (held-out split) -> summary.json

* a step is `accumulation_steps` micro-batches of `micro_batch_size` samples
  per worker; gradients accumulate, and are reduced over workers only after
  the last one (DDP `no_sync`, FSDP2 `set_requires_gradient_sync`);
* the loss is normalised by the *global* slot weight of the whole step (all
  micro-batches, all workers, all-reduced first), so k micro-batches equal
  one batch of k times the size and N workers equal one worker;
* the loss is computed in chunks of slots (pipeline/train/objective.py): no
  vocabulary-sized tensor of the whole batch exists;
* `distributed: ddp` or `fsdp` (pipeline/train/distributed.py), checkpoints
  in one format under both;
* `draft.draft_vocab_size`: a reduced draft vocabulary, counted from the
  training split at the start of a fresh run, taken from the checkpoint's spec
  on resume (pipeline/train/vocab.py);
* `precision: bf16` (default on GPU): autocast with fp32 master weights,
  the frozen target tables stored in bf16; gradient clipping;
* checkpoints (pipeline/drafts/checkpoint.py) hold model, optimiser,
  scheduler, step and data position; a restarted run resumes from the latest
  one and continues the same loss curve;
* every step is a row of `<out_dir>/metrics.jsonl` (pipeline/train/metrics.py)
  and a progress bar on rank 0.

What differs between draft kinds (model class, loss weights, slot weights,
mask token) comes from pipeline/drafts/registry.py. Checkpoints and
metrics are written by rank 0 to `out_dir`: on a multi-node cluster that
must be a shared filesystem. (A little over 400 lines: the public entry
point, its result and the loop's named steps read best in one place; metrics,
optimiser, checkpoints, the objective and the data-parallel wrappers live
beside it.)
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.drafts.checkpoint import (
    export_dir,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from pipeline.drafts.registry import draft_kind
from pipeline.logs import kv
from pipeline.table.pins import release_pins, run_pin_prefix, version_pin
from pipeline.torch_threads import torch_threads
from pipeline.train.config import TrainConfig, dump_train_config
from pipeline.train.metrics import (
    MetricsLog,
    heldout_metrics,
    peak_memory_gb,
    read_metrics,
    read_summary,
    step_row,
    step_sums,
    write_summary,
)

if TYPE_CHECKING:
    import torch

    from pipeline.train.packing import TrainBatch

log = logging.getLogger(__name__)

HELDOUT_LIMIT = 64  # held-out samples evaluated at the end of a run
HELDOUT_BATCH = 8


@dataclass
class TrainResult:
    out_dir: Path
    steps: int  # optimiser steps completed (over all runs of this out_dir)
    metrics: list[dict[str, Any]]  # one per step, from metrics.jsonl
    heldout: dict[str, float] = field(default_factory=dict)
    checkpoint: Path | None = None
    export_dir: Path | None = None
    dflash_dir: Path | None = None


def train(
    config: TrainConfig, *, stop_after: int | None = None, export: bool = True
) -> TrainResult:
    """Train (or resume) per `config`; export the final draft when `export`.

    `stop_after` ends this run after that many total steps (the schedule still
    spans `num_steps`): how tests and users simulate an interrupted run.
    """
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = pin_data_version(config)  # once, for every worker
    if config.num_workers > 1 or config.use_ray:
        from pipeline.train.distributed import train_on_ray

        train_on_ray(
            config, _ray_loop, {"config": config.model_dump(mode="json"), "stop_after": stop_after}
        )
    else:
        run_worker(config.model_dump(mode="json"), stop_after=stop_after)
    summary = read_summary(out_dir)
    result = TrainResult(
        out_dir=out_dir,
        steps=summary["steps"],
        metrics=read_metrics(out_dir),
        heldout=summary.get("heldout", {}),
        checkpoint=latest_checkpoint(out_dir),
    )
    if result.steps >= config.num_steps:
        release_run_pins(config)  # finished: no resume will read the data again
    if export and result.steps >= config.num_steps:
        from pipeline.drafts.export import export_checkpoint

        if config.export.dflash_backbone is not None:
            log.warning(
                "export.dflash_backbone is ignored: a DSpark draft in the fill-in layout is "
                "exported as its DFlash backbone only; remove the key"
            )
        paths = export_checkpoint(result.checkpoint, export_dir(out_dir, config.export.dir))
        result.export_dir = paths.draft
        result.dflash_dir = paths.dflash_backbone
    return result


def pin_data_version(config: TrainConfig) -> TrainConfig:
    """`config` with `data.version` fixed: the version the run's checkpoints were trained on
    when it resumes, else the configured one, else the newest now.

    Resolved once, before any worker starts, and recorded in every checkpoint's
    config.yaml, so all workers and every resume read the same samples in the
    same order even after a newer version is published. A config that names
    another version or dataset than the checkpoints is refused. A following run
    (`data.follow`) pins the version it starts on, waiting for a first one while
    a writer holds the lease; its epoch 0 replays the history from there.
    """
    from pipeline.table.dataset import Dataset

    data = config.data
    version = data.version
    path = latest_checkpoint(config.out_dir)
    if path is not None:
        recorded = load_checkpoint(path).train_config.get("data") or {}
        pinned = recorded.get("version")
        if pinned is None:
            log.warning(
                "%s records no dataset version (written before versions were pinned): "
                "resuming on %s",
                path,
                "the newest version" if version is None else f"version {version}",
            )
        else:
            then = Dataset.open(recorded["uri"], endpoint_url=recorded.get("endpoint_url")).uri
            now = Dataset.open(data.uri, endpoint_url=data.endpoint_url).uri
            if then != now or (version is not None and version != pinned):
                raise ValueError(
                    f"{path} was trained on {then} version {pinned}, but the config reads "
                    f"{now} version {'newest' if version is None else version}: set "
                    f"data.uri={then} and data.version={pinned} to resume, or use a new out_dir"
                )
            version = pinned
    if version is None and data.follow:
        from pipeline.table.reader import wait_for_first_version

        dataset = Dataset.open(data.uri, endpoint_url=data.endpoint_url)
        version = wait_for_first_version(dataset, data.follow_poll_s, data.follow_timeout_s)
    if version is None:
        version = Dataset.open(data.uri, endpoint_url=data.endpoint_url).latest_version()
    if version is None:
        return config  # no committed version: TrainingData names the problem
    # Kept from gc until the run is finished (a resume reads it; a follower's
    # replay reads every later version too). `train` releases it at the end.
    Dataset.open(data.uri, endpoint_url=data.endpoint_url).pin(
        version,
        version_pin(run_pin_prefix(config.out_dir), version),
        owner=f"train {config.out_dir}",
        following=data.follow,
    )
    return config.model_copy(update={"data": data.model_copy(update={"version": version})})


def release_run_pins(config: TrainConfig) -> list[str]:
    """Remove the pins of a finished run (pin_data_version, and each version it followed)."""
    from pipeline.table.dataset import Dataset

    dataset = Dataset.open(config.data.uri, endpoint_url=config.data.endpoint_url)
    return release_pins(dataset, run_pin_prefix(config.out_dir))


def run_worker(
    config_data: dict[str, Any], *, stop_after: int | None = None, distributed: bool = False
) -> None:
    """One worker's whole run (rank and world size come from torch.distributed)."""
    config = TrainConfig.model_validate(config_data)
    with torch_threads(config.num_threads):
        trainer = Trainer(config, distributed=distributed)
        trainer.resume()
        trainer.train(stop_after=stop_after)


def _ray_loop(loop_config: dict[str, Any]) -> None:
    """What every Ray Train worker runs."""
    run_worker(loop_config["config"], stop_after=loop_config["stop_after"], distributed=True)


def _mask_token_id(config: TrainConfig, target_dir: Path) -> int:
    """The token mask slots embed: the config's, else the tokenizer's or a fallback
    (kinds without mask slots get 0, an id that is never embedded)."""
    if config.draft.mask_token_id is not None:
        return config.draft.mask_token_id
    if not draft_kind(config.draft.kind).mask_token:
        return 0
    from pipeline.drafts.common import tokenizer_mask_token_id

    return tokenizer_mask_token_id(target_dir)


@dataclass
class StepOutput:
    """What forward_backward leaves for the metrics of its step."""

    sums: torch.Tensor  # this worker's metrics.step_sums, added over its micro-batches
    micro_batches: int


class Trainer:
    """One worker's run; see the module docstring for the steps of `train()`."""

    def __init__(self, config: TrainConfig, *, distributed: bool = False) -> None:
        import torch
        import torch.distributed as dist

        from pipeline.drafts.common import load_target_head
        from pipeline.drafts.family import language_config
        from pipeline.targets.resolve import resolve_model
        from pipeline.train.data import DataPosition, TrainingData
        from pipeline.train.objective import DraftObjective
        from pipeline.train.optim import build_optimizer, build_scheduler

        self.config, self.distributed = config, distributed
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        self.strategy = config.distributed if distributed else None
        self.device = torch.device("cpu")
        if config.use_gpu:
            index = torch.cuda.current_device() if distributed else None
            self.device = torch.device("cuda", index)
        self.out_dir = Path(config.out_dir)
        self.metrics = MetricsLog(self.out_dir)
        target_dir = Path(resolve_model(config.target))
        target_config = json.loads((target_dir / "config.json").read_text())
        self.data = TrainingData(config.data, pin_prefix=run_pin_prefix(config.out_dir))
        language = language_config(target_config)
        self.data.check(
            target=config.target, target_config=language, aux_layer_ids=config.draft.aux_layer_ids
        )
        captured = self.data.provenance.aux_layer_ids
        layers, source = config.draft.layers_to_read(captured, language["num_hidden_layers"])
        self.data.read_layers(layers)  # every batch: these layers' columns of the frame
        if self.rank == 0:
            log.info(
                "draft reads layers %s",
                kv(aux_layer_ids=list(layers), captured=list(captured), source=source),
            )
        draft_vocab = None
        if config.draft.draft_vocab_size is not None:
            from pipeline.train.vocab import run_draft_vocab

            draft_vocab = run_draft_vocab(
                size=config.draft.draft_vocab_size,
                split=self.data,
                vocab_size=language["vocab_size"],
                target_dir=target_dir,
                out_dir=self.out_dir,
                write=self.rank == 0,
            )
        self.spec = config.draft.resolve(
            target_config,
            aux_layer_ids=layers,
            mask_token_id=_mask_token_id(config, target_dir),
            draft_vocab=draft_vocab,
        )
        kind = draft_kind(self.spec.kind)
        embed, head = load_target_head(target_dir, dtype=None)
        frozen = torch.bfloat16 if config.bf16 else torch.float32
        torch.manual_seed(config.seed)
        self.model = kind.build(self.spec, embed, head, frozen_dtype=frozen).to(self.device)
        self.model.attention = config.attention
        del embed, head
        loss = config.loss
        self.slot_weights = kind.step_weights(
            self.spec, gamma=loss.gamma, ttt_step_decay=loss.ttt_step_decay
        ).to(self.device)  # (B,)
        self.loss_weights = (*loss.weights(self.spec.kind), loss.kl(self.spec.kind))
        self.objective = DraftObjective(
            self.model,
            slot_weights=self.slot_weights,
            loss_weights=self.loss_weights,
            chunk_size=loss.chunk_size,
        )
        self.net = self.objective  # what forward runs: the objective, or its DDP/FSDP form
        if distributed:
            from pipeline.train.distributed import wrap

            self.net = wrap(
                self.objective, strategy=self.strategy, device=self.device, bf16=config.bf16
            )
        # After wrapping: under FSDP the parameters are the sharded fp32 masters.
        self.params = [p for p in self.objective.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.optim, num_steps=config.num_steps)
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=config.bf16)
        self.step, self.position = 0, DataPosition(0, 0)
        self.progress = None  # rank 0's progress bar while train() runs

    def resume(self) -> None:
        """Continue from the run's latest checkpoint, if any (same spec required)."""
        from pipeline.train.data import DataPosition

        path = latest_checkpoint(self.out_dir)
        if path is not None:
            ckpt = load_checkpoint(path)
            if ckpt.spec != self.spec:
                raise ValueError(
                    f"{path}: checkpoint was trained with another draft spec than this config"
                )
            state = ckpt.state(map_location="cpu" if self.strategy == "fsdp" else self.device)
            from pipeline.train.distributed import load_states

            load_states(
                self.objective,
                self.optimizer,
                self.strategy,
                model=state["model"],
                optim=state["optimizer"],
            )
            self.scheduler.load_state_dict(state["scheduler"])
            self.step = state["step"]
            own = self.rank if self.config.data.split == "shards" else 0
            self.position = DataPosition(**state["position"][own])
            if self.rank == 0:
                log.info(
                    "resumed %s",
                    kv(
                        checkpoint=path,
                        step=self.step,
                        epoch=self.position.epoch,
                        data_version=self.data.manifest.version,
                    ),
                )
        if self.rank == 0:
            self.metrics.truncate(self.step)

    # ------------------------------------------------------------------ the loop

    def train(self, *, stop_after: int | None = None) -> None:
        """Steps until `num_steps` (or `stop_after`), then the held-out evaluation."""
        from pipeline.prefetch import prefetched
        from pipeline.train.data import iter_batches

        config = self.config
        last = min(stop_after if stop_after is not None else config.num_steps, config.num_steps)
        batches = prefetched(
            iter_batches(
                self.data,
                self.spec,
                seed=config.seed,
                global_batch_size=config.global_batch_size,
                rank=self.rank,
                world_size=self.world,
                start=self.position,
                micro_batch_size=config.micro_batch_size,
            ),
            config.data.prefetch,
        )
        if self.rank == 0:
            from tqdm import tqdm

            self.progress = tqdm(
                total=config.num_steps, initial=self.step, desc="train", disable=None
            )
        while self.step < last:
            started = time.perf_counter()
            micro, self.position = next(batches)
            output = self.forward_backward(micro)
            lr, grad_norm = self.optimizer_step()
            self.log_step(output, lr=lr, grad_norm=grad_norm, started=started, last=last)
            if self.step % config.checkpoint_every == 0 or self.step == last:
                self.checkpoint()
        if self.progress is not None:
            self.progress.close()
        heldout: dict[str, float] = {}
        if self.step >= config.num_steps:
            objective = self._plain_objective()  # collective under FSDP
            if self.rank == 0:
                heldout = self.evaluate(objective)
        if self.rank == 0:
            write_summary(self.out_dir, steps=self.step, heldout=heldout)

    def forward_backward(self, micro: list[TrainBatch]) -> StepOutput:
        """The kind's weighted loss of a step's micro-batches against the target's
        distributions, normalised by the global slot weight of the whole step;
        gradients accumulated over the micro-batches, reduced over workers once."""
        import torch
        import torch.distributed as dist

        from pipeline.train.distributed import gradient_sync

        weights = [(self.slot_weights.cpu() * mb.valid).sum() for mb in micro]
        normalizer = torch.stack(weights).sum().to(self.device)
        if self.distributed:
            dist.all_reduce(normalizer)
        self.optimizer.zero_grad(set_to_none=True)
        sums = None
        for i, mb in enumerate(micro):
            mb = mb.to(self.device)
            with gradient_sync(self.net, self.strategy, sync=i == len(micro) - 1):
                with self.autocast:
                    parts = self.net(mb, normalizer)
                # DDP and FSDP average gradients over workers; each holds local_sum/global_w.
                (parts.total * self.world).backward()
            vec = step_sums(
                batch=mb,
                parts=parts,
                weight=weights[i].to(self.device),
                first_offset=self.spec.first_offset,
            )
            sums = vec if sums is None else sums + vec
        return StepOutput(sums, len(micro))

    def optimizer_step(self) -> tuple[float, float]:
        """Clip, step AdamW and the schedule; (learning rate used, gradient norm)."""
        import torch

        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.optim.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a replicated DTensor
            grad_norm = grad_norm.full_tensor()
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return lr, float(grad_norm)

    def log_step(
        self, output: StepOutput, *, lr: float, grad_norm: float, started: float, last: int
    ) -> None:
        """Sum the step's metrics over workers; rank 0 writes its metrics.jsonl row."""
        import torch.distributed as dist

        spec = self.spec
        sums = output.sums.clone()
        if self.distributed:
            dist.all_reduce(sums)
        if self.rank != 0:
            return
        row = step_row(
            sums,
            step=self.step,
            lr=lr,
            grad_norm=grad_norm,
            epoch=self.position.epoch,
            seconds=time.perf_counter() - started,
            loss_weights=self.loss_weights,
            micro_batches=output.micro_batches,
            peak_memory_gb=peak_memory_gb(self.device),
            block_size=spec.block_size,
            first_offset=spec.first_offset,
        )
        self.metrics.append(row)
        if self.step % self.config.log_every == 0 or self.step == last:
            keys = ("loss", "ce", "tv", "tau_tv")
            log.info("step %s", kv(step=self.step, **{k: row[k] for k in keys}, lr=lr))
        self.progress.update(1)
        self.progress.set_postfix(loss=f"{row['loss']:.3f}", tau=f"{row['tau_tv']:.2f}")

    def checkpoint(self) -> None:
        """Rank 0 saves model, optimiser, schedule, step and every rank's data position
        (under FSDP every rank first joins in gathering the full tensors)."""
        import torch.distributed as dist

        from pipeline.train.distributed import model_state, optimizer_state

        positions = [self.position.to_dict()]
        if self.distributed and self.config.data.split == "shards":
            positions = [None] * self.world
            dist.all_gather_object(positions, self.position.to_dict())
        model = model_state(self.objective, self.strategy)
        optim = optimizer_state(self.objective, self.optimizer, self.strategy)
        if self.rank == 0:
            state = {
                "model": model,
                "optimizer": optim,
                "scheduler": self.scheduler.state_dict(),
                "step": self.step,
                "position": positions,
            }
            config_yaml = dump_train_config(self.config)
            save_checkpoint(self.out_dir, self.step, state, self.spec.to_json(), config_yaml)
        if self.distributed:
            dist.barrier()

    def _plain_objective(self):
        """The objective as one process can run it: itself, or under FSDP (collective)
        a plain copy of the full draft on rank 0 (None elsewhere)."""
        if self.strategy != "fsdp":
            return self.objective
        from pipeline.train.distributed import plain_copy

        return plain_copy(self.objective, rank=self.rank)

    def evaluate(self, objective=None, limit: int = HELDOUT_LIMIT) -> dict[str, float]:
        """Teacher-forced metrics on the held-out split (never trained on), of
        `objective` (default: this worker's own)."""
        from pipeline.train.data import heldout_batches

        batches = heldout_batches(
            self.data, self.spec, seed=self.config.seed, batch_size=HELDOUT_BATCH, limit=limit
        )
        objective = objective or self.objective
        objective.eval()
        try:
            with self.autocast:
                return heldout_metrics(objective, (b.to(self.device) for b in batches))
        finally:
            objective.train()


def summary_lines(result: TrainResult) -> list[str]:
    """A short human-readable report of a run (what `dspark-targets train` prints)."""
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
        what = "its DFlash backbone, served by vLLM's CPU build" if result.dflash_dir else "draft"
        lines.append(f"export ({what}, speculators format): {result.export_dir}")
    return lines
