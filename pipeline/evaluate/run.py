"""`run_evaluation(config)`: the evaluation stage from config to report.

1. loads the target's head and every draft (trained, untrained copies, and
   placeholders for baselines without a checkpoint);
2. opens the held-out split of the dataset, checking that no evaluated
   sample was trained on (the eval held-out fraction may not exceed any
   draft's training fraction: the split is a hash threshold on the sample id)
   and that the data was captured from this target with the drafts' layers
   (each draft reads its own subset of them: `select_layers`);
3. T=0: the exact offline walk per draft (tau per domain, macro, per position);
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

from pipeline.drafts.registry import drafts_with_heads, served_method
from pipeline.evaluate.config import DraftEntry, EvalConfig
from pipeline.logs import kv

# Held-out samples are cut to this many tokens, the training default of
# `data.max_seq_len` (what evaluation has always read them with).
MAX_SEQ_LEN = 4096

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
            speedup = e.get("single_stream_speedup")
            lines.append(
                f"serving {name}: {e['single_stream']['per_user_tok_s']} tok/s per user single "
                f"stream" + (f", speedup {speedup}" if speedup is not None else "")
            )
        lines.append(f"report: {self.json_path}, {self.markdown_path}")
        lines += [f"plot ({k}): {p}" for k, p in self.plots.items()]
        return lines


def _heldout_fraction(config: EvalConfig, train_configs: dict[str, dict]) -> float:
    train_fracs = {
        name: float(tc.get("data", {}).get("heldout_fraction", 0.0))
        for name, tc in train_configs.items()
    }
    frac = config.data.heldout_fraction
    if frac is None:
        if not train_fracs:
            raise ValueError(
                "data.heldout_fraction is unset and no draft is a training run to take it from: set it"
            )
        frac = min(train_fracs.values())
    if frac <= 0:
        raise ValueError(
            f"the drafts were trained with heldout_fraction {train_fracs}: a draft trained on every "
            "sample has no held-out split to evaluate on; retrain with data.heldout_fraction > 0"
        )
    leaked = {n: f for n, f in train_fracs.items() if f < frac}
    if leaked:
        raise ValueError(
            f"data.heldout_fraction {frac} exceeds the training held-out fraction of {leaked}: "
            "some evaluated samples were trained on; lower data.heldout_fraction to at most "
            f"{min(leaked.values())}"
        )
    return frac


def _check_left_out(config: EvalConfig, train_configs: dict[str, dict]) -> None:
    """split: all reads rows no draft may have trained on: each left the sources out."""
    wanted = set(config.data.sources)
    for name, tc in train_configs.items():
        left_out = set(tc.get("data", {}).get("exclude_sources", []))
        if not wanted <= left_out:
            raise ValueError(
                f"data.split: all evaluates every row of sources {sorted(wanted)}, but draft "
                f"{name!r} trained on {sorted(wanted - left_out)} (its data.exclude_sources is "
                f"{sorted(left_out)}): evaluate its held-out split instead, or retrain without them"
            )


def load_heldout(config: EvalConfig, train_configs: dict[str, dict], specs: dict, target_dir: Path):
    """(held-out samples, data description) after the provenance and leakage checks."""
    from pipeline.table.dataset import Dataset

    uri = config.data.uri
    if uri is None:
        uris = [tc["data"]["uri"] for tc in train_configs.values() if tc.get("data")]
        if not uris:
            raise ValueError(
                "data.uri is unset and no draft is a training run to take it from: set it"
            )
        uri = uris[0]
    frac = _heldout_fraction(config, train_configs)
    if config.data.split == "all":
        _check_left_out(config, train_configs)
    dataset = Dataset.open(uri, endpoint_url=config.data.endpoint_url)
    version = dataset.manifest(config.data.version).version  # the latest, if unset
    with dataset.pinned(version, "evaluate"):  # gc keeps it while it is read
        return _load_heldout(config, specs, target_dir, uri, version, frac)


def _load_heldout(config: EvalConfig, specs: dict, target_dir: Path, uri, version, frac):
    import json

    from pipeline.drafts.family import language_config
    from pipeline.evaluate.offline import inexact_reasons
    from pipeline.table.split import DatasetSplit

    data = DatasetSplit(
        uri,
        version=version,
        endpoint_url=config.data.endpoint_url,
        domains=config.data.domains,
        sources=config.data.sources,
        exclude_sources=config.data.exclude_sources,
        heldout_fraction=frac,
        max_seq_len=MAX_SEQ_LEN,
    )
    target_config = language_config(json.loads((target_dir / "config.json").read_text()))
    for spec in specs.values():
        data.check(
            target=config.target,
            target_config=target_config,
            aux_layer_ids=list(spec.aux_layer_ids),
        )
    prov = data.provenance
    inexact = inexact_reasons(generation=prov.generation, codec=prov.codec)
    if inexact and not config.data.report_as_teacher_forced:
        raise ValueError(
            f"{data.where}: the offline T=0 walk measures acceptance only on the target's "
            f"greedy output stored losslessly, but {'; '.join(inexact)}. Regenerate with "
            "generation.temperature: 0 and a lossless codec (output.codec: bf16), or set "
            "data.report_as_teacher_forced: true to report its tau as teacher-forced agreement"
        )
    rows = (
        data.heldout_rows if config.data.split == "heldout" else data.heldout_rows + data.train_rows
    )
    refs = rows[: config.data.max_samples] if config.data.max_samples else rows
    if not refs:
        what = (
            f"at heldout_fraction {frac}"
            if config.data.split == "heldout"
            else f"of sources {config.data.sources}"
        )
        raise ValueError(f"{data.where}: no samples to evaluate {what}")
    samples = data.decode(refs)
    info = {
        "uri": str(uri),
        "version": data.manifest.version,
        "heldout_fraction": frac,
        "split": config.data.split,
        "sources": sorted({s.source for s in samples}),
        "num_samples": len(samples),
        # The layers the dataset captured: the samples' hidden_states columns, in order.
        "aux_layer_ids": list(prov.aux_layer_ids),
        "domains": sorted({s.domain for s in samples}),
        # What the offline T=0 tau measures on this data (and why, if not acceptance).
        "t0_measure": "teacher-forced agreement" if inexact else "acceptance",
        "t0_inexact": inexact,
    }
    return samples, info


def draft_samples(samples: list, data_info: dict, spec) -> list:
    """Held-out samples as a draft of `spec` reads them: hidden_states cut to its layers
    (the same columns training gave it, table/split.py `select_layers`)."""
    from pipeline.table.split import select_layers

    captured = data_info["aux_layer_ids"]
    return [select_layers(s, captured, spec.aux_layer_ids) for s in samples]


def _prompts(samples, num: int) -> list:
    """Up to `num` samples, round-robin over domains (deterministic order)."""
    by_domain: dict[str, list] = {}
    for s in samples:
        by_domain.setdefault(s.domain, []).append(s)
    picked, i = [], 0
    while len(picked) < num and any(i < len(v) for v in by_domain.values()):
        for d in sorted(by_domain):
            if i < len(by_domain[d]) and len(picked) < num:
                picked.append(by_domain[d][i])
        i += 1
    return picked


def run_evaluation(config: EvalConfig) -> EvalResult:
    """Evaluate every draft of `config` (see the module docstring)."""
    from pipeline.torch_threads import torch_threads

    with torch_threads(config.num_threads):
        return _run_evaluation(config)


def _run_evaluation(config: EvalConfig) -> EvalResult:
    from pipeline.drafts.common import load_target_head
    from pipeline.drafts.load import load_draft, make_drafter
    from pipeline.evaluate.calibration import in_calibration_split
    from pipeline.evaluate.report import write_report
    from pipeline.targets.resolve import resolve_model

    started = time.monotonic()
    target_dir = Path(resolve_model(config.target))
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
    samples, data_info = load_heldout(
        config, train_configs, {n: d.spec for n, d in loaded.items()}, target_dir
    )
    fit_frac = config.calibration.fit_fraction
    fit_samples = [s for s in samples if in_calibration_split(s.sample_id, fit_frac)]
    eval_samples = [s for s in samples if not in_calibration_split(s.sample_id, fit_frac)]
    log.info("evaluating %s", kv(drafts=len(loaded), samples=len(samples), target=config.target))

    drafts: dict[str, dict] = {}
    drafters: dict[str, Drafter] = {}
    verifier = None  # the HF reference target, for the live loop (built once, when needed)
    if loaded and (config.live is not None or config.calibration.temperature > 0):
        from pipeline.evaluate.sampling import HFVerifier

        verifier = HFVerifier(str(target_dir), next(iter(loaded.values())).spec.aux_layer_ids)
    for entry in config.drafts:
        if entry.name not in loaded:
            drafts[entry.name] = {"available": False, "note": entry.note or "no checkpoint given"}
            continue
        draft = loaded[entry.name]
        drafter = drafters[entry.name] = make_drafter(entry.name, draft, use_heads=entry.use_heads)
        drafts[entry.name] = evaluate_draft(
            config,
            entry,
            draft,
            drafter,
            draft_samples(fit_samples, data_info, draft.spec),
            draft_samples(eval_samples, data_info, draft.spec),
            None if verifier is None else verifier.reading(draft.spec.aux_layer_ids),
        )
    if config.live is not None and drafters:
        from pipeline.evaluate.sampling import live_report

        prompts = _prompts(samples, config.live.num_prompts)
        for name, drafter in drafters.items():
            drafts[name]["live"] = {}
            for temp in config.live.temperatures:
                started = time.monotonic()
                live = live_report(
                    drafter=drafter,
                    verifier=verifier.reading(loaded[name].spec.aux_layer_ids),
                    samples=prompts,
                    temperature=temp,
                    max_new_tokens=config.live.max_new_tokens,
                    seed=config.seed,
                    samples_per_prompt=config.live.samples_per_prompt,
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
    if verifier is not None:
        verifier.target.close()

    report: dict[str, Any] = {"target": config.target, "data": data_info, "drafts": drafts}
    report["seconds"] = round(time.monotonic() - started, 1)
    json_path, md_path, plots = write_report(report, Path(config.out_dir))
    if config.vllm is not None:
        from pipeline.evaluate.vllm import check_against_vllm

        # Written first: a failed engine start must not lose the offline and live results.
        vc = config.vllm
        prompts = [
            s.input_ids[: s.num_prompt_tokens].tolist() for s in _prompts(samples, vc.num_prompts)
        ]
        if vc.draft not in loaded:
            raise ValueError(f"vllm.draft {vc.draft!r} has no export directory to serve")
        report["vllm"] = check_against_vllm(
            vc, loaded[vc.draft], prompts, str(target_dir)
        ).to_dict()
        report["seconds"] = round(time.monotonic() - started, 1)
        json_path, md_path, plots = write_report(report, Path(config.out_dir))
    if config.serving is not None:
        from pipeline.evaluate.identity import IdentityMismatch

        try:
            report["serving"] = serve_drafts(
                config, config.served_drafts(), loaded, samples, data_info, target_dir
            )
        except IdentityMismatch as error:  # the report first, then the loud failure
            report["serving"] = error.section  # type: ignore[attr-defined]
            write_report(report, Path(config.out_dir))
            raise
        report["seconds"] = round(time.monotonic() - started, 1)
        json_path, md_path, plots = write_report(report, Path(config.out_dir))
    return EvalResult(Path(config.out_dir), report, json_path, md_path, plots)


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
    picked = _prompts(samples, sc.num_prompts)
    exports = {n: loaded[n].export_dir if n in loaded else None for n in names}
    offline = {}
    for name, export in exports.items():
        if export is None:
            continue
        served = served_method(json.loads((export / "config.json").read_text()), str(export))
        # A DFlash export of a DSpark draft is its backbone: draft offline without the heads.
        drafter = make_drafter(name, loaded[name], use_heads=drafts_with_heads(served))
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
    from pipeline.evaluate.calibration import (
        calibration_metrics,
        conditional_events,
        fit_calibration,
        truncation_sweep,
    )
    from pipeline.evaluate.offline import build_tables, summarize_rounds, walk_tables

    n = drafter.num_draft_tokens
    fit_tables = build_tables(fit_samples, drafter)
    eval_tables = build_tables(eval_samples, drafter)
    tables = fit_tables + eval_tables
    result: dict[str, Any] = {
        "available": True,
        "source": str(draft.source),
        "untrained": entry.untrained,
        "kind": draft.spec.kind,
        "use_heads": entry.use_heads,
        "block_size": draft.spec.block_size,
        "aux_layer_ids": list(draft.spec.aux_layer_ids),  # the layers it reads
        "sample_from_anchor": draft.spec.sample_from_anchor,
        "offline_t0": summarize_rounds(
            rounds=walk_tables(tables, num_draft_tokens=n),
            num_samples=len(tables),
            sample_ids=[t.sample_id for t in tables],
        ).to_dict(),
    }
    if entry.note:
        result["note"] = entry.note
    calibrate = config.calibration.enabled and drafter.has_confidence and not entry.untrained
    if calibrate and fit_tables and eval_tables:
        cc = config.calibration
        if cc.temperature > 0:
            from pipeline.evaluate.sampling import live_calibration_events

            def events(samples, seed):
                return live_calibration_events(
                    drafter=drafter,
                    verifier=verifier,
                    samples=_prompts(samples, cc.num_prompts),
                    temperature=cc.temperature,
                    max_new_tokens=cc.max_new_tokens,
                    seed=seed,
                )

            fit_events, eval_events = (
                events(fit_samples, config.seed),
                events(eval_samples, config.seed + 1),
            )
            num_fit = min(len(fit_samples), cc.num_prompts)
        else:
            fit_events, eval_events = (
                conditional_events(fit_tables, n),
                conditional_events(eval_tables, n),
            )
            num_fit = len(fit_tables)
        cal = fit_calibration(fit_events, num_samples=num_fit, sampling_temperature=cc.temperature)
        result["calibration"] = {
            "temperatures": [round(t, 4) for t in cal.temperatures],
            "sampling_temperature": cc.temperature,
            "fit_samples": num_fit,
            "eval_samples": len(eval_tables),
            "metrics": calibration_metrics(eval_events, cal),
        }
        if cc.temperature == 0:
            result["truncation"] = truncation_sweep(
                eval_tables,
                calibration=cal,
                thresholds=cc.thresholds,
                num_draft_tokens=n,
            )
        if cc.store and draft.export_dir is not None:
            result["calibration"]["stored"] = str(cal.save(draft.export_dir))
    offline = result["offline_t0"]
    log.info("offline T=0 %s", kv(draft=entry.name, tau=offline["tau"], macro=offline["tau_macro"]))
    return result


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
    DSpark draft, its backbone alone (what vLLM's CPU build serves), the DFlash
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
