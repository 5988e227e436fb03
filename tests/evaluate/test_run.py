"""The evaluation stage end to end on the trained toy target and a small trained draft.

Marked slow: the session fixture trains a draft (~1 min with the shards).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from pipeline.config import ConfigError
from pipeline.drafts.dspark.drafter import DSparkDrafter
from pipeline.drafts.load import load_draft, make_drafter
from pipeline.evaluate.calibration import Calibration
from pipeline.evaluate.config import parse_eval_config
from pipeline.evaluate.offline import anchor_table, walk
from pipeline.evaluate.run import (
    EvalResult,
    demo_report,
    draft_samples,
    load_heldout,
    run_evaluation,
)
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


def test_calibration_is_fitted_at_the_serving_temperature(dspark_run, tmp_path):
    """calibration.temperature 1: temperatures fitted on the live loop's T=1 verdicts,
    recorded in the stored file, which refuses to serve another temperature."""
    config = _config(
        dspark_run,
        tmp_path / "eval",
        calibration=dict(temperature=1.0, num_prompts=3, max_new_tokens=32),
    )
    cal = run_evaluation(config).report["drafts"]["DSpark"]["calibration"]
    assert cal["sampling_temperature"] == 1.0 and cal["fit_samples"] == 3
    assert sum(cal["metrics"]["events"]) > 0
    stored = Calibration.load(dspark_run / "export", temperature=1.0)
    assert stored.sampling_temperature == 1.0
    assert list(stored.temperatures) == pytest.approx(cal["temperatures"], abs=1e-4)
    with pytest.raises(ValueError, match="fitted at sampling temperature 1.0, asked for 0"):
        Calibration.load(dspark_run / "export", temperature=0.0)


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


def _live_equals_offline(run_dir, target_dir, name: str, use_heads: bool = True) -> int:
    """Samples on which the live loop at T=0 accepted what the offline walk accepts per round.

    The two read their target features from different engines (the shard's
    vLLM capture offline, the HF verifier live), rounded to bfloat16 each: a
    draft whose two best tokens tie within that rounding may pick the other
    one. So each live round is compared with the offline table at the live
    round's own anchor (one flipped tie does not shift the rounds after it),
    and a sample may differ in at most one round, all samples in at most 5%.
    """
    draft = load_draft(run_dir, target_dir=target_dir)
    config = _config(run_dir, run_dir / "unused")
    samples, _ = load_heldout(config, {name: draft.train_config}, {name: draft.spec}, target_dir)
    drafter = make_drafter(name, draft, use_heads=use_heads)
    verifier = HFVerifier(str(target_dir), draft.spec.aux_layer_ids)
    compared, rounds, differing = 0, 0, 0
    for sample in samples[:4]:
        p = sample.num_prompt_tokens
        run = live_decode(
            drafter=drafter,
            verifier=verifier,
            prompt=sample.input_ids[:p].tolist(),
            max_new_tokens=sample.num_generated_tokens,
            temperature=0.0,
            generator=torch.Generator().manual_seed(0),
        )
        if run.output != sample.input_ids[p:].tolist():
            continue  # batched HF generate chose another greedy path (ties): not comparable
        table = anchor_table(sample, drafter)
        # The live rounds' anchors: the first answer token, then one past each round's tokens.
        anchors = [table.start]
        for acc in run.accepted[:-1]:
            anchors.append(anchors[-1] + acc + 1)
        offline = table.accepted[anchors].tolist()
        here = sum(a != b for a, b in zip(run.accepted, offline, strict=True))
        assert here <= 1, f"{sample.sample_id}: live {run.accepted} offline {offline}"
        rounds += len(offline)
        differing += here
        if here == 0:
            # Without a flipped tie the live loop walks exactly the offline walk's rounds.
            assert anchors == walk(accepted=table.accepted, start=table.start, end=table.end)
        assert max(run.accepted) > 0  # a trained draft: rounds do accept tokens
        compared += 1
    verifier.target.close()
    assert differing <= 0.05 * rounds, (differing, rounds)
    return compared


def test_live_loop_at_t0_reproduces_the_offline_walk(dspark_run, trained_target_dir):
    """Temperature 0 in the live loop (HF target, rejection sampling with one-hot
    distributions) walks the same trajectory and accepts the same tokens per round."""
    assert _live_equals_offline(dspark_run, trained_target_dir, "DSpark") >= 3


def test_eagle3_evaluates_offline_live_and_from_its_export(
    eagle3_run, dspark_run, trained_target_dir, tmp_path
):
    """EAGLE-3 drafts step by step from its own hidden states: its export drafts like its
    checkpoint, the live loop at T=0 reproduces the offline walk, and the report ranks it
    above its untrained copy beside the DSpark draft."""
    assert _live_equals_offline(eagle3_run, trained_target_dir, "EAGLE-3") >= 3
    ckpt = load_draft(eagle3_run, target_dir=trained_target_dir)
    export = load_draft(eagle3_run / "export", target_dir=trained_target_dir)
    assert export.spec == ckpt.spec and ckpt.spec.kind == "eagle3"
    config = _config(eagle3_run, eagle3_run / "unused")
    samples, _ = load_heldout(
        config, {"EAGLE-3": ckpt.train_config}, {"EAGLE-3": ckpt.spec}, trained_target_dir
    )
    anchors = torch.arange(samples[0].num_prompt_tokens, len(samples[0].input_ids) - 1)
    a = make_drafter("c", ckpt).draft(samples[0], anchors).tokens
    assert torch.equal(make_drafter("e", export).draft(samples[0], anchors).tokens, a)

    config = parse_eval_config(
        dict(
            target="toy:trained",
            out_dir=str(tmp_path),
            drafts=[
                dict(name="DSpark", path=str(dspark_run)),
                dict(name="EAGLE-3", path=str(eagle3_run)),
                dict(name="EAGLE-3 untrained", path=str(eagle3_run), untrained=True),
            ],
            live=dict(temperatures=[1.0], num_prompts=2, max_new_tokens=32),
        )
    )
    drafts = run_evaluation(config).report["drafts"]
    eagle = drafts["EAGLE-3"]
    assert eagle["kind"] == "eagle3" and "calibration" not in eagle  # no confidence head
    assert eagle["offline_t0"]["num_draft_tokens"] == 5
    assert eagle["offline_t0"]["tau"] > drafts["EAGLE-3 untrained"]["offline_t0"]["tau"]
    assert eagle["live"]["1.0"]["tau"] >= 1.0 and eagle["live"]["1.0"]["num_rounds"] > 0


def test_exports_load_as_the_checkpoint_they_came_from(dspark_run, trained_target_dir):
    """A speculators export (what vLLM serves) drafts exactly like the training checkpoint:
    a fill-in DSpark draft exports its DFlash backbone with its heads beside, which drafts
    like it with heads and, heads off, like its backbone."""
    ckpt = load_draft(dspark_run, target_dir=trained_target_dir)
    export = load_draft(dspark_run / "export", target_dir=trained_target_dir)
    assert ckpt.export_dir == dspark_run / "export"
    assert export.spec == ckpt.spec
    config = _config(dspark_run, dspark_run / "unused")
    samples, _ = load_heldout(
        config, {"DSpark": ckpt.train_config}, {"DSpark": ckpt.spec}, trained_target_dir
    )
    sample = samples[0]
    anchors = torch.arange(sample.num_prompt_tokens, len(sample.input_ids) - 1)
    for heads in (True, False):
        mine = DSparkDrafter("c", ckpt.model, use_heads=heads).draft(sample, anchors)
        served = DSparkDrafter("e", export.model, use_heads=heads).draft(sample, anchors)
        assert torch.equal(served.tokens, mine.tokens)
    with pytest.raises(FileNotFoundError, match="not a training run"):
        load_draft(dspark_run / "metrics.jsonl", target_dir=trained_target_dir)


def test_demo_report_prints_the_table_and_plot_paths(dspark_run, eagle3_run, tmp_path):
    """`make demo`'s last step: rows for the drafts given, and no others (no n/a rows)."""
    lines: list[str] = []
    result = demo_report(
        tmp_path / "eval", dspark=dspark_run, eagle3=eagle3_run, print_fn=lines.append
    )
    text = "\n".join(lines)
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in text.splitlines()
        if line.startswith("| ")
    }
    assert {"DSpark", "DSpark backbone", "EAGLE-3", "untrained"} <= set(rows)
    assert "DFlash" not in rows  # not given: no placeholder row
    for name in (
        "EAGLE-3",
        "DSpark",
    ):  # a macro tau (its interval is n/a when a domain has 1 sample)
        assert re.search(r"\*\*\d\.\d\d\*\*", rows[name]), rows[name]
    for path in result.plots.values():
        assert f": {path}" in text and path.exists()
    assert result.report["drafts"]["EAGLE-3"]["kind"] == "eagle3"


def test_lossy_or_sampled_data_is_refused_or_reported_as_teacher_forced(tmp_path):
    """fp8 shards hold other features than the target computed: the T=0 walk is refused,
    naming the dataset, the field and the fix, unless the config asks for teacher-forced
    agreement, which the report and the printed lines then say."""
    from pipeline.demo.reference_shards import write_reference_shards
    from pipeline.evaluate.report import markdown
    from pipeline.targets.resolve import resolve_model

    uri = tmp_path / "fp8"
    write_reference_shards(
        uri, target="toy:random", aux_layer_ids=(1,), num_conversations=16, codec="fp8"
    )
    target_dir = Path(resolve_model("toy:random"))

    def config(**data):
        return parse_eval_config(
            dict(
                target="toy:random",
                out_dir=str(tmp_path / "eval"),
                drafts=[dict(name="d", path="unused")],
                data=dict(uri=str(uri), heldout_fraction=0.5, **data),
            )
        )

    with pytest.raises(ValueError) as err:
        load_heldout(config(), {}, {}, target_dir)
    message = str(err.value)
    assert str(uri) in message and "codec is 'fp8'" in message
    assert "output.codec: bf16" in message and "data.report_as_teacher_forced: true" in message
    _, info = load_heldout(config(report_as_teacher_forced=True), {}, {}, target_dir)
    assert info["t0_measure"] == "teacher-forced agreement" and "fp8" in info["t0_inexact"][0]
    from pipeline.table.dataset import Dataset
    from pipeline.table.pins import pinned_versions

    assert pinned_versions(Dataset.open(uri)) == {}  # pinned while read, released after
    report = {"target": "toy:random", "data": info, "drafts": {}}
    assert "teacher-forced agreement, not acceptance" in markdown(report, {})
    result = EvalResult(tmp_path, report, tmp_path / "r.json", tmp_path / "r.md", {})
    assert result.lines()[0].startswith("T=0 tau below is teacher-forced agreement")


def test_drafts_on_different_layer_subsets_evaluate_on_their_own_columns(
    eval_shards, trained_target_dir, tmp_path
):
    """Two drafts of one dataset (captured 1, 2, 3), reading (1, 3) and (2,): each one's
    offline walk is the walk over the held-out rows as the training reader decodes them for
    its layers (DatasetSplit.read_layers), and the live loop hands each its own features."""
    from draft_specs import train_small_draft

    from pipeline.evaluate.heldout import MAX_SEQ_LEN
    from pipeline.evaluate.offline import build_tables, summarize_rounds, walk_tables
    from pipeline.table.split import DatasetSplit

    subsets = {"DFlash 1,3": [1, 3], "EAGLE-3 2": [2]}
    kinds = {"DFlash 1,3": "dflash", "EAGLE-3 2": "eagle3"}
    for name, layers in subsets.items():
        draft = dict(kind=kinds[name], num_layers=1, block_size=4, aux_layer_ids=layers)
        train_small_draft(eval_shards, tmp_path / name, draft, num_steps=4, heldout_fraction=0.25)
    config = parse_eval_config(
        dict(
            target="toy:trained",
            data=dict(uri=str(eval_shards)),
            out_dir=str(tmp_path / "eval"),
            drafts=[dict(name=name, path=str(tmp_path / name)) for name in subsets],
            live=dict(temperatures=[1.0], num_prompts=1, max_new_tokens=12),
        )
    )
    report = run_evaluation(config).report
    assert report["data"]["aux_layer_ids"] == [1, 2, 3]
    for name, layers in subsets.items():
        row = report["drafts"][name]
        assert row["aux_layer_ids"] == layers
        assert row["live"]["1.0"]["num_rounds"] > 0
        split = DatasetSplit(str(eval_shards), heldout_fraction=0.25, max_seq_len=MAX_SEQ_LEN)
        split.read_layers(layers)
        samples = split.decode(split.heldout_rows)
        assert samples[0].hidden_states.shape[1] == len(layers) * split.provenance.hidden_size
        drafter = make_drafter(name, load_draft(tmp_path / name, target_dir=trained_target_dir))
        tables = build_tables(samples, drafter)
        want = summarize_rounds(
            rounds=walk_tables(tables, num_draft_tokens=drafter.num_draft_tokens),
            num_samples=len(tables),
        )
        assert row["offline_t0"]["tau"] == pytest.approx(want.tau, abs=1e-4)  # 4 decimals
        assert row["offline_t0"]["num_rounds"] == want.num_rounds
        # What the evaluation walks: the held-out rows cut to the draft's columns.
        draft = load_draft(tmp_path / name, target_dir=trained_target_dir)
        held, info = load_heldout(
            config, {name: draft.train_config}, {name: draft.spec}, trained_target_dir
        )
        cut = {s.sample_id: s for s in draft_samples(held, info, draft.spec)}
        assert len(cut) == len(samples)
        for s in samples:
            assert torch.equal(cut[s.sample_id].hidden_states, s.hidden_states)
