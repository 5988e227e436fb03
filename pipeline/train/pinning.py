"""The dataset version a training run reads, fixed once and kept from gc for the run's life.

`pin_data_version` resolves `data.version` before any worker starts (the version the
run's checkpoints record when it resumes, else the configured one, else the newest)
and pins it; `release_run_pins` removes the run's pins once it is finished.
"""

from __future__ import annotations

import logging

from pipeline.drafts.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.table.pins import release_pins, run_pin_prefix, version_pin
from pipeline.train.config import TrainConfig

log = logging.getLogger(__name__)


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
