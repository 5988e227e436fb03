"""The training loop of one worker: a `Trainer` set up, resumed, and run over named steps.

A Trainer is set up in `__init__` (dataset checked against the target and draft
before step 0 by pipeline/train/setup.py, draft built, AdamW + warmup/cosine),
`resume`s from the run's latest checkpoint, and `train()` loops over named steps:

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
mask token) comes from pipeline/drafts/registry.py. Checkpoints and metrics are
written by rank 0 to `out_dir`: on a multi-node cluster that must be a shared
filesystem. The run around it (pinning the data version, starting the workers
here or on Ray, the export) is pipeline/train/trainer.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.drafts.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from pipeline.drafts.registry import draft_kind
from pipeline.logs import kv
from pipeline.train.config import TrainConfig, dump_train_config
from pipeline.train.metrics import (
    MetricsLog,
    heldout_metrics,
    peak_memory_gb,
    step_row,
    step_sums,
    write_summary,
)
from pipeline.train.schedule import step_loss_weights

if TYPE_CHECKING:
    import torch

    from pipeline.train.packing import TrainBatch

log = logging.getLogger(__name__)

HELDOUT_LIMIT = 64  # held-out samples evaluated at the end of a run
HELDOUT_BATCH = 8


@dataclass
class StepOutput:
    """What forward_backward leaves for the metrics of its step."""

    sums: torch.Tensor  # this worker's metrics.step_sums, added over its micro-batches
    micro_batches: int


class Trainer:
    """One worker's run; see the module docstring for the steps of `train()`."""

    def __init__(self, config: TrainConfig, *, distributed: bool = False) -> None:
        from pipeline.train.data import DataPosition
        from pipeline.train.setup import prepare_inputs

        self.config, self.distributed = config, distributed
        self._place()
        self.out_dir = Path(config.out_dir)
        self.metrics = MetricsLog(self.out_dir)
        inputs = prepare_inputs(config, out_dir=self.out_dir, rank=self.rank)
        self.data, self.spec = inputs.data, inputs.spec
        self._build_objective(inputs.target_dir)
        self._build_optimizer()
        self.step, self.position = 0, DataPosition(0, 0)
        self.progress = None  # rank 0's progress bar while train() runs

    # ------------------------------------------------------------------ set-up

    def _place(self) -> None:
        """This worker's rank, world size, data-parallel strategy and device."""
        import torch
        import torch.distributed as dist

        config, distributed = self.config, self.distributed
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        self.strategy = config.distributed if distributed else None
        self.device = torch.device("cpu")
        if config.use_gpu:
            index = torch.cuda.current_device() if distributed else None
            self.device = torch.device("cuda", index)

    def _build_objective(self, target_dir: Path) -> None:
        """The draft over the target's frozen tables, the kind's slot and loss weights,
        the chunked objective, and what forward runs (its DDP/FSDP form when distributed)."""
        import torch

        from pipeline.drafts.target_head import load_target_head
        from pipeline.train.objective import DraftObjective

        config = self.config
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
        if self.distributed:
            from pipeline.train.distributed import wrap

            self.net = wrap(
                self.objective, strategy=self.strategy, device=self.device, bf16=config.bf16
            )

    def _build_optimizer(self) -> None:
        """AdamW over the trainable parameters, warmup + cosine, and bf16 autocast."""
        import torch

        from pipeline.train.optim import build_optimizer, build_scheduler

        config = self.config
        # After wrapping: under FSDP the parameters are the sharded fp32 masters.
        self.params = [p for p in self.objective.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(self.params, config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.optim, num_steps=config.num_steps)
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=config.bf16)

    def resume(self) -> None:
        """Continue from the run's latest checkpoint, if any (same spec required); a
        fresh run with `init_from` warm-starts instead (pipeline/train/warm_start.py)."""
        from pipeline.train.data import DataPosition

        path = latest_checkpoint(self.out_dir)
        if path is None and self.config.init_from is not None:
            from pipeline.train.warm_start import warm_start

            warm_start(self.objective.model, self.spec, self.config.init_from)
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
            self.objective.loss_weights = step_loss_weights(
                self.loss_weights,
                step=self.step,
                num_steps=config.num_steps,
                ce_first_fraction=config.loss.ce_first_fraction,
            )
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
            loss_weights=self.objective.loss_weights,
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
