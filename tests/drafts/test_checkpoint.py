"""The checkpoint layout: old checkpoints (tests/fixtures/drafts_v0, written before the
restructure) load with their optimiser state, today's trainer writes the same layout and
the same weights, and `latest` pointers are found or refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from pipeline.drafts.checkpoint import (
    find_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from pipeline.drafts.registry import build_draft
from pipeline.train.config import OptimConfig, parse_train_config
from pipeline.train.optim import build_optimizer, build_scheduler

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "drafts_v0"
KINDS = ["dspark", "dflash", "eagle3"]


@pytest.mark.parametrize("kind", KINDS)
def test_old_checkpoints_resume_with_their_optimiser(kind):
    ckpt = load_checkpoint(FIXTURE / kind)
    assert ckpt.path == latest_checkpoint(FIXTURE / kind) == find_checkpoint(ckpt.path)
    assert ckpt.spec.kind == kind and ckpt.target == "toy:random"
    assert ckpt.export_dir == FIXTURE / kind / "export"
    state = ckpt.state()
    assert state["step"] == 2 and state["position"] == [{"epoch": 0, "consumed": 8}]
    spec = ckpt.spec
    model = build_draft(spec, torch.zeros(spec.vocab_size, spec.hidden_size), torch.zeros(1, 1))
    model.load_state_dict(state["model"])  # strict: every tensor name as before
    optim = OptimConfig(**ckpt.train_config["optim"])
    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], optim)
    optimizer.load_state_dict(state["optimizer"])
    scheduler = build_scheduler(optimizer, optim, num_steps=ckpt.train_config["num_steps"])
    scheduler.load_state_dict(state["scheduler"])
    assert scheduler.last_epoch == 2


@pytest.fixture(scope="module")
def random_shards(tmp_path_factory):
    """The shards the fixture's drafts were trained on (committed beside them)."""
    import shutil

    uri = tmp_path_factory.mktemp("random-shards") / "shards"
    shutil.copytree(FIXTURE / "shards", uri)
    return uri


@pytest.mark.parametrize("kind", KINDS)
def test_todays_trainer_writes_the_old_layout_and_weights(kind, random_shards, tmp_path):
    from pipeline.train.trainer import train

    old = load_checkpoint(FIXTURE / kind)
    data = dict(old.train_config)
    data.update(out_dir=str(tmp_path), data={**data["data"], "uri": str(random_shards)})
    # The attention the fixture was trained with (sdpa computes the same function, up to
    # float rounding, which AdamW's first steps at lr 0.3 amplify past the tolerance).
    data["attention"] = "eager"
    result = train(parse_train_config(data), export=False)
    new = load_checkpoint(result.checkpoint)
    assert new.path.name == old.path.name
    assert sorted(p.name for p in new.path.iterdir()) == sorted(p.name for p in old.path.iterdir())
    assert new.spec == old.spec
    a, b = old.state(), new.state()
    assert set(a) == set(b) and a["position"] == b["position"] and a["step"] == b["step"]
    assert {k: v.shape for k, v in a["model"].items()} == {
        k: v.shape for k, v in b["model"].items()
    }
    if kind == "dspark":
        # The DSpark recipe changed on purpose since (0.9 x L1 instead of 0.9 x TV, the
        # Markov output and confidence weights from the references' normal init instead
        # of zero: docs/train.md, "Recipe"), so its weights differ; the others' did not.
        return
    for name, tensor in a["model"].items():  # same data, same steps: the same weights
        # Up to float rounding, which AdamW's first steps amplify where a gradient is near
        # zero: the fixture was trained on an AVX-512 host, and on an AVX2 host (other
        # reduction widths) 7 of 2,048 weights of one tensor differed by up to 7.8e-4. A
        # change of recipe moves nearly every weight, so: almost all weights equal to
        # 1e-5, and the tensor as a whole to 1e-3 of its norm.
        got = b["model"][name].float()
        want = tensor.float()
        off = ~torch.isclose(got, want, atol=1e-5, rtol=1e-5)
        assert off.float().mean().item() <= 0.01, (name, int(off.sum()), got.numel())
        assert (got - want).norm() <= 1e-3 * want.norm() + 1e-6, name


def test_latest_pointer_moves_and_a_dangling_one_is_named(tmp_path):
    assert latest_checkpoint(tmp_path) is None and find_checkpoint(tmp_path) is None
    spec_json = (FIXTURE / "dflash" / "checkpoints" / "step-00000002" / "spec.json").read_text()
    config = yaml.safe_dump({"target": "t"})
    first = save_checkpoint(tmp_path, 1, {"model": {}}, spec_json, config)
    second = save_checkpoint(tmp_path, 2, {"model": {}}, spec_json, config)
    assert latest_checkpoint(tmp_path) == second and find_checkpoint(first) == first
    assert load_checkpoint(tmp_path).target == "t"
    (tmp_path / "checkpoints" / "latest").write_text("step-00000009\n")
    with pytest.raises(FileNotFoundError, match="step-00000009, which has no state.pt"):
        load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "checkpoints")
