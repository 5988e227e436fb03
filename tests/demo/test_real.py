"""`make demo-real`'s recipe (pipeline/demo/real.py): what it regenerates and trains fits together.

Read as plain YAML, so the checks hold without the real target's package
(resolving its short name needs `make setup-real`).
"""

from __future__ import annotations

import subprocess
import sys

import yaml

from pipeline.demo import CONFIG_DIR
from pipeline.demo.real import REAL_CONFIG, REAL_DRAFTS
from pipeline.targets.resolve import default_aux_layer_ids


def _yaml(name):
    return yaml.safe_load((CONFIG_DIR / name).read_text())


def test_the_capture_is_the_union_of_the_layers_the_drafts_read():
    captured = _yaml(REAL_CONFIG.name)["target"]["aux_layer_ids"]
    read = {
        name: _yaml(config)["draft"]["aux_layer_ids"]
        for name, (config, _, _) in REAL_DRAFTS.items()
    }
    # DSpark and DFlash: the DFlash spacing for 30 layers; EAGLE-3: vLLM's (2, L//2, L-3).
    assert read["DSpark"] == read["DFlash"] == list(default_aux_layer_ids(30))
    assert read["EAGLE-3"] == [2, 30 // 2, 30 - 3]
    assert captured == sorted(set().union(*read.values()))


def test_the_drafts_share_one_budget_and_one_dataset():
    configs = {config for config, _, _ in REAL_DRAFTS.values()}
    loaded = [_yaml(c) for c in configs]
    assert len({(c["num_steps"], c["global_batch_size"], c["data"]["uri"]) for c in loaded}) == 1
    assert {c["target"] for c in loaded} == {_yaml(REAL_CONFIG.name)["target"]["model"]}
    runs = [run for _, run, _ in REAL_DRAFTS.values()]
    assert len(set(runs)) == len(runs)


def test_steps_without_real_is_a_one_line_usage_error():
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "demo", "--steps", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--steps applies to --real only" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_demo_real_writes_under_runs_real_unless_told(monkeypatch):
    """The CLI only parses and calls: where `demo --real` puts its run, and its budget."""
    from click.testing import CliRunner

    import pipeline.demo.real as real
    from pipeline.cli import cli

    calls = []
    monkeypatch.setattr(real, "run_real_demo", lambda out, **kw: calls.append((out, kw)))
    runner = CliRunner()
    assert runner.invoke(cli, ["demo", "--real"]).exit_code == 0
    assert runner.invoke(cli, ["demo", "--real", "--out", "x", "--steps", "7"]).exit_code == 0
    assert [str(out) for out, _ in calls] == ["runs/real", "x"]
    assert [kw["num_steps"] for _, kw in calls] == [real.REAL_DEMO_STEPS, 7]


def test_the_real_dspark_trains_the_studys_best_cell_and_dflash_stays_ce():
    from pipeline.demo.real import real_train_config

    dspark = real_train_config("runs/real", "ds", "DSpark", num_steps=1)
    dflash = real_train_config("runs/real", "ds", "DFlash", num_steps=1)
    # draft study: dspark+L2+R256+ce1+cefirst09+tv09+warm
    assert dspark.loss.weights("dspark") == (1.0, 0.9, 1.0)
    assert dspark.loss.ce_first_fraction == 0.9
    assert (dspark.draft.num_layers, dspark.draft.markov_rank) == (2, 256)
    assert dflash.loss.weights("dflash") == (1.0, 0.0, 0.0)
    assert (dflash.draft.kind, dflash.draft.num_layers, dflash.init_from) == ("dflash", 1, None)


def test_dspark_starts_from_the_dflash_draft_trained_before_it():
    from pipeline.demo.real import REAL_WARM_FROM, real_train_config

    order = list(REAL_DRAFTS)
    for name, source in REAL_WARM_FROM.items():
        assert order.index(source) < order.index(name)
        warm = real_train_config("out", "ds", name, num_steps=1)
        assert warm.init_from == real_train_config("out", "ds", source, num_steps=1).out_dir
    # The source's draft vocabulary and layers match (warm_start checks them at step 0).
    dspark = real_train_config("out", "ds", "DSpark", num_steps=1)
    dflash = real_train_config("out", "ds", "DFlash", num_steps=1)
    assert dspark.draft.draft_vocab_size == dflash.draft.draft_vocab_size
    assert dspark.draft.aux_layer_ids == dflash.draft.aux_layer_ids
    assert dspark.data == dflash.data
