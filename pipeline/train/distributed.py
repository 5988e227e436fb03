"""Training on Ray Train: one `TorchTrainer` of `num_workers` workers, same loop as one process.

Every worker runs the trainer's loop function (pipeline/train/trainer.py
passes it, so this module does not import the trainer); torch.distributed
runs gloo on CPU and NCCL on GPU, and the trainer all-reduces its normaliser
and metric sums, so N workers train exactly as one process with the same
global batch. Ray's own run state goes to `<out_dir>/ray`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.train.config import TrainConfig


def train_on_ray(
    config: TrainConfig, loop: Callable[[dict[str, Any]], None], loop_config: dict[str, Any]
) -> None:
    """Run `loop(loop_config)` on `config.num_workers` Ray Train workers; wait for them."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if not ray.is_initialized():
        ray.init(address=config.ray.address, num_cpus=config.ray.num_cpus, include_dashboard=False)
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
