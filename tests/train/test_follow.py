"""`train --follow`: training starts while a regeneration still commits, picks up
every version as it lands, and a replay of the history (or a resume) trains on
exactly the same batches."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.demo.reference_shards import reference_config
from pipeline.drafts.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.regenerate.run import run_local
from pipeline.table.dataset import Dataset
from pipeline.table.lease import lease_holder
from pipeline.targets.hf_backend import HFTarget
from pipeline.torch_threads import torch_threads
from pipeline.train.config import parse_train_config
from pipeline.train.data import TrainingData
from pipeline.train.metrics import read_metrics
from pipeline.train.trainer import train

NUM_UNITS = 4
BATCH = 8
STEPS = 17  # the 124 training rows fill 15 steps of epoch 0; two more read epoch 1


def _config(uri, out_dir, **data):
    return parse_train_config(
        dict(
            target="toy:trained",
            data=dict(
                uri=str(uri),
                num_anchors=16,
                heldout_fraction=0.1,
                prefetch=1,
                follow=True,
                follow_poll_s=0.05,
                **data,
            ),
            out_dir=str(out_dir),
            num_steps=STEPS,
            global_batch_size=BATCH,
            draft=dict(num_layers=1, block_size=4, sample_from_anchor=False, markov_rank=16),
            optim=dict(lr=3e-3, warmup_fraction=0.1),
            checkpoint_every=100,
            log_every=100,
            num_threads=1,
        )
    )


def _losses(metrics):
    return [(m["step"], m["epoch"], m["loss"]) for m in metrics]


@pytest.mark.slow
def test_training_follows_a_regeneration_and_a_replay_trains_the_same_batches(
    tmp_path, trained_target_dir, monkeypatch, caplog
):
    uri = tmp_path / "ds"
    regen = reference_config(uri, num_conversations=96, num_units=NUM_UNITS)
    regen = regen.model_copy(
        update={"regenerate": regen.regenerate.model_copy(update={"commit_every_units": 1})}
    )
    submit = HFTarget.submit

    def slow(self, request, *args, **kwargs):
        time.sleep(0.05)  # keep the regeneration going while training starts
        return submit(self, request, *args, **kwargs)

    monkeypatch.setattr(HFTarget, "submit", slow)
    outcome: dict = {}

    def regenerate() -> None:
        with torch_threads(1):
            outcome["summary"] = run_local(regen)

    runner = threading.Thread(target=regenerate)
    runner.start()
    ds = Dataset.open(uri)
    deadline = time.monotonic() + 120
    while lease_holder(ds) is None and ds.latest_version() is None:
        assert runner.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    try:
        with caplog.at_level(logging.INFO, logger="pipeline.train.data"):
            live = train(_config(uri, tmp_path / "live"), export=False)
    finally:
        runner.join(timeout=300)  # never leave the regeneration running past the test
    final = outcome["summary"].version
    assert final == NUM_UNITS  # one version per unit

    messages = [r.getMessage() for r in caplog.records]
    versions = [
        int(re.search(r"version=(\d+)", m)[1]) for m in messages if m.startswith("following")
    ]
    # It started before the last version landed and read every later one in turn.
    start = load_checkpoint(latest_checkpoint(tmp_path / "live")).train_config["data"]["version"]
    assert start < final and versions == list(range(start, final + 1))

    # Epoch 0 covered the training rows of every version (all but the last partial batch),
    # then epoch 1 read the final version.
    full = TrainingData(_config(uri, tmp_path / "x", version=final).data)
    rows = len(full.train_rows)
    epoch0 = [m for m in live.metrics if m["epoch"] == 0]
    assert (
        len(epoch0) == rows // BATCH and sum(m["samples"] for m in epoch0) == rows // BATCH * BATCH
    )
    assert live.metrics[-1]["epoch"] == 1 and live.steps == STEPS

    # A replay from the same start after the writer ended, cut in epoch 1 and resumed
    # through the CLI: the same batches, so the same losses, step by step.
    cut = train(
        _config(uri, tmp_path / "replay", version=start), stop_after=STEPS - 1, export=False
    )
    assert cut.steps == STEPS - 1
    state = load_checkpoint(latest_checkpoint(tmp_path / "replay")).state()
    assert state["position"][0]["epoch"] == 1 and state["position"][0]["version"] == final
    replay = _config(uri, tmp_path / "replay", version=start).model_dump(mode="json")
    replay["data"]["follow"] = False  # --follow sets it
    config_file = tmp_path / "replay.yaml"
    config_file.write_text(yaml.safe_dump(replay))
    out = CliRunner().invoke(cli, ["train", "--config", str(config_file), "--follow"])
    assert out.exit_code == 0, out.output
    resumed = read_metrics(tmp_path / "replay")
    assert [m["step"] for m in resumed] == list(range(1, STEPS + 1))
    for (ws, we, wl), (gs, ge, gl) in zip(_losses(live.metrics), _losses(resumed), strict=True):
        assert (ws, we) == (gs, ge)
        assert gl == pytest.approx(wl, rel=1e-6, abs=1e-7), (ws, wl, gl)


def test_follow_with_several_workers_is_refused():
    with pytest.raises(ValueError, match="data.follow trains in one process"):
        parse_train_config(
            dict(
                target="toy:trained",
                data=dict(uri="/nowhere", follow=True),
                out_dir="/tmp/x",
                num_workers=2,
                num_steps=10,
                global_batch_size=4,
            )
        )
