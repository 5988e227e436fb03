"""Regeneration throughput: plain vLLM vs one-pass capture vs the field's two-pass flow (issue 4).

    .venv/bin/python bench/regenerate.py [--targets trained,large] [--rounds 2]
        [--num-prompts 64] [--max-tokens 256] [--inprocess] [--profile]

Same prompts (first user turns of the synthetic corpus, rendered with the
target's template), same engine settings (bf16, max_model_len 1024, prefix
caching off, gpu_memory_utilization 0.2), greedy, every answer forced to
`--max-tokens` tokens (`ignore_eos`), one batch:

(a) plain: a plain vLLM engine generates;
(b) capture: the project's path, `regenerate_unit` on one work unit with the
    capture engine: generation + capture + the unit's shard write (bf16 codec);
(c) two-pass: the field's flow: (a)'s generation, then a second prefill pass
    over prompt + answer (prefix caching off, the capture engine with
    max_tokens=1) and one safetensors file per sample.

Steady state: engine start and a warm-up batch are excluded; engine starts are
reported apart (the two-pass flow loads the target twice). Only one engine
exists at a time, so a round is a plain phase (a) then a capture phase (b, the
second pass of c, and (b0) = the capture engine generating without capture:
the cost of vLLM's method alone); rounds alternate so that the ratios see the
same machine load. Figures are the fastest round (the shared machine's noise
only ever slows a round down); every round is recorded too.

P1 = b / a and P2 = b / c in tokens/s on the larger toy (`large`: hidden 512,
8 layers). Results merge into bench/results.json (other benches' keys are
kept); the section between this bench's markers in bench/RESULTS.md is
replaced. `--inprocess` runs vLLM in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, in-process capture sink). `--profile`
samples the capture phase with py-spy and prints where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from results_file import merge_results, write_section  # bench/ is sys.path[0]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS_JSON = ROOT / "bench" / "results.json"
RESULTS_MD = ROOT / "bench" / "RESULTS.md"
MAX_MODEL_LEN = 1024
CORPUS_SEED = 21


def fixed_length_target_class():
    """`VLLMTarget` whose answers always run to max_tokens (EOS ignored): equal work per run."""
    from pipeline.targets.vllm_backend import VLLMTarget

    class FixedLengthTarget(VLLMTarget):
        def sampling_params(self, request, params, extra_args=None):
            from vllm import SamplingParams

            return SamplingParams(
                temperature=0.0,
                max_tokens=request.max_new_tokens or params.max_new_tokens,
                ignore_eos=True,
                skip_special_tokens=False,
                detokenize=False,
                extra_args=extra_args,
            )

    return FixedLengthTarget


class TimedBackend:
    """Wraps the capture backend for `regenerate_unit`; records time spent in the engine call."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.aux_layer_ids = backend.aux_layer_ids
        self.hidden_size = backend.hidden_size
        self.seconds = 0.0
        self.collect_seconds = 0.0

    def generate_and_capture(self, requests, params):
        reader = self.backend.reader
        collect = reader.collect

        def timed_collect():
            started = time.perf_counter()
            try:
                return collect()
            finally:
                self.collect_seconds += time.perf_counter() - started

        reader.collect = timed_collect
        started = time.perf_counter()
        try:
            return self.backend.generate_and_capture(requests, params)
        finally:
            self.seconds += time.perf_counter() - started
            reader.collect = collect


def build_unit(num_prompts: int):
    from pipeline.corpus.records import Conversation
    from pipeline.corpus.synthetic import SyntheticCorpusConfig, generate
    from pipeline.regenerate.units import WorkUnit

    spec = SyntheticCorpusConfig(
        num_conversations=num_prompts, seed=CORPUS_SEED, multi_turn_fraction=0.0
    )
    convs = [
        Conversation(c["id"], "bench", c["domain"], tuple(c["messages"]), f"bench:{i}")
        for i, c in enumerate(generate(spec))
    ]
    convs.sort(key=lambda c: c.conversation_id)
    return WorkUnit("u0-bench", 0, tuple(convs))


def provenance(name: str, model_dir: str, aux: tuple[int, ...], hidden: int, generation):
    from pipeline.shards.schema import Provenance
    from pipeline.targets.identity import tokenizer_hash, weights_revision

    return Provenance(
        target_name=name,
        target_revision=weights_revision(model_dir, None),
        tokenizer_hash=tokenizer_hash(model_dir),
        aux_layer_ids=aux,
        hidden_size=hidden,
        codec="bf16",
        corpus_version=f"synthetic-{CORPUS_SEED}",
        code_version="bench",
        generation=generation.model_dump(),
    )


class Profiler:
    """py-spy over this process and its children while a phase runs (raw collapsed stacks)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.proc = None

    def __enter__(self):
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        cmd = [spy, "record", "--pid", str(os.getpid()), "--subprocesses", "--rate", "50"]
        cmd += ["--format", "raw", "--output", str(self.out), "--nonblocking"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)


def run_target(name: str, args, log: list[str]) -> dict:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from pipeline.regenerate.unit import UnitSpec, regenerate_unit
    from pipeline.render import first_prompt, render_prompt
    from pipeline.targets.base import GenerationRequest
    from pipeline.targets.config import GenerationConfig, TargetConfig
    from pipeline.toy.target import build_toy_target

    model_dir = str(build_toy_target(name))
    tok = AutoTokenizer.from_pretrained(model_dir)
    unit = build_unit(args.num_prompts)
    # The same ids regenerate_unit renders (round 0, first user turn), in unit order.
    requests = [
        GenerationRequest(
            f"{c.conversation_id}/0", render_prompt(tok, first_prompt(list(c.messages)))
        )
        for c in unit.conversations
    ]
    params = GenerationConfig(temperature=0.0, max_new_tokens=args.max_tokens)
    warm = GenerationConfig(temperature=0.0, max_new_tokens=8)
    config = TargetConfig(
        model=model_dir,
        dtype="bfloat16",
        max_model_len=MAX_MODEL_LEN,
        gpu_memory_utilization=0.2,
        engine_kwargs={"enable_prefix_caching": False},
    )
    Target = fixed_length_target_class()
    work = Path(tempfile.mkdtemp(prefix=f"bench-regen-{name}-"))
    gen_tokens = args.num_prompts * args.max_tokens
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    rounds = []
    starts = {"plain": [], "capture": []}
    try:
        for round_ in range(args.rounds):
            r: dict = {}
            # ---- plain phase: (a)
            t0 = time.perf_counter()
            plain = Target(config, model_dir, capture=False)
            starts["plain"].append(time.perf_counter() - t0)
            plain.generate(requests[:4], warm)
            t0, c0 = time.perf_counter(), cpu_seconds()
            answers = plain.generate(requests, params)
            r["a_s"] = time.perf_counter() - t0
            r["a_cpu_s"] = cpu_seconds() - c0
            plain.close()
            del plain
            assert sum(len(g.output_ids) for g in answers) == gen_tokens
            # ---- capture phase: (b), second pass of (c), (b0)
            t0 = time.perf_counter()
            cap = Target(config, model_dir, capture=True)
            starts["capture"].append(time.perf_counter() - t0)
            spec = UnitSpec(
                dataset_uri=str(work / "dataset"),
                endpoint_url=None,
                provenance=provenance(
                    f"toy:{name}", model_dir, cap.aux_layer_ids, cap.hidden_size, params
                ),
                generation=params,
                turns="last",
                max_model_len=MAX_MODEL_LEN,
                min_answer_tokens=1,
                batch_size=args.num_prompts,
            )
            # Warm-up through the whole unit path (imports, codec, writer) on 4 prompts.
            warm_unit = type(unit)("u1-warmup", 1, unit.conversations[:4])
            regenerate_unit(cap, tok, warm_unit, replace(spec, generation=warm))
            timed = TimedBackend(cap)
            profile = work / f"profile-{round_}.txt" if args.profile and round_ == 0 else None
            t0, c0 = time.perf_counter(), cpu_seconds()
            if profile:
                with Profiler(profile):
                    result = regenerate_unit(timed, tok, unit, spec)
            else:
                result = regenerate_unit(timed, tok, unit, spec)
            r["b_s"] = time.perf_counter() - t0
            r["b_cpu_s"] = cpu_seconds() - c0
            r["b_engine_call_s"] = timed.seconds
            r["b_collect_s"] = timed.collect_seconds
            r["b_shard_and_render_s"] = r["b_s"] - timed.seconds
            r["shard_bytes"] = result.shard.bytes
            assert result.num_generated_tokens == gen_tokens, result
            # (c) second pass: prefill prompt + answer (from the plain engine) and capture.
            second = [
                GenerationRequest(f"{g.request_id}/prefill", g.prompt_ids + g.output_ids, 1)
                for g in answers
            ]
            files = work / f"two-pass-{round_}"
            files.mkdir()
            t0, c0 = time.perf_counter(), cpu_seconds()
            caps = cap.generate_and_capture(second, params)
            r["c_prefill_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            for g, c in zip(answers, caps, strict=True):
                n = len(c.prompt_ids)  # prompt + answer, all fed in the prefill
                save_file(
                    {
                        "input_ids": torch.tensor(c.prompt_ids, dtype=torch.int32),
                        "loss_mask": torch.tensor(
                            [0] * len(g.prompt_ids) + [1] * len(g.output_ids), dtype=torch.uint8
                        ),
                        "hidden_states": c.hidden_states[:n].contiguous(),
                        "last_hidden_state": c.last_hidden_state[:n].contiguous(),
                    },
                    str(files / f"{len(os.listdir(files)):05d}.safetensors"),
                )
            os.sync()
            r["c_write_s"] = time.perf_counter() - t0
            r["c_s"] = r["a_s"] + r["c_prefill_s"] + r["c_write_s"]
            r["c_cpu_s"] = r["a_cpu_s"] + cpu_seconds() - c0
            # (b0) the capture engine without capture: vLLM's method alone.
            t0, c0 = time.perf_counter(), cpu_seconds()
            cap.generate(requests, params)
            r["b0_s"] = time.perf_counter() - t0
            r["b0_cpu_s"] = cpu_seconds() - c0
            cap.close()
            del cap
            shutil.rmtree(files)
            rounds.append({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})
            line = f"{name} round {round_}: " + json.dumps(rounds[-1])
            print(line, flush=True)
            log.append(line)
            if profile:
                summary = summarise_profile(profile, name)
                print(summary, flush=True)
                log.append(summary)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def best(key: str) -> float:
        return min(r[key] for r in rounds)

    out = {
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "generated_tokens": gen_tokens,
        "prompt_tokens": prompt_tokens,
        "plain_tok_s": gen_tokens / best("a_s"),
        "capture_tok_s": gen_tokens / best("b_s"),
        "two_pass_tok_s": gen_tokens / best("c_s"),
        "capture_engine_no_capture_tok_s": gen_tokens / best("b0_s"),
        "second_pass_prefill_s": best("c_prefill_s"),
        "second_pass_write_s": best("c_write_s"),
        "engine_start_plain_s": min(starts["plain"]),
        "engine_start_capture_s": min(starts["capture"]),
        "rounds": rounds,
    }
    out["P1"] = out["capture_tok_s"] / out["plain_tok_s"]
    out["P2"] = out["capture_tok_s"] / out["two_pass_tok_s"]
    # Per-round ratios (adjacent phases), to show the spread the fastest-round figures hide.
    out["P1_per_round"] = [r["a_s"] / r["b_s"] for r in rounds]
    out["P2_per_round"] = [r["c_s"] / r["b_s"] for r in rounds]
    # The same ratios in CPU seconds of our processes (less sensitive to other jobs).
    out["P1_cpu"] = min(r["a_cpu_s"] for r in rounds) / min(r["b_cpu_s"] for r in rounds)
    out["P2_cpu"] = min(r["c_cpu_s"] for r in rounds) / min(r["b_cpu_s"] for r in rounds)
    out["capture_engine_no_capture_cpu_ratio"] = min(r["a_cpu_s"] for r in rounds) / min(
        r["b0_cpu_s"] for r in rounds
    )
    return out


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its live descendants (the engine's).

    On a shared machine wall time swings with other jobs; CPU time of our own
    processes much less, as long as no process of ours spin-waits (the
    multiprocessing engine's core process polls its workers, so there it grows
    with wall time; in-process runs have no such poller).
    """
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def summarise_profile(path: Path, name: str, top: int = 25) -> str:
    """Self-time share of the hottest frames (leaf) and of selected subtrees, from py-spy raw output."""
    leaf: dict[str, int] = {}
    total = 0
    marks = {
        "connector wait_for_save (gather + sink)": "wait_for_save (pipeline/targets",
        "spool write (safetensors)": "write_spool (pipeline/targets",
        "owner: read spool + assemble": "collect (pipeline/targets/capture.py",
        "owner: contract tensors + final norm": "_to_captured (pipeline/targets",
        "shard writer (encode + write)": "pipeline/shards/writer.py",
        "rejection sampler": "rejection_sampler.py",
        "extract_hidden_states proposer": "spec_decode/extract_hidden_states.py",
        "target model forward": "qwen3.py",
        "spin-wait (shm broadcast sched_yield)": "sched_yield",
    }
    subtree = dict.fromkeys(marks, 0)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + n
        for label, needle in marks.items():
            if needle in stack:
                subtree[label] += n
    lines = [f"py-spy {name}: {total} samples (all processes; idle waits included)"]
    lines += [f"  subtree {k}: {100 * v / max(total, 1):.1f}%" for k, v in subtree.items()]
    for frame, n in sorted(leaf.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  leaf {100 * n / max(total, 1):5.1f}%  {frame}")
    return "\n".join(lines)


def write_markdown(results: dict, args, load: float, mode: str, tag: str, profile: str) -> None:
    lines = [
        f"# Regeneration benchmark (bench/regenerate.py{tag})",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other jobs, "
        f"load average {load:.1f} at start. vLLM CPU ({mode}), bf16, greedy, "
        f"{args.num_prompts} prompts x {args.max_tokens} generated tokens (EOS ignored), one batch, "
        f"prefix caching off, {args.rounds} alternating rounds; figures are the fastest round.",
        "",
        "| target | (a) plain tok/s | (b) capture tok/s | (c) two-pass tok/s | P1 = b/a | P2 = b/c "
        "| P1 / P2 in CPU seconds | b0: capture engine, no capture, tok/s "
        "| engine start plain / capture (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['plain_tok_s']:.0f} | {r['capture_tok_s']:.0f} | "
            f"{r['two_pass_tok_s']:.0f} | {r['P1']:.3f} | {r['P2']:.3f} | "
            f"{r['P1_cpu']:.3f} / {r['P2_cpu']:.3f} | "
            f"{r['capture_engine_no_capture_tok_s']:.0f} | "
            f"{r['engine_start_plain_s']:.0f} / {r['engine_start_capture_s']:.0f} |"
        )
    lines += ["", "Per round (seconds):", ""]
    for name, r in results.items():
        for i, rnd in enumerate(r["rounds"]):
            lines.append(f"* {name} round {i}: " + ", ".join(f"{k} {v}" for k, v in rnd.items()))
    if profile:
        lines += [
            "",
            "Profile (py-spy, capture phase of the first round):",
            "",
            "```",
            profile,
            "```",
        ]
    write_section(f"bench/regenerate.py{tag}", "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default="trained,large")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--inprocess", action="store_true")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--no-write", action="store_true", help="print only; leave results files alone")
    args = p.parse_args()
    if args.inprocess:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["DSPARK_CAPTURE_TRANSPORT"] = "inprocess"
    load = os.getloadavg()[0]
    log: list[str] = []
    results: dict[str, dict] = {}
    for name in args.targets.split(","):
        results[name] = run_target(name, args, log)
        summary = {k: v for k, v in results[name].items() if k != "rounds"}
        print(json.dumps({name: summary}), flush=True)
        if not args.no_write:  # after each target, so a long run keeps what it measured
            record(results, args, load, log)


def record(results: dict, args, load: float, log: list[str]) -> None:
    mode = (
        "in-process engine, in-process sink" if args.inprocess else "engine-core subprocess, spool"
    )
    tag = " --inprocess" if args.inprocess else ""
    key = "regen_inprocess_" if args.inprocess else "regen_"
    flat: dict = {f"{key}bench_load_average": round(load, 2), f"{key}bench_mode": mode}
    for name, r in results.items():
        for field, value in r.items():
            if field == "rounds":
                continue
            flat[f"{key}{name}_{field}"] = (
                [round(v, 3) for v in value] if isinstance(value, list) else round(value, 3)
            )
    if "large" in results:
        suffix = "_inprocess" if args.inprocess else ""
        flat["P1" + suffix] = round(results["large"]["P1"], 3)
        flat["P2" + suffix] = round(results["large"]["P2"], 3)
    merge_results(flat)
    profile = "\n".join(x for x in log if x.startswith("py-spy"))
    write_markdown(results, args, load, mode, tag, profile)
    print(f"wrote {RESULTS_JSON.relative_to(ROOT)} and {RESULTS_MD.relative_to(ROOT)}", flush=True)


if __name__ == "__main__":
    main()
