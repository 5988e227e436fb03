"""`run_evaluation(config)`: the evaluation stage from config to report.

1. loads the target's head and every draft (trained, untrained copies, and
   placeholders for baselines without a checkpoint);
2. opens the held-out split of the dataset (pipeline/evaluate/heldout.py),
   checking that no evaluated sample was trained on (the eval held-out fraction
   may not exceed any draft's training fraction: the split is a hash threshold
   on the sample id) and that the data was captured from this target with the
   drafts' layers (each draft reads its own subset of them: `select_layers`);
3. T=0: the exact offline walk per draft (tau per domain, macro, per position;
   pipeline/evaluate/draft_row.py);
4. confidence head: calibration fitted on one half of the held-out samples,
   reported on the other, stored beside the export; truncation sweep;
5. T>0: the live loop with rejection sampling (HF reference target);
6. optionally the vLLM cross-check;
7. optionally the serving benchmark (pipeline/evaluate/serving.py): speed in
   vLLM with and without each exported draft;
8. report.json, report.md, PNG plots under `out_dir`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.drafts.registry import drafts_with_heads
from pipeline.evaluate.config import EvalConfig
from pipeline.evaluate.draft_row import evaluate_draft
from pipeline.evaluate.heldout import draft_samples, load_heldout, round_robin_prompts
from pipeline.logs import kv

if TYPE_CHECKING:
    from pipeline.drafts.drafter import Drafter
    from pipeline.drafts.load import LoadedDraft
    from pipeline.shards.reader import TrainingSample

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    out_dir: Path
    report: dict[str, Any]
    json_path: Path
    markdown_path: Path
    plots: dict[str, Path]
    # With a source left out of training (demo_report's `left_out`): the same drafts on
    # every sample of it, and per draft held-out / left-out tau and their ratio.
    left_out: EvalResult | None = None
    generalisation: dict[str, dict] | None = None

    @property
    def ok(self) -> bool:
        """False when the vLLM cross-check ran and fell outside its tolerance."""
        v = self.report.get("vllm")
        return not v or bool(v["within_tolerance"])

    def lines(self) -> list[str]:
        from pipeline.evaluate.report import t0_caveat, tau_table

        lines = [line for line in [t0_caveat(self.report)] if line]
        lines += [tau_table(self.report), ""]
        v = self.report.get("vllm")
        if v:
            lines.append(
                f"vLLM cross-check: tau {v['vllm_tau']:.3f} vs offline {v['offline_tau']:.3f} "
                f"(gap {v['relative_gap']:.2%}, tolerance {v['tolerance']:.0%}): "
                f"{'ok' if v['within_tolerance'] else 'OUTSIDE TOLERANCE'}"
            )
        for name, e in (self.report.get("serving") or {}).get("engines", {}).items():
            if not e.get("served"):
                lines.append(f"serving {name}: not served ({e['reason']})")
                continue
            e2e = e.get("single_stream_e2e_speedup")
            lines.append(
                f"serving {name}: {e['single_stream']['e2e_tok_s']} tok/s end to end single "
                f"stream"
                + (
                    f", speedup {e2e['ratio']} (95% CI {e2e['ci95'][0]}-{e2e['ci95'][1]})"
                    if e2e
                    else ""
                )
            )
        lines.append(f"report: {self.json_path}, {self.markdown_path}")
        lines += [f"plot ({k}): {p}" for k, p in self.plots.items()]
        return lines


def run_evaluation(config: EvalConfig) -> EvalResult:
    """Evaluate every draft of `config` (see the module docstring)."""
    from pipeline.torch_threads import torch_threads

    with torch_threads(config.num_threads):
        return _run_evaluation(config)


def _run_evaluation(config: EvalConfig) -> EvalResult:
    from pipeline.evaluate.report import write_report
    from pipeline.targets.resolve import resolve_model

    started = time.monotonic()
    out_dir = Path(config.out_dir)
    target_dir = Path(resolve_model(config.target))
    loaded, train_configs = _load_drafts(config, target_dir)
    samples, data_info = load_heldout(
        config, train_configs, {n: d.spec for n, d in loaded.items()}, target_dir
    )
    run = _Evaluation(config, target_dir, loaded, samples, data_info)
    log.info("evaluating %s", kv(drafts=len(loaded), samples=len(samples), target=config.target))
    verifier = _reference_target(run)
    drafts, drafters = _offline_rows(run, verifier)
    if config.live is not None and drafters:
        _live_rows(run, drafts, drafters, verifier)
    if verifier is not None:
        verifier.target.close()

    report: dict[str, Any] = {"target": config.target, "data": data_info, "drafts": drafts}
    report["seconds"] = round(time.monotonic() - started, 1)
    json_path, md_path, plots = write_report(report, out_dir)
    if config.vllm is not None:
        # Written first: a failed engine start must not lose the offline and live results.
        report["vllm"] = _vllm_check(run)
        report["seconds"] = round(time.monotonic() - started, 1)
        json_path, md_path, plots = write_report(report, out_dir)
    if config.serving is not None:
        report["serving"] = _serving(run, report)
        report["seconds"] = round(time.monotonic() - started, 1)
        json_path, md_path, plots = write_report(report, out_dir)
    return EvalResult(out_dir, report, json_path, md_path, plots)


@dataclass
class _Evaluation:
    """What every step of an evaluation reads: the config, the target, the loaded drafts
    (by row name; rows may share one) and the held-out samples with their description."""

    config: EvalConfig
    target_dir: Path
    loaded: dict[str, LoadedDraft]
    samples: list[TrainingSample]
    data_info: dict[str, Any]


def _load_drafts(
    config: EvalConfig, target_dir: Path
) -> tuple[dict[str, LoadedDraft], dict[str, dict]]:
    """Every row's draft that has a checkpoint (loaded once per source, over the
    target's shared embeddings and lm_head), and the training configs of the trained ones."""
    from pipeline.drafts.load import load_draft
    from pipeline.drafts.target_head import load_target_head

    loaded, train_configs, by_source = {}, {}, {}
    target_head = load_target_head(target_dir)  # embeddings and lm_head, shared by every draft
    for entry in config.drafts:
        if entry.path is None:
            continue
        key = (str(entry.path), entry.untrained)  # rows may share one draft (use_heads)
        if key not in by_source:
            by_source[key] = load_draft(
                entry.path,
                target_dir=target_dir,
                untrained=entry.untrained,
                seed=config.seed,
                target_head=target_head,
            )
        draft = loaded[entry.name] = by_source[key]
        if draft.train_config is not None and not entry.untrained:
            train_configs[entry.name] = draft.train_config
    return loaded, train_configs


def _reference_target(run: _Evaluation):
    """The HF reference target for the live loop and live calibration (built once,
    when either is asked for), else None."""
    config, loaded = run.config, run.loaded
    if not (loaded and (config.live is not None or config.calibration.temperature > 0)):
        return None
    from pipeline.evaluate.sampling import HFVerifier

    return HFVerifier(str(run.target_dir), next(iter(loaded.values())).spec.aux_layer_ids)


def _offline_rows(run: _Evaluation, verifier) -> tuple[dict[str, dict], dict[str, Drafter]]:
    """Every row of the report at T=0 (pipeline/evaluate/draft_row.py), a placeholder
    for a draft without a checkpoint; and each evaluated row's drafter."""
    from pipeline.drafts.load import make_drafter
    from pipeline.evaluate.calibration import in_calibration_split

    fit_frac = run.config.calibration.fit_fraction
    fit_samples = [s for s in run.samples if in_calibration_split(s.sample_id, fit_frac)]
    eval_samples = [s for s in run.samples if not in_calibration_split(s.sample_id, fit_frac)]
    drafts: dict[str, dict] = {}
    drafters: dict[str, Drafter] = {}
    for entry in run.config.drafts:
        if entry.name not in run.loaded:
            drafts[entry.name] = {"available": False, "note": entry.note or "no checkpoint given"}
            continue
        draft = run.loaded[entry.name]
        drafter = drafters[entry.name] = make_drafter(entry.name, draft, use_heads=entry.use_heads)
        drafts[entry.name] = evaluate_draft(
            run.config,
            entry,
            draft,
            drafter,
            draft_samples(fit_samples, run.data_info, draft.spec),
            draft_samples(eval_samples, run.data_info, draft.spec),
            None if verifier is None else verifier.reading(draft.spec.aux_layer_ids),
        )
    return drafts, drafters


def _live_rows(
    run: _Evaluation, drafts: dict[str, dict], drafters: dict[str, Drafter], verifier
) -> None:
    """Each drafter's live loop at every `live.temperatures` (rejection sampling against
    the reference target), added to its row as `live`."""
    from pipeline.evaluate.sampling import live_report

    live_config = run.config.live
    prompts = round_robin_prompts(run.samples, live_config.num_prompts)
    for name, drafter in drafters.items():
        drafts[name]["live"] = {}
        for temp in live_config.temperatures:
            started = time.monotonic()
            live = live_report(
                drafter=drafter,
                verifier=verifier.reading(run.loaded[name].spec.aux_layer_ids),
                samples=prompts,
                temperature=temp,
                max_new_tokens=live_config.max_new_tokens,
                seed=run.config.seed,
                samples_per_prompt=live_config.samples_per_prompt,
            )
            drafts[name]["live"][str(temp)] = live
            log.info(
                "live T=%s %s",
                temp,
                kv(
                    draft=name,
                    tau=round(live["tau"], 3),
                    macro=round(live["tau_macro"], 3),
                    seconds=round(time.monotonic() - started),
                ),
            )


def _vllm_check(run: _Evaluation) -> dict[str, Any]:
    """The `vllm` section: the configured draft's tau in vLLM against its offline tau."""
    from pipeline.evaluate.vllm import check_against_vllm

    vc = run.config.vllm
    prompts = [
        s.input_ids[: s.num_prompt_tokens].tolist()
        for s in round_robin_prompts(run.samples, vc.num_prompts)
    ]
    if vc.draft not in run.loaded:
        raise ValueError(f"vllm.draft {vc.draft!r} has no export directory to serve")
    return check_against_vllm(vc, run.loaded[vc.draft], prompts, str(run.target_dir)).to_dict()


def _serving(run: _Evaluation, report: dict[str, Any]) -> dict[str, Any]:
    """The `serving` section (`serve_drafts`); on an identity mismatch the report is
    written with the failed section first, then the failure raised."""
    from pipeline.evaluate.identity import IdentityMismatch
    from pipeline.evaluate.report import write_report

    config = run.config
    try:
        return serve_drafts(
            config, config.served_drafts(), run.loaded, run.samples, run.data_info, run.target_dir
        )
    except IdentityMismatch as error:  # the report first, then the loud failure
        report["serving"] = error.section  # type: ignore[attr-defined]
        write_report(report, Path(config.out_dir))
        raise


def serve_drafts(
    config: EvalConfig,
    names: list[str],
    loaded: dict[str, LoadedDraft],
    samples: list[TrainingSample],
    data_info: dict,
    target_dir: Path,
) -> dict[str, Any]:
    """The serving benchmark (pipeline/evaluate/serving.py) on held-out prompts, with each
    served draft's offline T=0 tau on the same prompts' stored answers (cut to the
    draft's layers) beside vLLM's."""
    import json

    from pipeline.drafts.load import make_drafter
    from pipeline.evaluate.offline import build_tables, tau, walk_tables
    from pipeline.evaluate.serving import run_serving

    sc = config.serving
    assert sc is not None
    picked = round_robin_prompts(samples, sc.num_prompts)
    exports = {n: loaded[n].export_dir if n in loaded else None for n in names}
    offline = {}
    for name, export in exports.items():
        if export is None:
            continue
        exported = json.loads((export / "config.json").read_text())
        # Draft offline as vLLM drafts: a DSpark draft's dflash export with its heads only
        # where the project's vLLM plugin serves them.
        drafter = make_drafter(
            name, loaded[name], use_heads=drafts_with_heads(exported, str(export))
        )
        own = draft_samples(picked, data_info, loaded[name].spec)
        rounds = walk_tables(build_tables(own, drafter), num_draft_tokens=drafter.num_draft_tokens)
        offline[name] = round(tau(accepted=rounds.accepted), 4)
    return run_serving(
        sc,
        target_dir=str(target_dir),
        exports=exports,
        prompts=[s.input_ids[: s.num_prompt_tokens].tolist() for s in picked],
        out_dir=Path(config.out_dir),
        offline_tau=offline,
    )


def demo_report(
    out_dir: str | Path,
    *,
    dspark: str | Path,
    dflash: str | Path | None = None,
    eagle3: str | Path | None = None,
    vllm: bool = False,
    live_prompts: int = 0,
    left_out: Sequence[str] = (),
    print_fn=print,
) -> EvalResult:
    """The evaluation step of `make demo`: evaluate the demo's drafts, print table + plot paths.

    `dspark`: the demo's training run directory (or an export). Rows: the
    DSpark draft, its backbone alone (what vLLM serves without the project's plugin), the DFlash
    and EAGLE-3 drafts that are given (only drafts that were trained), and an
    untrained copy (the floor). `left_out`: corpus sources every draft was trained
    without; the held-out split then excludes them, a second evaluation reads every
    sample of them, and a table gives each draft's tau on both and their ratio.
    """
    from pipeline.drafts.load import draft_target
    from pipeline.evaluate.config import parse_eval_config

    drafts: list[dict] = [
        {"name": "DSpark", "path": str(dspark)},
        {"name": "DSpark backbone", "path": str(dspark), "use_heads": False},
        *([{"name": "DFlash", "path": str(dflash)}] if dflash else []),
        *([{"name": "EAGLE-3", "path": str(eagle3)}] if eagle3 else []),
        {"name": "untrained", "path": str(dspark), "untrained": True},
    ]
    data: dict[str, Any] = {
        "target": draft_target(dspark),
        "drafts": drafts,
        "out_dir": str(Path(out_dir)),
    }
    if live_prompts:
        data["live"] = {"temperatures": [1.0], "num_prompts": live_prompts, "max_new_tokens": 96}
    if vllm:
        data["vllm"] = {"draft": "DSpark", "num_prompts": 6}
    if left_out:
        data["data"] = {"exclude_sources": list(left_out)}
    result = run_evaluation(parse_eval_config(data, "demo_report"))
    for line in result.lines():
        print_fn(line)
    if not left_out:
        return result
    from pipeline.evaluate.generalisation import generalisation, generalisation_table

    other = {
        **data,
        "drafts": [d for d in drafts if not d.get("untrained")],
        "out_dir": str(Path(out_dir) / "left-out"),
        "data": {"sources": list(left_out), "split": "all"},
    }
    other.pop("live", None)
    other.pop("vllm", None)
    result.left_out = run_evaluation(parse_eval_config(other, "demo_report"))
    result.generalisation = generalisation(result.report, result.left_out.report)
    print_fn(generalisation_table(result.generalisation, list(left_out)))
    return result
