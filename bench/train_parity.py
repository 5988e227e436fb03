"""Parity with the field's trainer (key P7): the project's DSpark vs speculators' DSpark.

    .venv/bin/python bench/train_parity.py [--work DIR] [--steps 300] [--batch 16]
        [--conversations 800] [--heldout 0.15] [--live-prompts 1000] [--live-runs 4]
    .venv/bin/python bench/train_parity.py --real DATASET [--steps 150] [--batch 8]
        [--heldout 0.1] [--threads 2] [--live-prompts 0] [--live-runs 1]

The speculators library (0.9.0; pip install --no-deps speculators==0.9.0
hs-connectors==0.9.0) trains its own DSpark (`DSparkDraftModel`: DFlash
backbone, Markov head, confidence head) on this project's shards, through
its eager CPU path (`draft_attn_impl="eager"`, `loss_implementation="eager"`;
`PARITY_ATTN=sdpa` picks its SDPA attention instead, ~2.5x faster here with the
same losses),
with the same budget and draft size as the project's DSpark of
bench/evaluate.py: the same samples in the same order (`--steps` steps of
`--batch` sequences, the project's epoch plan), as many blocks per step (64
anchors per sequence -> `max_anchors` = 64 x batch), the same draft (2 layers,
block 5, Markov rank 64, paper layout `sample_from_anchor: true`) and the
same optimiser and schedule (AdamW lr 3e-3, torch's betas, no weight decay,
4% warmup then cosine, clip 1.0), fp32. Its loss is speculators' own DSpark
objective: `{"ce": 0.1, "tv": 0.9}` (its spelling of the paper's terms; its TV
is half the paper's L1) plus the confidence BCE (alpha 1), decay gamma 4.

The project's shards store the target's final hidden state after the final
norm, where speculators stores it before and applies the verifier's norm
itself, so its `verifier_norm` is replaced by the identity (no other change
to its model or loss). Each packed step is one row of the batch's samples
(`document_ids` per sample, positions restarting per sample), as
speculators' collator packs them.

`--variant-tv-weight W` also trains the project's DSpark with the
distribution term as a weight W on TV (`loss.tv_weight`; speculators' weights
at 0.9) beside the default, as an experiment on the one recipe difference
that could move T=0 tau; its ratio to speculators is recorded apart
(`P7_variant_tv<W>`), never as P7.

Both drafts are then evaluated by the project's exact evaluator on the same
held-out samples: T=0 (the offline walk) and T=1 (the live loop with
rejection sampling, `--live-prompts` prompts x `--live-runs` decodes); the
speculators draft is loaded from its own `save_pretrained` directory through
the project's import of the speculators format (`load_draft`).

P7 = macro tau (project) / macro tau (speculators), with the paired,
domain-stratified bootstrap interval (goal >= 1.0), at T=0 and at T=1.
Figures merge into bench/results.json (keys P7*) and a section of
bench/RESULTS.md between train_parity markers.

The real target (`--real DATASET`, a dataset of SmolLM2-135M-Instruct regenerated
with pipeline/demo/configs/real-smollm2.yaml): both sides train
pipeline/demo/configs/train-real.yaml's draft (1 layer, block 5, fill-in layout,
aux layers [2, 9, 15, 21, 28], Markov rank 64, 32 anchors per sequence, lr 2e-3)
with `--steps` steps of `--batch` sequences (default 150 x 8), `--threads` torch
threads each (default 2). The draft vocabulary is its 8,192 tokens on both sides:
the project's run counts them, and speculators' DSpark takes the same map as its
own d2t/t2d (`load_vocab_mappings`; its head is the target head's rows of those
tokens and its teacher the target's logits over them, as here). Tokens/s of each
trainer: context tokens per second of forward, backward and optimiser step, per
step, median with range. Evaluated on `--heldout` (default 0.1) of the samples,
T=1 only with `--live-prompts N`. Figures: keys real_P7* and their own RESULTS.md
section (markers `bench/train_parity.py --real`); the toy's P7 keys stay.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
ANCHORS_PER_SEQUENCE = 64
WARMUP_STEPS = 3  # left out of the tokens/s figures (bench/real_target.py's choice)
ATTN_IMPL = os.environ.get("PARITY_ATTN", "eager")  # speculators draft_attn_impl


def _project_run(
    shards: Path, out: Path, steps: int, batch: int, heldout: float, extra: dict | None = None
) -> float:
    """The project's DSpark exactly as bench/evaluate.py trains it (reused when present)."""
    from evaluate import _train

    if (out / "export" / "config.json").exists():
        return 0.0
    return _train(shards, out, "dspark", steps, batch, True, heldout, extra)


def speculators_dspark(
    target_dir: Path, spec, *, mask_token_id: int, architectures: list[str] | None = None
):
    """speculators' DSparkDraftModel of the same size, layout and draft vocabulary as
    `spec` (a reduced one through speculators' own d2t/t2d), `PARITY_ATTN` attention."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from torch import nn
    from transformers import Qwen3Config

    layer = Qwen3Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        rms_norm_eps=spec.rms_norm_eps,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
    )
    layer._attn_implementation = ATTN_IMPL
    config = DSparkSpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=spec.draft_vocab_size,
        block_size=spec.block_size,
        aux_hidden_state_layer_ids=list(spec.aux_layer_ids),
        mask_token_id=mask_token_id,
        sample_from_anchor=spec.sample_from_anchor,
        markov_rank=spec.markov_rank,
        markov_head_type="vanilla",
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=spec.block_size)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(
                name_or_path=str(target_dir),
                architectures=architectures or ["Qwen3ForCausalLM"],
            ),
        ),
    )
    model = DSparkDraftModel(config)
    if spec.draft_vocab is not None:  # speculators' maps: the same tokens, the same order
        from pipeline.drafts.vocab import d2t_of, t2d_of

        model.load_vocab_mappings(
            t2d_of(spec.draft_vocab, spec.vocab_size), d2t_of(spec.draft_vocab)
        )
    model.load_verifier_weights()  # embeddings and lm_head (its rows) from the target, frozen
    model.verifier_norm = nn.Identity()  # the shards' final state is already normed
    return model


def packed_row(samples) -> dict:
    """speculators' packed batch: one row of every sample, document ids and positions."""
    import torch

    ids = torch.cat([s.input_ids for s in samples])[None]
    return {
        "input_ids": ids,
        "hidden_states": torch.cat([s.hidden_states.float() for s in samples])[None],
        "verifier_last_hidden_states": torch.cat([s.last_hidden_state.float() for s in samples])[
            None
        ],
        "loss_mask": torch.cat([s.loss_mask.long() for s in samples])[None],
        "document_ids": torch.cat(
            [torch.full((len(s.input_ids),), i, dtype=torch.long) for i, s in enumerate(samples)]
        )[None],
        "position_ids": torch.cat([torch.arange(len(s.input_ids)) for s in samples])[None],
    }


def rounded(d: dict, digits: int = 1) -> dict:
    return {k: round(v, digits) for k, v in d.items()}


def toy_config(shards: Path, out: Path, *, heldout: float):
    """The toy comparison's training config: train-toy.yaml in the paper's anchor layout."""
    from pipeline.demo import CONFIG_DIR
    from pipeline.train.config import load_train_config

    return load_train_config(
        CONFIG_DIR / "train-toy.yaml",
        overrides={
            "data.uri": str(shards),
            "data.heldout_fraction": heldout,
            "out_dir": str(out),
            "draft.sample_from_anchor": True,
        },
    )


def train_speculators(
    shards: Path,
    out: Path,
    *,
    steps: int,
    batch: int,
    heldout: float,
    seed: int = 0,
    config=None,
    draft_vocab=None,
) -> dict:
    """Train speculators' DSpark on the project's shards (module docstring); save it.

    `config`: the project's TrainConfig whose data (layers read, anchors per sequence,
    max_seq_len), draft and optimiser both sides share (None: the toy's); `draft_vocab`:
    the project's run's reduced vocabulary, given to speculators as its d2t/t2d."""
    import torch
    from results_file import spread
    from speculators.losses import resolve_loss_config
    from transformers import get_cosine_schedule_with_warmup

    from pipeline.drafts.family import language_config
    from pipeline.targets.resolve import resolve_model
    from pipeline.train.data import TrainingData
    from pipeline.train.setup import _mask_token_id

    if (out / "config.json").exists():
        return json.loads((out / "parity_train.json").read_text())
    config = config or toy_config(shards, out, heldout=heldout)
    target_dir = Path(resolve_model(config.target))
    target_config = json.loads((target_dir / "config.json").read_text())
    data = TrainingData(config.data)
    layers, _ = config.draft.layers_to_read(
        data.provenance.aux_layer_ids, language_config(target_config)["num_hidden_layers"]
    )
    data.read_layers(layers)  # the columns the project's trainer reads
    mask = _mask_token_id(config, target_dir)
    spec = config.draft.resolve(
        target_config, aux_layer_ids=layers, mask_token_id=mask, draft_vocab=draft_vocab
    )
    torch.manual_seed(seed)
    model = speculators_dspark(
        target_dir, spec, mask_token_id=mask, architectures=target_config.get("architectures")
    )
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.optim.lr, weight_decay=0.0)
    scheduler = get_cosine_schedule_with_warmup(
        optimizer, math.ceil(config.optim.warmup_fraction * steps), steps
    )
    implementation = "eager"
    kwargs = dict(
        loss_config=resolve_loss_config('{"ce": 0.1, "tv": 0.9}', implementation),
        tv_loss_fn=resolve_loss_config("tv", implementation)["tv"][0],
        gamma=config.loss.gamma,
        max_anchors=config.data.num_anchors * batch,
        confidence_head_alpha=1.0,
        per_position_loss_weight="fixed-exp-decay",
    )
    losses, seconds, tokens_per_s = [], [], []
    epoch, order, i = 0, data.epoch_order(0, config.seed), 0
    for _step in range(steps):
        if (i + 1) * batch > len(order):  # the project's epoch plan, batch after batch
            epoch, i = epoch + 1, 0
            order = data.epoch_order(epoch, config.seed)
        started = time.perf_counter()
        samples = data.decode(order[i * batch : (i + 1) * batch])
        row = packed_row(samples)
        i += 1
        computed = time.perf_counter()  # the project's trainer decodes ahead (prefetch)
        _, loss, _metrics = model(**row, **kwargs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.optim.grad_clip)
        optimizer.step()
        scheduler.step()
        done = time.perf_counter()
        losses.append(float(loss))
        seconds.append(done - started)
        tokens_per_s.append(sum(len(s.input_ids) for s in samples) / (done - computed))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    summary = {
        "steps": steps,
        "loss_first5": round(statistics.mean(losses[:5]), 4),
        "loss_last5": round(statistics.mean(losses[-5:]), 4),
        "train_seconds": round(sum(seconds), 1),
        # context tokens per second of forward, backward and optimiser step (the
        # project's metrics.jsonl counts the same tokens); warm-up steps left out
        "tokens_per_s": rounded(spread(tokens_per_s[WARMUP_STEPS:] or tokens_per_s)),
    }
    (out / "parity_train.json").write_text(json.dumps(summary, indent=2))
    return summary


def ratio(a: dict | None, b: dict | None) -> dict | None:
    """Paired ratio of two drafts' macro taus with its stratified bootstrap interval."""
    from pipeline.evaluate.uncertainty import PerSample, ratio_interval

    if not a or not b:
        return None
    point, lo, hi = ratio_interval(
        PerSample.from_dict(a["per_sample"]), PerSample.from_dict(b["per_sample"])
    )
    ci = None if math.isnan(lo) else [round(lo, 3), round(hi, 3)]
    return {"ratio": round(point, 3), "ci95": ci}


def line(key: str, fig: dict | None, where: str, goal: str = "; goal >= 1.0") -> str:
    if not fig:
        return f"* {key}: not measured (--live-prompts 0)"
    ci = "95% CI {:.3f}-{:.3f}".format(*fig["ci95"]) if fig["ci95"] else "no interval"
    return f"* **{key}** (macro tau, {where}) **= {fig['ratio']:.3f}** ({ci}{goal})"


REAL_TARGET_CONFIG = "train-real.yaml"  # the real target's draft recipe


def real_config(data: Path, out: Path, *, steps: int, batch: int, heldout: float, threads: int):
    """train-real.yaml on `data` with this run's budget: the recipe both sides share."""
    from pipeline.demo import CONFIG_DIR
    from pipeline.train.config import load_train_config

    return load_train_config(
        CONFIG_DIR / REAL_TARGET_CONFIG,
        overrides={
            "data.uri": str(data),
            "data.heldout_fraction": heldout,
            "out_dir": str(out),
            "num_steps": steps,
            "global_batch_size": batch,
            "checkpoint_every": 10**6,
            "log_every": 25,
            "num_threads": threads,
        },
    )


def run_real(args) -> None:
    """P7 on the real target (`--real DATASET`): both trainers on the real dataset with
    train-real.yaml's draft, its 8,192-token draft vocabulary on both sides (speculators
    takes the project's run's d2t/t2d), keys real_P7*, a RESULTS.md section of its own."""
    import torch
    from results_file import (
        cpu_capability,
        fmt_spread,
        merge_results,
        public_command,
        spread,
        write_section,
    )

    from pipeline.drafts.checkpoint import latest_checkpoint, load_checkpoint
    from pipeline.evaluate.config import parse_eval_config
    from pipeline.evaluate.run import run_evaluation
    from pipeline.train.metrics import read_metrics
    from pipeline.train.trainer import train

    torch.set_num_threads(args.threads)
    started = time.monotonic()
    load = os.getloadavg()[0]
    work, data = args.work, args.real
    work.mkdir(parents=True, exist_ok=True)
    tag = f"real-{args.steps}x{args.batch}-h{args.heldout}"
    project = work / f"run-dspark-{tag}"
    config = real_config(
        data,
        project,
        steps=args.steps,
        batch=args.batch,
        heldout=args.heldout,
        threads=args.threads,
    )
    theirs = work / f"speculators-dspark-{tag}"
    # the invocation that trained (a later one with --live-prompts reuses both drafts)
    trained_by = work / f"{tag}-trained.json"
    reused = (project / "export" / "config.json").exists() and (theirs / "config.json").exists()
    t = time.perf_counter()
    if not (project / "export" / "config.json").exists():
        train(config)
    project_s = time.perf_counter() - t
    rows = read_metrics(project)
    spec = load_checkpoint(latest_checkpoint(project)).spec
    summary = train_speculators(
        data,
        theirs,
        steps=args.steps,
        batch=args.batch,
        heldout=args.heldout,
        config=config,
        draft_vocab=spec.draft_vocab,
    )
    timed = rows[WARMUP_STEPS:] or rows
    ours_train = {
        "steps": len(rows),
        "loss_first5": round(statistics.mean(r["loss"] for r in rows[:5]), 4),
        "loss_last5": round(statistics.mean(r["loss"] for r in rows[-5:]), 4),
        "train_seconds": round(sum(r["seconds"] for r in rows), 1),
        "tokens_per_s": rounded(spread(r["tokens_per_s"] for r in timed)),
    }
    names = ("DSpark (this project)", "DSpark (speculators)")
    eval_config = dict(
        target=config.target,
        out_dir=str(work / f"parity-eval-{tag}"),
        data=dict(uri=str(data), heldout_fraction=args.heldout),
        drafts=[dict(name=names[0], path=str(project)), dict(name=names[1], path=str(theirs))],
        calibration=dict(store=False),
    )
    if args.live_prompts:
        eval_config["live"] = dict(
            temperatures=[1.0],
            num_prompts=args.live_prompts,
            max_new_tokens=128,
            samples_per_prompt=args.live_runs,
        )
    report = run_evaluation(parse_eval_config(eval_config, "bench/train_parity.py")).report
    ours, spec_r = (report["drafts"][n] for n in names)
    t0 = ratio(ours["offline_t0"], spec_r["offline_t0"])
    t1 = ratio(ours.get("live", {}).get("1.0"), spec_r.get("live", {}).get("1.0"))
    taus = {
        n: {
            "T0": report["drafts"][n]["offline_t0"]["tau_macro"],
            "T1": report["drafts"][n].get("live", {}).get("1.0", {}).get("tau_macro"),
        }
        for n in names
    }
    heldout_n = ours["offline_t0"]["num_samples"]
    d = config.draft
    vocab = f"draft vocabulary {spec.draft_vocab_size} (the project's run's, both sides)"
    budget = (
        f"{args.steps} steps x {args.batch} sequences (the same samples in the same order), "
        f"{config.data.num_anchors} anchors per sequence, max_seq_len {config.data.max_seq_len}; "
        f"{d.num_layers} layer, block {d.block_size}, "
        f"{'anchor' if spec.sample_from_anchor else 'fill-in'} layout, "
        f"aux layers {list(spec.aux_layer_ids)}, Markov rank {d.markov_rank}, {vocab}; "
        f"AdamW lr {config.optim.lr:g} with {config.optim.warmup_fraction:.0%} warmup and "
        f"cosine, clip {config.optim.grad_clip:g}, fp32, {args.threads} threads each; "
        f"held-out fraction {args.heldout} ({heldout_n} samples)"
    )
    wall = time.monotonic() - started
    command = public_command(
        "bench/train_parity.py", sys.argv[1:], {"--real": "DATASET", "--work": "WORK"}
    )
    if not reused:
        trained_by.write_text(json.dumps({"command": command, "wall_seconds": round(wall, 1)}))
    first = json.loads(trained_by.read_text()) if trained_by.exists() else None
    if not reused:
        timing = (
            f"wall time {wall:.0f} s (both trainings and the evaluation; project training "
            f"{project_s:.0f} s)"
        )
    elif first:
        timing = (
            f"both drafts trained by `{first['command']}` in {first['wall_seconds']:.0f} s of "
            f"wall time (with its evaluation); this evaluation {wall:.0f} s"
        )
    else:
        timing = f"both drafts reused; this evaluation {wall:.0f} s"
    figures = {
        "real_P7": t0["ratio"],
        "real_P7_ci95": t0["ci95"],
        "real_P7_T1": t1["ratio"] if t1 else None,
        "real_P7_T1_ci95": t1["ci95"] if t1 else None,
        "real_P7_tau_macro": taus,
        "real_P7_tokens_per_s_project": ours_train["tokens_per_s"],
        "real_P7_tokens_per_s_speculators": summary["tokens_per_s"],
        "real_P7_training": {"project": ours_train, "speculators": summary},
        "real_P7_budget": budget,
        "real_P7_speculators_attention": ATTN_IMPL,
        "real_P7_bench_load_average": round(load, 2),
        "real_P7_bench_seconds": round(wall, 1),
        "real_P7_train_wall_seconds": first["wall_seconds"] if first else None,
    }
    merge_results(figures, replace=("real_P7",))
    table = [
        "| draft | macro tau T=0 | macro tau T=1 | context tokens/s, median [min-max] "
        "| train seconds | loss first 5 -> last 5 |",
        "|---|---|---|---|---|---|",
    ]
    for n, tr in zip(names, (ours_train, summary), strict=True):
        t1_cell = "n/a" if taus[n]["T1"] is None else f"{taus[n]['T1']:.3f}"
        table.append(
            f"| {n} | {taus[n]['T0']:.3f} | {t1_cell} | {fmt_spread(tr['tokens_per_s'])} "
            f"| {tr['train_seconds']:.0f} | {tr['loss_first5']} -> {tr['loss_last5']} |"
        )
    ratio_speed = ours_train["tokens_per_s"]["median"] / summary["tokens_per_s"]["median"]
    section = "\n".join(
        [
            "## Parity with the field's trainer on the real target "
            "(bench/train_parity.py --real, keys real_P7*)",
            "",
            f"SmolLM2-135M-Instruct; `{command}`. speculators 0.9.0's "
            f"DSpark ({ATTN_IMPL} attention, eager losses, its loss "
            '`{"ce": 0.1, "tv": 0.9}` + confidence BCE) and this project\'s DSpark '
            f"(0.1 CE + 0.9 L1 + BCE) trained on the real dataset with {REAL_TARGET_CONFIG}'s "
            f"draft and one budget: {budget}. speculators takes the project's 8,192-token "
            "map as its own d2t/t2d (its trainer supports a reduced vocabulary: the head "
            "and the teacher both cover those tokens). Its `verifier_norm` is the identity "
            "(the shards store the final state after the norm). Both evaluated by the "
            "project's evaluator on the same held-out samples (T=0 exact offline walk"
            + (
                f"; T=1 live loop, {args.live_prompts} prompts x {args.live_runs} runs"
                if t1
                else "; T=1 not run"
            )
            + "). Tokens/s: context tokens per second of forward, backward and optimiser "
            f"step, median of steps {WARMUP_STEPS + 1}-{args.steps} with their range; "
            "train seconds are whole steps, speculators' with decoding its batch from the "
            "shards in line (the project's trainer decodes ahead in a thread). "
            f"{platform.machine()}, {cpu_capability()}, load average {load:.2f}; {timing}. "
            f"A small budget: {args.steps} steps on 2 shared "
            "CPU cores, far from converged; the figure compares the two trainers at that "
            "budget, not the drafts' final quality.",
            "",
            *table,
            "",
            line("real_P7", t0, "this project / speculators, T=0"),
            line("real_P7_T1", t1, "this project / speculators, T=1"),
            f"* training speed, this project / speculators (median tokens/s): "
            f"**{ratio_speed:.2f}x**",
        ]
    )
    write_section("bench/train_parity.py --real", section)
    print(json.dumps(figures, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-eval"))
    parser.add_argument(
        "--real",
        type=Path,
        default=None,
        metavar="DATASET",
        help="the real target's dataset: train-real.yaml's draft, keys real_P7*",
    )
    parser.add_argument("--conversations", type=int, default=800)
    # defaults: toy, then --real
    parser.add_argument("--heldout", type=float, default=None, help="0.15; real 0.1")
    parser.add_argument("--steps", type=int, default=None, help="300; real 150")
    parser.add_argument("--batch", type=int, default=None, help="16; real 8")
    parser.add_argument("--threads", type=int, default=None, help="torch threads: 1; real 2")
    # every held-out prompt (189 of the 800-conversation shards), 4 fresh decodes each:
    # the T=1 ratio's interval is set by the number of decodes
    parser.add_argument(
        "--live-prompts", type=int, default=None, help="at most; 0: skip T=1 (1000; real 0)"
    )
    parser.add_argument("--live-runs", type=int, default=None, help="4; real 1")
    parser.add_argument(
        "--variant-tv-weight",
        type=float,
        default=None,
        help="also train the project's DSpark with loss.tv_weight W (reported apart)",
    )
    args = parser.parse_args()
    defaults = dict(heldout=(0.15, 0.1), steps=(300, 150), batch=(16, 8), threads=(1, 2))
    defaults.update(live_prompts=(1000, 0), live_runs=(4, 1))
    for name, (toy, real) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, real if args.real else toy)
    if args.real:
        if args.variant_tv_weight is not None:
            parser.error("--variant-tv-weight is a toy comparison")
        run_real(args)
        return

    import torch

    torch.set_num_threads(args.threads)
    from results_file import merge_results, write_section

    from pipeline.demo.reference_shards import write_reference_shards
    from pipeline.evaluate.config import parse_eval_config
    from pipeline.evaluate.run import run_evaluation

    started = time.monotonic()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    shards = work / f"shards-bf16-{args.conversations}"  # bench/evaluate.py's names
    if not (shards / "_latest").exists():
        write_reference_shards(shards, num_conversations=args.conversations, num_units=4)
    tag = f"{args.conversations}c-{args.steps}x{args.batch}-h{args.heldout}"
    project = work / f"run-dspark-bf16-{tag}"
    project_s = _project_run(shards, project, args.steps, args.batch, args.heldout)
    variant_name = None
    if args.variant_tv_weight is not None:
        w = args.variant_tv_weight
        variant_name = f"DSpark (this project, tv_weight {w:g})"
        variant = work / f"run-dspark-bf16-{tag}-tv{w:g}"
        _project_run(shards, variant, args.steps, args.batch, args.heldout, {"loss.tv_weight": w})
    theirs = work / f"speculators-dspark-{tag}"
    summary = train_speculators(
        shards, theirs, steps=args.steps, batch=args.batch, heldout=args.heldout
    )
    live = dict(
        temperatures=[1.0],
        num_prompts=args.live_prompts,
        max_new_tokens=128,
        samples_per_prompt=args.live_runs,
    )
    config = parse_eval_config(
        dict(
            target="toy:trained",
            out_dir=str(work / f"parity-eval-{tag}"),
            data=dict(uri=str(shards), heldout_fraction=args.heldout),
            drafts=[
                dict(name="DSpark (this project)", path=str(project)),
                dict(name="DSpark (speculators)", path=str(theirs)),
                *([dict(name=variant_name, path=str(variant))] if variant_name else []),
            ],
            calibration=dict(store=False),
            **({"live": live} if args.live_prompts else {}),
        )
    )
    report = run_evaluation(config).report["drafts"]
    ours, spec = report["DSpark (this project)"], report["DSpark (speculators)"]

    t0 = ratio(ours["offline_t0"], spec["offline_t0"])
    t1 = ratio(ours.get("live", {}).get("1.0"), spec.get("live", {}).get("1.0"))
    load = os.getloadavg()[0]
    budget = (
        f"{args.steps} steps x {args.batch} sequences (the same samples in the same order), "
        f"{ANCHORS_PER_SEQUENCE} anchors per sequence, 2 layers, block 5, Markov rank 64, "
        f"anchor layout, AdamW lr 3e-3 with 4% warmup and cosine, clip 1.0, fp32; "
        f"{args.conversations} conversations, held-out fraction {args.heldout}"
    )
    taus = {
        name: {
            "T0": r["offline_t0"]["tau_macro"],
            "T1": r.get("live", {}).get("1.0", {}).get("tau_macro"),
        }
        for name, r in report.items()
    }
    figures = {
        "P7": t0["ratio"],
        "P7_ci95": t0["ci95"],
        "P7_T1": t1["ratio"] if t1 else None,
        "P7_T1_ci95": t1["ci95"] if t1 else None,
        "P7_tau_macro": taus,
        "P7_speculators_training": summary,
        "P7_budget": budget,
        "P7_bench_load_average": round(load, 2),
    }

    variant_lines = []
    if variant_name:
        key = f"P7_variant_tv{args.variant_tv_weight:g}"
        variant_r = report[variant_name]
        v0 = ratio(variant_r["offline_t0"], spec["offline_t0"])
        v1 = ratio(variant_r.get("live", {}).get("1.0"), spec.get("live", {}).get("1.0"))
        vd = ratio(variant_r["offline_t0"], ours["offline_t0"])
        figures[key] = {"T0": v0, "T1": v1, "T0_over_default": vd}
        variant_lines = [
            line(key, v0, "T=0, variant / speculators", ""),
            line(key + "_T1", v1, "T=1, variant / speculators", ""),
            line(key + "_over_default", vd, "T=0, variant / this project's default", ""),
        ]
    merge_results(figures, replace=("P7_",))  # a run without the variant drops its old keys

    rows = [
        "| draft | macro tau T=0 | macro tau T=1 |",
        "|---|---|---|",
        *[
            f"| {n} | {t['T0']:.3f} | {t['T1']:.3f} |"
            if t["T1"] is not None
            else f"| {n} | {t['T0']:.3f} | n/a |"
            for n, t in taus.items()
        ],
    ]
    live_run = ours.get("live", {}).get("1.0")
    live_shape = (
        f"{live_run['num_samples']} prompts x {live_run.get('samples_per_prompt', 1)} runs"
        if live_run
        else "not run"
    )
    section = "\n".join(
        [
            "## Parity with the field's trainer (bench/train_parity.py, key P7)",
            "",
            "speculators 0.9.0's DSpark (`DSparkDraftModel`, eager attention and eager losses, "
            'its loss `{"ce": 0.1, "tv": 0.9}` + confidence BCE) trained on this project\'s '
            f"shards with the same budget and draft size as the project's DSpark: {budget}. "
            "Its `verifier_norm` is the identity (the shards store the final state after the "
            "norm). Both evaluated by the project's evaluator on the same held-out samples "
            f"(T=0 exact offline walk; T=1 live loop, {live_shape}); "
            "the speculators draft loaded from its own "
            "`save_pretrained` directory through the project's import of the format. "
            f"speculators training: {summary}; project training {project_s:.0f} s (0: reused). "
            f"{platform.processor() or platform.machine()}, load average {load:.2f}, "
            f"{time.monotonic() - started:.0f} s.",
            "",
            *rows,
            "",
            line("P7", t0, "this project / speculators, T=0"),
            line("P7_T1", t1, "this project / speculators, T=1"),
            *variant_lines,
        ]
    )
    write_section("bench/train_parity.py", section)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
