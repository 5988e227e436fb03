"""The evaluation stage end to end on the trained toy target and a small trained draft.

Marked slow: the session fixture trains a draft (~1 min with the shards).
"""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.config import ConfigError
from pipeline.evaluate.calibration import Calibration
from pipeline.evaluate.config import parse_eval_config
from pipeline.evaluate.drafting import ModelDrafter, load_draft
from pipeline.evaluate.offline import anchor_table, walk
from pipeline.evaluate.run import load_heldout, run_evaluation
from pipeline.evaluate.sampling import HFVerifier, live_decode

pytestmark = pytest.mark.slow


def _config(run_dir, out_dir, **extra):
    return parse_eval_config(
        dict(
            target="toy:trained",
            out_dir=str(out_dir),
            drafts=[
                dict(name="DSpark", path=str(run_dir)),
                dict(name="DSpark backbone", path=str(run_dir), use_heads=False),
                dict(name="EAGLE-3", note="not built"),
                dict(name="untrained", path=str(run_dir), untrained=True),
            ],
            **extra,
        )
    )


def test_report_files_tables_and_stored_calibration(dspark_run, tmp_path):
    config = _config(
        dspark_run,
        tmp_path / "eval",
        live=dict(temperatures=[1.0], num_prompts=2, max_new_tokens=32),
    )
    result = run_evaluation(config)
    report = json.loads(result.json_path.read_text())
    drafts = report["drafts"]
    assert report["data"]["heldout_fraction"] == 0.25  # taken from the training run
    trained, floor = drafts["DSpark"]["offline_t0"], drafts["untrained"]["offline_t0"]
    assert trained["tau"] > floor["tau"] >= 1.0
    taus = trained["tau_by_domain"]
    assert len(taus) >= 3
    assert trained["tau_macro"] == pytest.approx(sum(taus.values()) / len(taus), abs=1e-3)
    assert drafts["EAGLE-3"] == {"available": False, "note": "not built"}
    live = drafts["DSpark"]["live"]["1.0"]
    assert live["num_samples"] == 2 and live["tau"] >= 1.0
    # Calibration: fitted on one half, stored beside the export, loadable.
    cal = drafts["DSpark"]["calibration"]
    stored = Calibration.load(dspark_run / "export")
    assert list(stored.temperatures) == pytest.approx(cal["temperatures"], abs=1e-4)
    assert all(t > 0 for t in stored.temperatures)
    rows = drafts["DSpark"]["truncation"]
    assert rows[0]["threshold"] == 0.0 and rows[0]["verify_rate"] == 1.0
    assert all(r["verify_rate"] <= 1.0 and r["tau"] >= 1.0 for r in rows)
    assert "calibration" not in drafts["untrained"]
    # Markdown and plots.
    text = result.markdown_path.read_text()
    assert "| DSpark |" in text and "| EAGLE-3 |" in text
    for path in result.plots.values():
        assert path.read_bytes()[:4] == b"\x89PNG"


def test_evaluating_trained_samples_is_refused(dspark_run, tmp_path):
    config = _config(dspark_run, tmp_path, data=dict(heldout_fraction=0.5))
    with pytest.raises(ValueError, match="trained on; lower data.heldout_fraction to at most 0.25"):
        run_evaluation(config)


def test_cli_reports_config_errors_with_the_key(tmp_path):
    from click.testing import CliRunner

    from pipeline.cli import cli

    bad = tmp_path / "eval.yaml"
    bad.write_text("target: toy:trained\nout_dir: x\ndrafts: [{name: a, pth: y}]\n")
    result = CliRunner().invoke(cli, ["evaluate", "--config", str(bad)])
    assert result.exit_code == 1
    assert "drafts.0.pth: unknown key" in result.output
    with pytest.raises(ConfigError):
        parse_eval_config({"target": "t", "out_dir": "o", "drafts": []}, "x")


def test_live_loop_at_t0_reproduces_the_offline_walk(dspark_run, trained_target_dir):
    """Temperature 0 in the live loop (HF target, rejection sampling with one-hot
    distributions) walks the same trajectory and accepts the same tokens per round."""
    draft = load_draft(dspark_run, target_dir=trained_target_dir)
    config = _config(dspark_run, dspark_run / "unused")
    samples, _ = load_heldout(
        config, {"DSpark": draft.train_config}, {"DSpark": draft.spec}, trained_target_dir
    )
    drafter = ModelDrafter("DSpark", draft.model)
    verifier = HFVerifier(str(trained_target_dir), draft.spec.aux_layer_ids)
    compared = 0
    for sample in samples[:4]:
        p = sample.num_prompt_tokens
        run = live_decode(
            model=draft.model,
            verifier=verifier,
            prompt=sample.input_ids[:p].tolist(),
            max_new_tokens=sample.num_generated_tokens,
            temperature=0.0,
            generator=torch.Generator().manual_seed(0),
        )
        if run.output != sample.input_ids[p:].tolist():
            continue  # batched HF generate chose another greedy path (ties): not comparable
        table = anchor_table(sample, drafter)
        anchors = walk(accepted=table.accepted, start=table.start, end=table.end)
        assert run.accepted == table.accepted[anchors].tolist()
        compared += 1
    assert compared >= 3


def test_exports_load_as_the_checkpoint_they_came_from(dspark_run, trained_target_dir):
    """A speculators export (what vLLM serves) drafts exactly like the training checkpoint."""
    ckpt = load_draft(dspark_run, target_dir=trained_target_dir)
    export = load_draft(dspark_run / "export", target_dir=trained_target_dir)
    backbone = load_draft(dspark_run / "export-dflash", target_dir=trained_target_dir)
    assert export.spec == ckpt.spec
    assert backbone.spec.kind == "dflash" and backbone.spec.markov_rank == 0
    config = _config(dspark_run, dspark_run / "unused")
    samples, _ = load_heldout(
        config, {"DSpark": ckpt.train_config}, {"DSpark": ckpt.spec}, trained_target_dir
    )
    sample = samples[0]
    anchors = torch.arange(sample.num_prompt_tokens, len(sample.input_ids) - 1)
    full = ModelDrafter("c", ckpt.model).draft(sample, anchors)
    assert torch.equal(ModelDrafter("e", export.model).draft(sample, anchors).tokens, full.tokens)
    no_heads = ModelDrafter("c", ckpt.model, use_heads=False).draft(sample, anchors)
    assert torch.equal(
        ModelDrafter("b", backbone.model).draft(sample, anchors).tokens, no_heads.tokens
    )
    with pytest.raises(FileNotFoundError, match="not a training run"):
        load_draft(dspark_run / "metrics.jsonl", target_dir=trained_target_dir)
