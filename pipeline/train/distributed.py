"""Training on many workers: Ray Train's launch, and the data-parallel wrappers.

`train_on_ray` runs one `TorchTrainer` of `num_workers` workers, each
running the trainer's loop function (pipeline/train/trainer.py passes it, so
this module does not import the trainer); torch.distributed runs gloo on CPU
and NCCL on GPU, and the trainer all-reduces its normaliser and metric sums,
so N workers train exactly as one process with the same global batch. Ray's
own run state goes to `<out_dir>/ray`.

`wrap` makes the draft's objective data-parallel (`distributed: ddp` or
`fsdp`), `gradient_sync` skips the gradient reduction between micro-batches,
and `model_state` / `optimizer_state` / `load_states` move checkpoints in one
format (full tensors, parameters by index) whichever strategy wrote or reads
them: a run saved under FSDP resumes under DDP or in one process, and back.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.train.config import TrainConfig

if TYPE_CHECKING:
    import torch
    from torch import nn


def train_on_ray(
    config: TrainConfig, loop: Callable[[dict[str, Any]], None], loop_config: dict[str, Any]
) -> None:
    """Run `loop(loop_config)` on `config.num_workers` Ray Train workers; wait for them."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if not ray.is_initialized():
        # No address: a cluster of our own, never one a stale /tmp/ray file names.
        address = config.ray.address or os.environ.get("RAY_ADDRESS") or "local"
        num_cpus = config.ray.num_cpus if address == "local" else None
        ray.init(address=address, num_cpus=num_cpus, include_dashboard=False)
    resources = {"CPU": config.ray.num_cpus_per_worker}
    if config.use_gpu:
        resources["GPU"] = 1
    trainer = TorchTrainer(
        loop,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=config.num_workers, use_gpu=config.use_gpu, resources_per_worker=resources
        ),
        torch_config=TorchConfig(backend="nccl" if config.use_gpu else "gloo"),
        run_config=RunConfig(
            name="dspark-train", storage_path=str((Path(config.out_dir) / "ray").resolve())
        ),
    )
    trainer.fit()


# ---------------------------------------------------------------------- data parallelism


def wrap(objective: nn.Module, *, strategy: str, device: torch.device, bf16: bool) -> nn.Module:
    """`objective` (a DraftObjective) made data-parallel over the process group.

    * ddp: DistributedDataParallel without buffer broadcasts (the frozen target
      tables never travel; every worker loaded them from the target), and the
      tables excluded from the start-up sync too;
    * fsdp: FSDP2 `fully_shard` per draft layer, then the rest (fc, norms,
      Markov and confidence heads) as the root; bf16 runs gather parameters in
      bf16 and reduce gradients in fp32 (the sharded fp32 parameters are the
      master weights AdamW updates).
    """
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        frozen = [name for name, _ in objective.named_buffers()]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(objective, frozen)
        ids = [device.index] if device.type == "cuda" else None
        # No buffer sync per forward (`broadcast_buffers`, renamed `forward_sync_buffers`
        # in newer torch); the start-up sync already skips the ignored tables.
        params = inspect.signature(DistributedDataParallel).parameters
        no_sync = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in params
            else {"broadcast_buffers": False}
        )
        return DistributedDataParallel(objective, device_ids=ids, **no_sync)
    if strategy == "fsdp":
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None,
            reduce_dtype=torch.float32 if bf16 else None,
        )
        for layer in objective.model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(objective, mp_policy=policy)
        return objective
    raise ValueError(f"distributed {strategy!r}: choose ddp or fsdp")


@contextmanager
def gradient_sync(net: nn.Module, strategy: str | None, sync: bool) -> Iterator[None]:
    """Forward and backward of one micro-batch; gradients are reduced over workers only
    when `sync` (the last micro-batch of a step): DDP's `no_sync`, FSDP2's
    `set_requires_gradient_sync`. No-op in one process."""
    if strategy == "ddp" and not sync:
        with net.no_sync():
            yield
        return
    if strategy == "fsdp":
        net.set_requires_gradient_sync(sync)
    yield


def _trainable_names(objective: nn.Module) -> list[str]:
    return [name for name, p in objective.named_parameters() if p.requires_grad]


def model_state(objective: nn.Module, strategy: str | None) -> dict[str, torch.Tensor]:
    """The draft's full state dict (vLLM's names, no `model.` prefix), on the CPU.

    Collective under fsdp (every rank calls; rank 0 gets the tensors, others {})."""
    if strategy != "fsdp":
        return objective.model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(
        objective, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return {k.removeprefix("model."): v for k, v in full.items()}


def optimizer_state(
    objective: nn.Module, optimizer: torch.optim.Optimizer, strategy: str | None
) -> dict[str, Any]:
    """The optimiser's state in torch's own layout (parameters by index), whatever the
    strategy, so DDP and FSDP checkpoints are one format. Collective under fsdp."""
    if strategy != "fsdp":
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    full = get_optimizer_state_dict(
        objective, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if not full:  # ranks other than 0
        return {}
    index = {name: i for i, name in enumerate(_trainable_names(objective))}
    return {
        "state": {index[name]: value for name, value in full["state"].items()},
        "param_groups": [
            {**group, "params": [index[n] for n in group["params"]]}
            for group in full["param_groups"]
        ],
    }


def load_states(
    objective: nn.Module,
    optimizer: torch.optim.Optimizer,
    strategy: str | None,
    *,
    model: dict[str, torch.Tensor],
    optim: dict[str, Any],
) -> None:
    """Load a checkpoint's draft and optimiser states (any strategy wrote them)."""
    if strategy != "fsdp":
        objective.model.load_state_dict(model)
        optimizer.load_state_dict(optim)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(objective, {f"model.{k}": v for k, v in model.items()}, options=options)
    names = _trainable_names(objective)
    by_name = {
        "state": {names[i]: value for i, value in optim["state"].items()},
        "param_groups": [
            {**group, "params": [names[i] for i in group["params"]]}
            for group in optim["param_groups"]
        ],
    }
    set_optimizer_state_dict(objective, optimizer, by_name, options=options)


def plain_copy(objective: nn.Module, *, rank: int) -> nn.Module | None:
    """A one-process copy of an FSDP-wrapped DraftObjective (collective: every rank
    gathers; rank 0 gets the copy, on the objective's device, the others None)."""
    from pipeline.drafts.registry import draft_kind
    from pipeline.train.objective import DraftObjective

    state = model_state(objective, "fsdp")
    if rank != 0:
        return None
    model = objective.model
    copy = draft_kind(model.spec.kind).build(model.spec, model.embed_tokens, model.lm_head)
    copy.load_state_dict(state)
    copy.attention = model.attention
    return DraftObjective(
        copy.to(model.embed_tokens.device),
        slot_weights=objective.slot_weights,
        loss_weights=objective.loss_weights,
        chunk_size=objective.chunk_size,
    )
