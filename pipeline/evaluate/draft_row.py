"""One draft's row of the evaluation report: the offline T=0 walk and its calibration.

`evaluate_draft` walks every held-out sample exactly at T=0 (tau per domain, macro,
per position) and, for a confidence head, fits the calibration on one half of the
samples and reports it on the other, at the temperature the draft will serve
(`calibration.temperature`; > 0: events of the live loop against the reference
target), with the truncation sweep at T=0; the calibration is stored beside the
draft's export when asked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.evaluate.config import DraftEntry, EvalConfig
from pipeline.evaluate.heldout import round_robin_prompts
from pipeline.logs import kv

if TYPE_CHECKING:
    from pipeline.drafts.drafter import Drafter
    from pipeline.drafts.load import LoadedDraft
    from pipeline.shards.reader import TrainingSample

log = logging.getLogger(__name__)


@dataclass
class _Halves:
    """The held-out samples of a draft, and their walk tables, as calibration splits them:
    fitted on one half, reported on the other."""

    fit_samples: list[TrainingSample]
    eval_samples: list[TrainingSample]
    fit_tables: list
    eval_tables: list


def evaluate_draft(
    config: EvalConfig,
    entry: DraftEntry,
    draft: LoadedDraft,
    drafter: Drafter,
    fit_samples: list[TrainingSample],
    eval_samples: list[TrainingSample],
    verifier=None,
) -> dict[str, Any]:
    """One draft's row: the exact offline walk at T=0 over all held-out samples and, for
    a confidence head, calibration fitted on `fit_samples`, reported on `eval_samples`,
    at the temperature it will serve (`calibration.temperature`; > 0: events of the
    live loop against `verifier`, the truncation sweep then omitted: it walks at T=0)."""
    from pipeline.evaluate.offline import build_tables

    halves = _Halves(
        fit_samples,
        eval_samples,
        fit_tables=build_tables(fit_samples, drafter),
        eval_tables=build_tables(eval_samples, drafter),
    )
    result = _offline_row(entry, draft, drafter, halves.fit_tables + halves.eval_tables)
    if entry.note:
        result["note"] = entry.note
    calibrate = config.calibration.enabled and drafter.has_confidence and not entry.untrained
    if calibrate and halves.fit_tables and halves.eval_tables:
        result.update(_calibration_sections(config, draft, drafter, halves, verifier))
    offline = result["offline_t0"]
    log.info("offline T=0 %s", kv(draft=entry.name, tau=offline["tau"], macro=offline["tau_macro"]))
    return result


def _offline_row(
    entry: DraftEntry, draft: LoadedDraft, drafter: Drafter, tables: list
) -> dict[str, Any]:
    """What the draft is, and its exact offline walk at T=0 over `tables`."""
    from pipeline.evaluate.offline import summarize_rounds, walk_tables

    return {
        "available": True,
        "source": str(draft.source),
        "untrained": entry.untrained,
        "kind": draft.spec.kind,
        "use_heads": entry.use_heads,
        "block_size": draft.spec.block_size,
        "aux_layer_ids": list(draft.spec.aux_layer_ids),  # the layers it reads
        "sample_from_anchor": draft.spec.sample_from_anchor,
        "offline_t0": summarize_rounds(
            rounds=walk_tables(tables, num_draft_tokens=drafter.num_draft_tokens),
            num_samples=len(tables),
            sample_ids=[t.sample_id for t in tables],
        ).to_dict(),
    }


def _calibration_sections(
    config: EvalConfig, draft: LoadedDraft, drafter: Drafter, halves: _Halves, verifier
) -> dict[str, Any]:
    """The row's `calibration` (fitted, then measured on the other half) and, at T=0,
    its `truncation` sweep; the calibration stored beside the export when asked."""
    from pipeline.evaluate.calibration import calibration_metrics, fit_calibration, truncation_sweep

    cc = config.calibration
    fit_events, eval_events, num_fit = _calibration_events(config, drafter, halves, verifier)
    cal = fit_calibration(fit_events, num_samples=num_fit, sampling_temperature=cc.temperature)
    sections: dict[str, Any] = {
        "calibration": {
            "temperatures": [round(t, 4) for t in cal.temperatures],
            "sampling_temperature": cc.temperature,
            "fit_samples": num_fit,
            "eval_samples": len(halves.eval_tables),
            "metrics": calibration_metrics(eval_events, cal),
        }
    }
    if cc.temperature == 0:
        sections["truncation"] = truncation_sweep(
            halves.eval_tables,
            calibration=cal,
            thresholds=cc.thresholds,
            num_draft_tokens=drafter.num_draft_tokens,
        )
    if cc.store and draft.export_dir is not None:
        sections["calibration"]["stored"] = str(cal.save(draft.export_dir))
    return sections


def _calibration_events(config: EvalConfig, drafter: Drafter, halves: _Halves, verifier):
    """(events to fit on, events to report on, samples fitted on): at T>0 the live
    loop's against `verifier`, at T=0 each drafted position's conditional acceptance
    in the walk tables."""
    from pipeline.evaluate.calibration import conditional_events

    cc = config.calibration
    if cc.temperature > 0:
        return _live_calibration_events(config, drafter, halves, verifier)
    n = drafter.num_draft_tokens
    fit_events = conditional_events(halves.fit_tables, n)
    eval_events = conditional_events(halves.eval_tables, n)
    return fit_events, eval_events, len(halves.fit_tables)


def _live_calibration_events(config: EvalConfig, drafter: Drafter, halves: _Halves, verifier):
    from pipeline.evaluate.sampling import live_calibration_events

    cc = config.calibration

    def events(samples, seed):
        return live_calibration_events(
            drafter=drafter,
            verifier=verifier,
            samples=round_robin_prompts(samples, cc.num_prompts),
            temperature=cc.temperature,
            max_new_tokens=cc.max_new_tokens,
            seed=seed,
        )

    fit_events = events(halves.fit_samples, config.seed)
    eval_events = events(halves.eval_samples, config.seed + 1)
    return fit_events, eval_events, min(len(halves.fit_samples), cc.num_prompts)
