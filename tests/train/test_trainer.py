"""The trainer on real toy shards: loss falls, resume continues the same curve,
two Ray Train workers (gloo) equal one worker with the same global batch."""

from __future__ import annotations

import math

import pytest
import torch
from train_configs import toy_train_config as _config

from pipeline.drafts.checkpoint import latest_checkpoint
from pipeline.train.trainer import train

# Two gloo workers vs one process: same samples, same normaliser, only the
# order of float additions differs (all-reduce of gradients and metric sums).
# Measured differences after 4 AdamW steps: ~1e-6 relative; we allow 1e-4.
WORKER_RTOL = 1e-4


def test_loss_falls_on_toy_shards(toy_shards, tmp_path):
    cfg = _config(toy_shards, tmp_path, num_steps=40, global_batch_size=8, checkpoint_every=40)
    result = train(cfg, export=False)
    losses = [m["loss"] for m in result.metrics]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    ces = [m["ce"] for m in result.metrics]
    # The loss is dominated by 0.9 x L1, which falls slowly on this budget
    # (measured: loss 2.59 -> 2.34, CE 5.87 -> 4.37, step-to-step noise ~0.03); an
    # untrained draft stays near its first values.
    assert last < 0.95 * first, (first, last)
    assert sum(ces[-5:]) / 5 < 0.85 * sum(ces[:5]) / 5, ces
    assert result.metrics[-1]["tv"] < result.metrics[0]["tv"]
    assert result.metrics[-1]["tau_tv"] > result.metrics[0]["tau_tv"]
    assert result.heldout and result.heldout["samples"] > 0
    assert {"ce", "tv", "bce", "acc_1", "acc_3", "tau_greedy"} <= set(result.metrics[-1])


def test_resumed_run_reproduces_the_uninterrupted_curve(toy_shards, tmp_path):
    whole = train(_config(toy_shards, tmp_path / "whole"), export=False)
    first = train(_config(toy_shards, tmp_path / "cut"), stop_after=4, export=False)
    assert first.steps == 4 and latest_checkpoint(tmp_path / "cut").name == "step-00000004"
    resumed = train(_config(toy_shards, tmp_path / "cut"), export=False)
    assert resumed.steps == 8
    want = [(m["step"], m["loss"], m["samples"]) for m in whole.metrics]
    got = [(m["step"], m["loss"], m["samples"]) for m in resumed.metrics]
    assert [s for s, *_ in got] == list(range(1, 9))
    for (ws, wl, wn), (gs, gl, gn) in zip(want, got, strict=True):
        assert ws == gs and wn == gn
        assert gl == pytest.approx(wl, rel=1e-6, abs=1e-7), (ws, wl, gl)
    a = torch.load(latest_checkpoint(tmp_path / "whole") / "state.pt", weights_only=True)
    b = torch.load(latest_checkpoint(tmp_path / "cut") / "state.pt", weights_only=True)
    assert a["position"] == b["position"]
    for name, tensor in a["model"].items():
        torch.testing.assert_close(b["model"][name], tensor, atol=1e-6, rtol=1e-6)


def test_two_ray_workers_equal_one_worker(toy_shards, tmp_path, ray_local):
    one = train(_config(toy_shards, tmp_path / "one", num_steps=4), export=False)
    two = train(_config(toy_shards, tmp_path / "two", num_steps=4, num_workers=2), export=False)
    assert [m["samples"] for m in two.metrics] == [4, 4, 4, 4]
    worst_rel = 0.0
    for a, b in zip(one.metrics, two.metrics, strict=True):
        for key in ("loss", "ce", "tv", "bce", "tau_tv"):
            assert b[key] == pytest.approx(a[key], rel=WORKER_RTOL), (a["step"], key)
            worst_rel = max(worst_rel, abs(b[key] - a[key]) / max(abs(a[key]), 1e-12))
    sa = torch.load(latest_checkpoint(tmp_path / "one") / "state.pt", weights_only=True)["model"]
    sb = torch.load(latest_checkpoint(tmp_path / "two") / "state.pt", weights_only=True)["model"]
    worst = max(float((sa[k] - sb[k]).abs().max()) for k in sa)
    print(
        f"1 vs 2 workers: max relative metric difference {worst_rel:.1e}, max |param diff| {worst:.1e}"
    )
    assert worst < 1e-4, worst


def _grads(trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_accumulated_micro_batches_equal_one_batch(toy_shards, tmp_path):
    """k micro-batches of one sample: the gradients of one batch of k samples (same
    normaliser: the slot weight of the whole step), and the same metric sums."""
    from pipeline.train.data import iter_batches
    from pipeline.train.trainer import Trainer

    trainers, steps = {}, {}
    for name, micro in (("whole", None), ("micro", 1)):
        cfg = _config(
            toy_shards, tmp_path / name, micro_batch_size=micro, draft=dict(sample_from_anchor=True)
        )
        trainer = Trainer(cfg)
        batches, _ = next(
            iter_batches(
                trainer.data,
                trainer.spec,
                seed=0,
                global_batch_size=cfg.global_batch_size,
                micro_batch_size=micro,
            )
        )
        assert len(batches) == (1 if micro is None else 4)
        steps[name] = trainer.forward_backward(batches)
        trainers[name] = trainer
    a, b = _grads(trainers["whole"]), _grads(trainers["micro"])
    assert set(a) == set(b) and any("markov_head" in n for n in a)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(steps["micro"].sums, steps["whole"].sums, rtol=1e-5, atol=1e-5)
    assert steps["micro"].micro_batches == 4


def test_bf16_run_keeps_fp32_masters_and_bf16_target_tables(toy_shards, tmp_path):
    from pipeline.train.trainer import Trainer

    cfg = _config(toy_shards, tmp_path, precision="bf16", num_steps=2, micro_batch_size=2)
    assert cfg.bf16 and cfg.accumulation_steps == 2
    result = train(cfg, export=False)
    assert result.steps == 2 and all(math.isfinite(m["loss"]) for m in result.metrics)
    assert [m["micro_batches"] for m in result.metrics] == [2, 2]
    trainer = Trainer(cfg)
    assert trainer.model.embed_tokens.dtype == torch.bfloat16
    assert trainer.model.lm_head.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())


def test_config_names_the_fix_for_bad_batch_splits(toy_shards, tmp_path):
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="pick a divisor of 4"):
        _config(toy_shards, tmp_path, micro_batch_size=3)
    with pytest.raises(ConfigError, match="attention: flex needs a GPU"):
        _config(toy_shards, tmp_path, attention="flex")


def test_ddp_neither_syncs_nor_broadcasts_the_frozen_target_tables(toy_shards, tmp_path):
    """One-process gloo group: the DDP wrapper skips every buffer (embeddings, lm_head)."""
    import torch.distributed as dist

    from pipeline.train.distributed import wrap
    from pipeline.train.trainer import Trainer

    trainer = Trainer(_config(toy_shards, tmp_path))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        net = wrap(trainer.objective, strategy="ddp", device=torch.device("cpu"), bf16=False)
        assert getattr(net, "forward_sync_buffers", net.broadcast_buffers) is False
        assert {"model.embed_tokens", "model.lm_head_weight"} <= net.parameters_to_ignore
        assert not any(p.requires_grad for n, p in net.named_buffers())
    finally:
        dist.destroy_process_group()


def _resume_copy(src, dst, step: int) -> None:
    """A new run directory holding `src`'s checkpoint of `step` (and its metrics)."""
    import shutil

    name = f"step-{step:08d}"
    (dst / "checkpoints").mkdir(parents=True)
    shutil.copytree(src / "checkpoints" / name, dst / "checkpoints" / name)
    (dst / "checkpoints" / "latest").write_text(name)
    shutil.copy(src / "metrics.jsonl", dst / "metrics.jsonl")


@pytest.mark.slow
def test_fsdp_trains_as_one_worker_and_checkpoints_cross_strategies(
    toy_shards, tmp_path, ray_local
):
    """FSDP2 on two gloo workers: the same curve as one process; its checkpoint resumes
    in one process, and a one-process (DDP-format) checkpoint resumes under FSDP."""
    steps = dict(num_steps=4, checkpoint_every=2)
    fsdp = dict(num_workers=2, distributed="fsdp")
    one = train(_config(toy_shards, tmp_path / "one", **steps), export=False)
    cut = train(_config(toy_shards, tmp_path / "fsdp", **steps, **fsdp), stop_after=2, export=False)
    assert cut.steps == 2
    _resume_copy(tmp_path / "fsdp", tmp_path / "fsdp-then-one", 2)
    after_fsdp = train(_config(toy_shards, tmp_path / "fsdp-then-one", **steps), export=False)
    _resume_copy(tmp_path / "one", tmp_path / "one-then-fsdp", 2)
    under_fsdp = train(
        _config(toy_shards, tmp_path / "one-then-fsdp", **steps, **fsdp), export=False
    )
    want = {m["step"]: m for m in one.metrics}
    for run in (cut, after_fsdp, under_fsdp):
        assert [m["step"] for m in run.metrics] == list(range(1, run.steps + 1))
        for m in run.metrics:
            for key in ("loss", "ce", "tv", "bce", "tau_tv", "grad_norm"):
                assert m[key] == pytest.approx(want[m["step"]][key], rel=WORKER_RTOL), (
                    m["step"],
                    key,
                )
    ref = torch.load(latest_checkpoint(tmp_path / "one") / "state.pt", weights_only=True)
    for run in ("fsdp-then-one", "one-then-fsdp"):
        got = torch.load(latest_checkpoint(tmp_path / run) / "state.pt", weights_only=True)
        assert set(got["model"]) == set(ref["model"])
        worst = max(float((got["model"][k] - ref["model"][k]).abs().max()) for k in ref["model"])
        assert worst < 1e-4, (run, worst)
        assert got["optimizer"]["param_groups"][0]["params"] == list(range(len(ref["model"])))
    assert under_fsdp.heldout["samples"] == one.heldout["samples"] > 0
    assert under_fsdp.heldout["tau_tv"] == pytest.approx(one.heldout["tau_tv"], rel=1e-4)


def test_a_draft_trains_on_a_subset_of_the_captured_layers(toy_shards, tmp_path):
    """Shards captured (1, 2, 3), draft.aux_layer_ids [1, 3]: the batches' features are
    the matching columns of the full frame's batch, the draft is sized for 2 layers, two
    steps train, and the checkpoint and export name the subset; an id the shards lack
    stops the run before step 0 in one line."""
    import dataclasses
    import json

    from pipeline.drafts.checkpoint import load_checkpoint
    from pipeline.table.split import DataMismatchError
    from pipeline.train.data import TrainingData, iter_batches
    from pipeline.train.trainer import Trainer

    missing = _config(toy_shards, tmp_path / "missing", draft=dict(aux_layer_ids=[2, 5]))
    with pytest.raises(
        DataMismatchError, match=r"\[5\] not captured .*captured \[1, 2, 3\]"
    ) as err:
        Trainer(missing)
    assert "\n" not in str(err.value) and str(toy_shards) in str(err.value)
    cfg = _config(
        toy_shards,
        tmp_path / "sub",
        num_steps=2,
        checkpoint_every=2,
        draft=dict(aux_layer_ids=[1, 3]),
    )
    trainer = Trainer(cfg)
    spec = trainer.spec
    h = spec.target_hidden_size
    assert trainer.data.provenance.aux_layer_ids == (1, 2, 3) and spec.aux_layer_ids == (1, 3)
    assert trainer.model.fc.in_features == 2 * h
    (batch,), _ = next(iter_batches(trainer.data, spec, seed=0, global_batch_size=4))
    full_spec = dataclasses.replace(spec, aux_layer_ids=(1, 2, 3))
    (whole,), _ = next(iter_batches(TrainingData(cfg.data), full_spec, seed=0, global_batch_size=4))
    ctx = whole.inputs.ctx_features  # (R, Tc, 3H)
    assert ctx.shape[-1] == 3 * h and bool(ctx.abs().sum() > 0)
    want = torch.cat([ctx[..., :h], ctx[..., 2 * h :]], dim=-1)
    assert torch.equal(batch.inputs.ctx_features, want)
    assert torch.equal(batch.target_ids, whole.target_ids)

    result = train(cfg)
    assert result.steps == 2 and math.isfinite(result.metrics[-1]["loss"])
    assert load_checkpoint(result.checkpoint).spec.aux_layer_ids == (1, 3)
    exported = json.loads((result.export_dir / "config.json").read_text())
    assert exported["aux_hidden_state_layer_ids"] == [1, 3]
