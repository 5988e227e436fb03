"""Acceptance-length evaluation of trained drafts against their target (docs/design.md#acceptance-length).

Modules: `offline` (exact T=0 walk), `sampling` (rejection sampling and the live loop at T>0), `calibration`
(confidence head ECE/AUC, temperature scaling, truncation), `uncertainty`
(bootstrap intervals), `vllm` (cross-check against vLLM's counters), `report`
(JSON, Markdown, plots), `config` (the YAML format), `heldout` (the samples
read, after the leakage checks), `draft_row` (one draft's offline row and its
calibration), `run` (the stage: `run_evaluation`). Drafts are loaded and drafted with through pipeline/drafts/
(`load`, and each kind's drafter from its registry); this stage imports
nothing of train/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.evaluate.run import EvalResult


def run_evaluation(config) -> EvalResult:
    """See pipeline.evaluate.run.run_evaluation."""
    from pipeline.evaluate.run import run_evaluation as run

    return run(config)


def demo_report(out_dir, **kwargs) -> EvalResult:
    """See pipeline.evaluate.run.demo_report (the last step of `make demo`)."""
    from pipeline.evaluate.run import demo_report as report

    return report(out_dir, **kwargs)
