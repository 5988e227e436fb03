"""Regeneration throughput: plain vLLM, the two-pass flow and the shipped `run_regenerate`.

    .venv/bin/python bench/regenerate.py [--targets trained,large] [--rounds 3]
        [--conversations trained=4000,large=1000] [--turns all|last] [--profile] [--no-write]
    .venv/bin/python bench/regenerate.py --targets real --no-two-pass [--rounds 3]

Workload (what a user has): synthetic conversations of a held-out seed with
their natural lengths, about 30% multi-turn, greedy, EOS honoured, the
default config (pipeline/demo/configs/toy.yaml; for `--targets real`
SmolLM2-135M-Instruct's real-smollm2.yaml, `turns: last`), every assistant
turn regenerated (`--turns`, default the config's). Three paths on the same
conversations, engine starts excluded from every rate (reported apart):

(a) plain vLLM fed as well as it can be: a step loop over its `LLMEngine`
    with the project's admission (a conversation's next turn submitted the
    moment its turn returns, no round barrier), the replica's CPU isolation,
    the engine core on the host CPUs and on the model worker's (the faster
    counts), prefix caching off (faster on this workload); no capture; each
    run on an engine started for it, as (c)'s is;
(b) the field's two-pass flow: (a), then a capture engine prefills prompt +
    answer of every sample and one safetensors file per sample is written;
(c) the shipped stage: `run_regenerate` through a local Ray, committing
    compressed shards; its steady-state rate (every engine up to the last
    shard written).

Rounds alternate the order, so the ratios see the same machine load; each
ratio is per round, reported as the median with its range. P1 = c / a and
P2 = c / b in generated tok/s (`P1`/`P2` on the large toy,
`regen_trained_P1/P2` on the trained toy, `real_P1` on the real target).
`--profile` samples one more run of (c) with py-spy (the replica, its engine
processes and its write-back, on-CPU samples) and prints the shares of
engine, capture, transport, encoding, writing and Ray. Results merge into
bench/results.json; each target's keys and RESULTS.md section are its own.
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
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from results_file import (  # bench/ is sys.path[0]
    bf16_native,
    cpu_capability,
    fmt_spread,
    merge_results,
    spread,
    write_section,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS_SEED = 7  # the toys trained on seed 0; this is held-out text
REAL = "real"  # the real target's name here: its default config, real-smollm2.yaml


def bench_config(name: str, conversations: int, out: Path, turns: str | None = None):
    """The default regeneration config, on toy `name` (or the real target, `real`) and
    `conversations` held-out conversations; `turns` overrides `regenerate.turns`."""
    from pipeline.demo import CONFIG_DIR
    from pipeline.regenerate.config import load_config

    chosen = {"regenerate.turns": turns} if turns else {}
    if name == REAL:  # its own default config: only the workload's size, seed and output change
        return load_config(
            CONFIG_DIR / "real-smollm2.yaml",
            overrides={
                "name": "bench-real",
                "corpus.synthetic.num_conversations": conversations,
                "corpus.synthetic.seed": CORPUS_SEED,
                "output.uri": str(out),
                **chosen,
            },
        )
    return load_config(
        CONFIG_DIR / "toy.yaml",
        overrides={
            "name": f"bench-{name}",
            "target.model": f"toy:{name}",
            "target.aux_layer_ids": None,  # the DFlash spacing for the toy's depth
            "corpus.synthetic.num_conversations": conversations,
            "corpus.synthetic.seed": CORPUS_SEED,
            "output.uri": str(out),
            **chosen,
        },
    )


# --------------------------------------------------------------------------- (a) and (b)


def plain_fed(llm, tokenizer, config, conversations) -> tuple[dict, float, int, int, dict]:
    """(a): a plain engine fed the way the project feeds its capture engine, without
    capture: a step loop over `LLMEngine` with up to `max_requests_in_flight` requests
    in it, a conversation's next turn submitted the moment its turn returns (ahead of
    waiting first turns). No round barrier: the plain engine as well as it can be fed
    (turn rounds of `LLM.generate` idle on each round's tail). Also
    returns the loop's seconds admitting, in engine steps and handling results, split
    as (c)'s feeder splits its own (`c_admit_s`, `c_step_s`, `c_handle_s`)."""
    import heapq

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from pipeline.corpus.identity import sample_id
    from pipeline.render import answer_budget, answer_turns, prompt_messages, render_prompt

    gen, engine = config.generation, llm.llm_engine
    limit = config.regenerate.requests_in_flight(
        int(engine.vllm_config.scheduler_config.max_num_seqs)
    )
    eos = tokenizer.eos_token_id
    by_id = {c.conversation_id: c for c in conversations}
    which = config.regenerate.turns  # as the unit job: "last" keeps the original history
    turns = {c.conversation_id: answer_turns(c.messages, which) for c in conversations}
    texts: dict[str, list[str]] = {c.conversation_id: [] for c in conversations}
    answers: dict[str, tuple[list[int], list[int]]] = {}
    waiting = [  # (prio, order, conversation, turn): each conversation's first wanted turn
        (1, i, c.conversation_id, turns[c.conversation_id][0])
        for i, c in enumerate(conversations)
        if turns[c.conversation_id]
    ]
    heapq.heapify(waiting)
    order = len(conversations)
    in_flight: dict[str, tuple[str, int, list[int]]] = {}
    phases = {"admit_s": 0.0, "step_s": 0.0, "handle_s": 0.0}
    started = time.perf_counter()
    while waiting or in_flight:
        admitting = time.perf_counter()
        while waiting and len(in_flight) < limit:
            _, _, cid, turn = heapq.heappop(waiting)
            conv = by_id[cid]
            history = texts[cid] if which == "all" else None
            prompt = render_prompt(tokenizer, prompt_messages(conv.messages, turn, history))
            budget = answer_budget(len(prompt), gen.max_new_tokens, config.target.max_model_len)
            if budget < config.regenerate.min_answer_tokens:
                continue  # the conversation ends here, as in the unit job
            params = SamplingParams(
                temperature=0.0,
                max_tokens=budget,
                stop_token_ids=[eos],
                include_stop_str_in_output=True,
                skip_special_tokens=False,
                detokenize=False,
            )
            params.output_kind = RequestOutputKind.FINAL_ONLY
            rid = sample_id(cid, turn)
            engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
            in_flight[rid] = (cid, turn, prompt)
        stepping = time.perf_counter()
        outputs = engine.step()
        handling = time.perf_counter()
        phases["admit_s"] += stepping - admitting
        phases["step_s"] += handling - stepping
        for out in outputs:
            if not out.finished:
                continue
            cid, turn, prompt = in_flight.pop(out.request_id)
            answer = list(out.outputs[0].token_ids)
            if not answer:
                continue
            answers[out.request_id] = (prompt, answer)
            later = [t for t in turns[cid] if t > turn]
            if later:  # the next turn sees this answer as text (the unit job decodes only then)
                texts[cid].append(tokenizer.decode(answer, skip_special_tokens=True))
                order += 1
                heapq.heappush(waiting, (0, order, cid, later[0]))  # next turns first
        phases["handle_s"] += time.perf_counter() - handling
    seconds = time.perf_counter() - started
    prompt_tokens = sum(len(p) for p, _ in answers.values())
    generated = sum(len(a) for _, a in answers.values())
    return answers, seconds, prompt_tokens, generated, phases


def second_pass(capture, answers: dict, out_dir: Path) -> float:
    """(b)'s second pass: prefill prompt + answer with capture, one safetensors file per sample."""
    import torch
    from safetensors.torch import save_file

    from pipeline.targets.base import GenerationRequest
    from pipeline.targets.config import GenerationConfig

    requests = [GenerationRequest(sid, p + a, 1) for sid, (p, a) in answers.items()]
    started = time.perf_counter()
    caps = capture.generate_and_capture(requests, GenerationConfig(max_new_tokens=1))
    out_dir.mkdir(parents=True)
    for cap in caps:
        prompt, answer = answers[cap.request_id]
        n = len(prompt) + len(answer)  # every token of prompt + answer was fed
        states = cap.rows.states()  # built already (generate_and_capture)
        save_file(
            {
                "input_ids": torch.tensor(prompt + answer, dtype=torch.int32),
                "loss_mask": torch.tensor([0] * len(prompt) + [1] * len(answer), dtype=torch.uint8),
                "hidden_states": states.hidden_states[:n].contiguous(),
                "last_hidden_state": states.last_hidden_state[:n].contiguous(),
            },
            str(out_dir / f"{cap.request_id}.safetensors"),
        )
    os.sync()
    return time.perf_counter() - started


def plain_engine(config):
    """(a)'s engine: the target's vLLM arguments, prefix caching off. (llm, tokenizer, start s)."""
    from transformers import AutoTokenizer
    from vllm import LLM

    from pipeline.targets.engine_env import apply_engine_env
    from pipeline.targets.resolve import resolve_model
    from pipeline.targets.vllm_backend import engine_kwargs

    model_dir = resolve_model(config.target.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    apply_engine_env()  # as (c)'s engine starts
    t0 = time.perf_counter()
    kwargs = engine_kwargs(config.target, model_dir)
    kwargs["enable_prefix_caching"] = False  # faster here (see the module docstring)
    llm = LLM(**kwargs)
    return llm, tokenizer, time.perf_counter() - t0


@contextmanager
def host_work_isolated(engine_core_cpus: str = "host"):
    """The replica's CPU isolation for an engine started by this process (cpu_host.py): this
    thread moves off the model worker's cores while the block runs, the engine core
    beside it or onto the worker's cores.
    (c) gets it from its replica; (a) and (b) get it here, so the baselines are set up
    as well as the shipped stage (without it, (a) ran up to 1.3x slower here).
    `engine_core_cpus` ("host" or "workers"): where the engine core goes ((c)'s
    replica always puts it on the workers' CPUs; the baseline tries both).

    Only vLLM's processes move (titled `VLLM::`): this process is also Ray's parent,
    and a Ray worker moved onto the host CPUs would later hold (c)'s replica, its
    engine then bound inside that one CPU (measured: (c) at half its speed)."""
    from pipeline.regenerate.replica.cpu_host import cmdline, descendants, isolate_host_work

    title = os.environ.get("VLLM_PROCESS_NAME_PREFIX", "VLLM") + "::"
    saved = os.sched_getaffinity(0)
    isolate_host_work(
        keep={p for p in descendants(os.getpid()) if title not in cmdline(p)},
        engine_core_on_workers=engine_core_cpus == "workers",
    )
    try:
        yield
    finally:  # later engines started from this thread bind their workers from its mask
        os.sched_setaffinity(0, saved)


def engine_cpu() -> dict[str, float]:
    """CPU seconds so far of (a)'s loop (this process), its engine's model workers and its
    engine core: what (c)'s `c_cpu_*_s` count for the replica's processes."""
    from pipeline.regenerate.replica.cpu_host import cmdline, cpu_seconds, descendants

    out = {"loop": cpu_seconds(os.getpid()), "workers": 0.0, "engine": 0.0}
    for pid in descendants(os.getpid()):
        title = cmdline(pid)
        if "VLLM::" in title:
            out["workers" if "Worker" in title else "engine"] += cpu_seconds(pid)
    return out


PLACEMENTS = ("host", "workers")  # where (a)'s engine core runs (cpu_host.py places (c)'s)


def run_a_b(
    config,
    conversations,
    work: Path,
    *,
    round_: int = 0,
    two_pass: bool = True,
) -> dict:
    """(a) under both engine-core placements (alternating which goes first by round),
    each on an engine of its own started for it, as (c) starts its own: a vLLM
    engine's first minute pays for its heap growing (the model worker's first-touch
    page faults), so a second run on the same engine was measured warm against a
    cold (c) (bench/RESULTS.md). Each placement's figures are kept (`a_by_placement`)
    and the round's faster one is (a) until the run picks its placement
    (`pick_placement`); then (b), its first pass being that run, its second pass
    under the same placement (left out with `two_pass=False`: (a) alone)."""
    from pipeline.targets.resolve import resolve_model
    from pipeline.targets.vllm_backend import VLLMTarget, shutdown_engine

    model_dir = resolve_model(config.target.model)
    runs, extra, by_placement, starts = {}, {}, {}, {}
    for placement in PLACEMENTS if round_ % 2 == 0 else PLACEMENTS[::-1]:
        llm, tokenizer, starts[placement] = plain_engine(config)
        before = engine_cpu()
        with host_work_isolated(placement):
            runs[placement] = plain_fed(llm, tokenizer, config, conversations)
        cpu = {k: v - before[k] for k, v in engine_cpu().items()}
        shutdown_engine(llm)
        del llm
        _free()
        _, seconds, _, generated, phases = runs[placement]
        extra[f"a_{placement}_s"] = seconds
        extra[f"a_{placement}_tok_s"] = generated / seconds
        by_placement[placement] = {
            "a_s": seconds,
            **{f"a_{k}": v for k, v in phases.items()},
            **{f"a_cpu_{role}_s": round(v, 2) for role, v in cpu.items()},
        }
    best = max(PLACEMENTS, key=lambda k: extra[f"a_{k}_tok_s"])
    answers, a_s, prompt_tokens, generated, phases = runs[best]
    start_a = starts[best]
    extra["a_placement"] = best
    extra |= by_placement[best]
    extra["a_by_placement"] = by_placement
    plain = {
        "a_s": a_s,
        **extra,
        "a_prompt_tokens": prompt_tokens,
        "a_generated_tokens": generated,
        "a_samples": len(answers),
        "a_engine_start_s": start_a,
    }
    if not two_pass:
        return plain
    t0 = time.perf_counter()
    # The second pass feeds prompt + answer and samples one token: one more than
    # the context the answers were generated in.
    wider = config.target.model_copy(update={"max_model_len": config.target.max_model_len + 1})
    capture = VLLMTarget(wider, model_dir, capture=True)
    start_b = time.perf_counter() - t0
    with host_work_isolated(best):
        b2_s = second_pass(capture, answers, work / "two-pass")
    capture.close()
    del capture
    _free()
    shutil.rmtree(work / "two-pass", ignore_errors=True)
    return plain | {
        "b_s": a_s + b2_s,
        "b_second_pass_s": b2_s,
        "b_engine_start_s": start_a + start_b,
    }


def _free() -> None:
    import gc

    gc.collect()


# --------------------------------------------------------------------------- (c)


def run_c(config, profile: Path | None) -> dict:
    from pipeline.regenerate.run import replica_name_prefix, run_regenerate

    spy = _Profiler(profile, f"{replica_name_prefix(config)}-0") if profile else None
    if spy:
        spy.start()
    try:
        summary = run_regenerate(config, show_progress=False)
    finally:
        if spy:
            spy.stop()
    stats = summary.replica_stats[0] if summary.replica_stats else {}
    return {
        "c_s": summary.steady_seconds,
        "c_total_s": summary.seconds,
        "c_engine_start_s": summary.engine_start_seconds,
        "c_prompt_tokens": summary.prompt_tokens,
        "c_generated_tokens": summary.generated_tokens,
        "c_samples": summary.samples,
        "c_errors": sum(summary.errors_by_reason.values()),
        "c_bytes": summary.bytes_written,
        "c_peak_capture_mb": stats.get("peak_capture_bytes", 0) / 2**20,
        "c_peak_in_flight": stats.get("peak_in_flight", 0),
        "c_peak_units": stats.get("peak_units_held", 0),
        "c_units_wanted": stats.get("units_wanted", 0),
        "c_engine_steps": stats.get("steps", 0),
        "c_step_s": stats.get("step_seconds", 0.0),
        "c_handle_s": stats.get("handle_seconds", 0.0),
        "c_admit_s": stats.get("admit_seconds", 0.0),
        "c_idle_s": stats.get("idle_seconds", 0.0),
        "c_mean_batch": stats.get("busy_slots", 0) / max(1, stats.get("steps", 0)),
        "c_encode_s": stats.get("encode_seconds", 0.0),
        **{f"c_cpu_{role}_s": v for role, v in stats.get("cpu_seconds", {}).items()},
    }


class _Profiler:
    """py-spy over the replica actor (and its engine process) while (c) runs."""

    def __init__(self, out: Path, actor_name: str) -> None:
        self.out, self.actor_name = out, actor_name
        self.proc = None
        self.thread = threading.Thread(target=self._attach, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _attach(self) -> None:
        import ray

        from pipeline.regenerate.driver.pool import RAY_NAMESPACE

        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                actor = ray.get_actor(self.actor_name, namespace=RAY_NAMESPACE)
                pid = ray.get(actor.ready.remote(), timeout=600)["pid"]
                break
            except Exception:
                time.sleep(1)
        else:
            return
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        cmd = [spy, "record", "--pid", str(pid), "--subprocesses", "--rate", "50"]
        cmd += ["--format", "raw", "--output", str(self.out), "--nonblocking"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        import signal

        self.thread.join(timeout=5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=120)


SHARES = {
    # label: substrings of a frame that put a sample there; the frame nearest the leaf
    # decides (the target's forward runs inside the capture worker's wrapper, so a
    # root-first match would count every forward as capture)
    "engine spin-wait (vLLM shm broadcast, sched_yield)": ("sched_yield", "SpinCondition"),
    "capture (worker gather + spool write)": (
        "capture_worker.py",
        "capture_connector.py",
        "write_spool",
    ),
    "capture transport (spool read + assembly)": (
        "take_chunks",
        "read_spool",
        "CaptureAssembler",
        "SpoolRows",
    ),
    "contract tensors + final norm": ("to_states", "join_parts", "pending.py"),
    "encoding (codecs)": ("codecs.py",),
    "shard writing (Parquet, hash, storage)": ("shards/writer.py", "pyarrow", "storage/"),
    "target forward": ("qwen3.py", "qwen2.py", "model_executor/", "attention/backends"),
    "engine: scheduler, sampler, outputs": ("vllm/",),
    "write-back process (messages)": ("writeback_process.py",),
    "feeder and unit jobs (render, decode, samples)": ("regenerate/", "render.py"),
    "Ray": ("ray/",),
}


def _share(frames: list[str]) -> str:
    """The label of the leaf-most frame any label's substrings match ("other" if none)."""
    for frame in reversed(frames):
        for label, needles in SHARES.items():
            if any(needle in frame for needle in needles):
                return label
    return "other"


def summarise_profile(path: Path) -> dict[str, float]:
    """Share of on-CPU samples (every thread of the replica and its engine processes) per part."""
    counts = dict.fromkeys([*SHARES, "other"], 0)
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        counts[_share(stack.split(";"))] += n
    return {k: round(100 * v / max(total, 1), 1) for k, v in counts.items()}


# --------------------------------------------------------------------------- codec speed


def encode_rates(tokens: int = 512, hidden: int = 7168, states: int = 6) -> dict:
    """bf16 codec MB/s per core at the 2.8T example's width, 1 and 2 threads."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from pipeline.shards import codecs

    g = torch.Generator().manual_seed(0)
    width = hidden * states
    x = torch.randn(tokens, width, generator=g) * torch.exp(0.5 * torch.randn(width, generator=g))
    x = x.to(torch.bfloat16)
    mb = x.numel() * 2 / 1e6
    out = {}
    for threads in (1, 2):
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda _: codecs.encode(x, "bf16"), range(threads)))
            c0, t0 = time.process_time(), time.perf_counter()
            list(pool.map(lambda _: codecs.encode(x, "bf16"), range(4 * threads)))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        out[f"encode_{threads}t_MBps"] = 4 * threads * mb / wall
        out[f"encode_{threads}t_MBps_per_cpu_s"] = 4 * threads * mb / cpu
    return out


# --------------------------------------------------------------------------- driver


def conversations_for(args, name: str) -> int:
    """`--conversations N` for every target, or `name=N,name=N` per target."""
    spec = str(args.conversations)
    if "=" not in spec:
        return int(spec)
    counts = dict(part.split("=", 1) for part in spec.split(","))
    if name not in counts:
        raise SystemExit(f"--conversations {spec!r} names no count for target {name!r}")
    return int(counts[name])


def rate_a_c(r: dict) -> None:
    """A round's rates and P1 from its (a) and (c) seconds."""
    r["a_tok_s"] = r["a_generated_tokens"] / r["a_s"]
    r["c_tok_s"] = r["c_generated_tokens"] / r["c_s"]
    r["c_captured_tok_s"] = (r["c_generated_tokens"] + r["c_prompt_tokens"]) / r["c_s"]
    r["P1"] = r["c_tok_s"] / r["a_tok_s"]


def _rounded(r: dict) -> dict:
    return {
        k: _rounded(v) if isinstance(v, dict) else round(v, 3) if isinstance(v, float) else v
        for k, v in r.items()
    }


def pick_placement(rounds: list[dict]) -> list[dict]:
    """(a) under one placement for the whole run, the one with the higher median rate: a
    placement is a setting a user picks once, and taking the faster of two runs in each
    round would credit (a) with the host's noise (the better of two draws). Every round's
    (a) figures and P1 are then that placement's."""
    from statistics import median

    best = max(PLACEMENTS, key=lambda k: median(r[f"a_{k}_tok_s"] for r in rounds))
    picked = []
    for r in rounds:
        r = {**r, **r["a_by_placement"][best], "a_placement": best}
        r["P1_round_best"] = r["P1"]  # the faster placement of each round, for comparison
        rate_a_c(r)
        picked.append(_rounded(r))
    return picked


def run_target(name: str, args, log: list[str]) -> dict:
    from pipeline.corpus.ingest import load_corpus
    from pipeline.regenerate.driver.pool import init_ray
    from pipeline.targets.resolve import resolve_model
    from pipeline.toy.target import build_toy_target

    if name == REAL:  # converted once and cached (make setup-real); resolving checks it is there
        resolve_model(bench_config(name, 1, Path("unused")).target.model)
    else:
        build_toy_target(name)
    two_pass = not args.no_two_pass
    work = Path(tempfile.mkdtemp(prefix=f"bench-regen-{name}-"))
    rounds = []
    profile_shares = None
    try:
        config = bench_config(name, conversations_for(args, name), work / "unused", args.turns)
        conversations = load_corpus(config.corpus).conversations
        init_ray(config.ray)
        for round_ in range(args.rounds):
            r: dict = {}
            order = ("ab", "c") if round_ % 2 == 0 else ("c", "ab")
            for phase in order:
                if phase == "ab":
                    r.update(
                        run_a_b(
                            config,
                            conversations,
                            work / f"r{round_}",
                            round_=round_,
                            two_pass=two_pass,
                        )
                    )
                else:
                    cfg = bench_config(
                        name, conversations_for(args, name), work / f"r{round_}-dataset", args.turns
                    )
                    r.update(run_c(cfg, None))
            rate_a_c(r)
            if two_pass:
                r["b_tok_s"] = r["a_generated_tokens"] / r["b_s"]
                r["b_captured_tok_s"] = (r["a_generated_tokens"] + r["a_prompt_tokens"]) / r["b_s"]
                r["P2"] = r["c_tok_s"] / r["b_tok_s"]
            rounds.append(_rounded(r))
            line = f"{name} round {round_} ({'+'.join(order)}): " + json.dumps(rounds[-1])
            print(line, flush=True)
            log.append(line)
        if "a_by_placement" in rounds[0]:
            rounds = pick_placement(rounds)
            print(f"{name}: (a) placement {rounds[0]['a_placement']} for every round", flush=True)
        if args.profile:  # an extra run: a profiler slows what it samples, so no round has it
            profile = work / "profile.txt"
            run_c(
                bench_config(name, conversations_for(args, name), work / "profiled", args.turns),
                profile,
            )
            if profile.exists():
                profile_shares = summarise_profile(profile)
                if args.keep_profile:
                    shutil.copy(profile, args.keep_profile)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(key: str) -> dict:
        return spread(r[key] for r in rounds)

    out = {
        "conversations": len(conversations),
        "samples": rounds[0]["c_samples"],
        "generated_tokens": rounds[0]["c_generated_tokens"],
        "prompt_tokens": rounds[0]["c_prompt_tokens"],
        "a_samples": rounds[0]["a_samples"],
        "a_generated_tokens": rounds[0]["a_generated_tokens"],
        "a_prompt_tokens": rounds[0]["a_prompt_tokens"],  # equal to (c)'s: the same prompts
        **{
            k: med(k)
            for k in (
                "a_tok_s",
                "b_tok_s",
                "c_tok_s",
                "b_captured_tok_s",
                "c_captured_tok_s",
                "P1",
                "P1_round_best",
                "P2",
                "a_s",
                "c_s",
            )
            if k in rounds[0]  # (b)'s only with the two-pass flow
        },
        **{
            k: med(k)
            for k in (
                "a_engine_start_s",
                "b_engine_start_s",
                "c_engine_start_s",
                "c_peak_capture_mb",
            )
            if k in rounds[0]
        },
        "rounds": rounds,
    }
    if "a_host_tok_s" in rounds[0]:
        out["a_host_tok_s"] = med("a_host_tok_s")
        out["a_workers_tok_s"] = med("a_workers_tok_s")
        out["a_placement"] = [r["a_placement"] for r in rounds]
    if "a_admit_s" in rounds[0]:  # where each loop's time went, (a)'s and (c)'s alike
        for phase in ("admit_s", "step_s", "handle_s"):
            out[f"a_{phase}"], out[f"c_{phase}"] = med(f"a_{phase}"), med(f"c_{phase}")
    for r in rounds:  # every process of each path, summed
        r["a_cpu_s"] = round(sum(v for k, v in r.items() if k.startswith("a_cpu_")), 2)
        r["c_cpu_s"] = round(sum(v for k, v in r.items() if k.startswith("c_cpu_")), 2)
    for key in ("a_cpu_s", "c_cpu_s"):
        out[key] = med(key)
    for key in (k for k in rounds[0] if k.startswith(("a_cpu_", "c_cpu_"))):
        out.setdefault(key, med(key))
    if profile_shares:
        out["profile_c_percent"] = profile_shares
    return out


def cpu_line(r: dict) -> str:
    """CPU seconds of every process of (a) and of (c), by role. vLLM's engine core and
    worker spin while they wait, filling a core they have to themselves, so these count
    where a path's processes ran, not what its work needs."""
    a = ", ".join(
        f"{k[6:-2]} {fmt_spread(r[k], 2)}" for k in r if k.startswith("a_cpu_") and k != "a_cpu_s"
    )
    c = ", ".join(
        f"{k[6:-2]} {fmt_spread(r[k], 2)}" for k in r if k.startswith("c_cpu_") and k != "c_cpu_s"
    )
    return (
        f"CPU seconds, (a) {fmt_spread(r['a_cpu_s'], 2)} ({a}); (c) {fmt_spread(r['c_cpu_s'], 2)} "
        f"({c})."
    )


def _opt(r: dict, key: str, digits: int = 0) -> str:
    """A spread that only the two-pass flow measures; a dash without it."""
    return fmt_spread(r[key], digits) if key in r else "-"


LAST_TURNS_KEYS = "regen_last_"  # a `--turns last` run's keys: regen_last_<toy>_*


def last_turns(args, results: dict) -> str:
    """The words a `--turns last` run adds to its keys and section tag ("" for all turns):
    its figures sit beside the all-turns run's, never in their place."""
    return f"{','.join(results)} last turns" if args.turns == "last" else ""


def write_markdown(results: dict, codec: dict, args, load: float) -> None:
    fmt = fmt_spread
    counts = ",".join(f"{name}={r['conversations']}" for name, r in results.items())
    which = last_turns(args, results)
    lines = [
        f"# Regeneration benchmark (bench/regenerate.py{', ' + which if which else ''})",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores ({cpu_capability()}), load "
        f"average {load:.1f} at start. vLLM CPU, synthetic conversations ({counts}; seed {CORPUS_SEED}, "
        f"~30% multi-turn, `turns: {args.turns or 'all'}`), natural lengths, EOS honoured, greedy, the default "
        f"config (pipeline/demo/configs/toy.yaml); {args.rounds} alternating rounds; medians "
        "with [min-max] over rounds; engine starts excluded from rates.",
        "",
        "| target | samples | (a) plain tok/s | (b) two-pass tok/s | (c) run_regenerate tok/s "
        "| (c) captured tok/s | P1 = c/a | P2 = c/b | engine start a / b / c (s) "
        "| (c) peak captured MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['samples']} | {fmt(r['a_tok_s'])} | {_opt(r, 'b_tok_s')} | "
            f"{fmt(r['c_tok_s'])} | {fmt(r['c_captured_tok_s'])} | {fmt(r['P1'], 3)} | "
            f"{_opt(r, 'P2', 3)} | {r['a_engine_start_s']['median']:.0f} / "
            f"{_opt(r, 'b_engine_start_s')} / {r['c_engine_start_s']['median']:.0f} | "
            f"{r['c_peak_capture_mb']['median']:.0f} |"
        )
    for name, r in results.items():
        if "a_host_tok_s" in r:
            lines += [
                "",
                f"{name}: (a) with vLLM's engine core on the host CPU(s) "
                f"{fmt(r['a_host_tok_s'])} tok/s, on the model worker's "
                f"{fmt(r['a_workers_tok_s'])} tok/s ((c)'s is on the worker's); (a) is "
                f"the placement with the higher median ({r['a_placement'][0]}); with the "
                f"faster of the two in each round instead, P1 {fmt(r['P1_round_best'], 3)}.",
            ]
        if "a_admit_s" in r:
            lines += [
                "",
                f"{name}: the engine loop's seconds, (a) / (c): admitting "
                f"{fmt(r['a_admit_s'], 2)} / {fmt(r['c_admit_s'], 2)}, in engine steps "
                f"{fmt(r['a_step_s'], 2)} / {fmt(r['c_step_s'], 2)}, handling results "
                f"{fmt(r['a_handle_s'], 2)} / {fmt(r['c_handle_s'], 2)} ((c)'s steps include the "
                "capture in the step and taking its rows).",
            ]
        lines += ["", f"{name}: {cpu_line(r)}"]
    lines += [
        "",
        "bf16 codec at the 2.8T example's width (hidden 7168 x 6 states, 512 tokens): "
        f"{codec['encode_1t_MBps']:.0f} MB/s on one thread ({codec['encode_1t_MBps_per_cpu_s']:.0f} "
        f"MB per CPU second); {codec['encode_2t_MBps']:.0f} MB/s on two threads "
        f"({codec['encode_2t_MBps_per_cpu_s']:.0f} MB per CPU second).",
        "",
        "Per round:",
        "",
    ]
    for name, r in results.items():
        for i, rnd in enumerate(r["rounds"]):
            keep = {
                k: v
                for k, v in rnd.items()
                if (not k.endswith("tokens") or k.startswith("c_")) and k != "a_by_placement"
            }
            lines.append(f"* {name} round {i}: " + ", ".join(f"{k} {v}" for k, v in keep.items()))
        if "profile_c_percent" in r:
            lines += [
                "",
                f"Profile of (c) on {name}, an extra run after the rounds (py-spy, % of samples):",
                "",
            ]
            lines += [f"* {k}: {v}%" for k, v in r["profile_c_percent"].items()]
    write_section(f"bench/regenerate.py {which}".rstrip(), "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default="trained,large")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--conversations",
        default=f"trained=4000,large=1000,{REAL}=400",
        help="N, or per target: name=N,name=N (the trained toy's plain engine does 1,000 "
        "conversations in ~4 s, too short for a steady-state rate; the real target's "
        "400 (395 after de-duplication, ~65 generated tokens an answer) give each path "
        "~100 s of steady generation here)",
    )
    p.add_argument(
        "--no-two-pass",
        action="store_true",
        help="leave (b), the two-pass flow, out: (a) and (c) only, P1 without P2 (the real "
        "target's default: P2 is not asked there)",
    )
    p.add_argument("--turns", choices=("all", "last"), default=None, help="default: the config's")
    p.add_argument("--profile", action="store_true")
    p.add_argument(
        "--keep-profile", type=Path, default=None, help="copy the raw py-spy output here"
    )
    p.add_argument("--no-write", action="store_true", help="print only; leave results files alone")
    args = p.parse_args()
    targets = args.targets.split(",")
    from pipeline.logs import setup_logging

    setup_logging()
    load = os.getloadavg()[0]
    if bf16_native() is False:
        print(
            f"note: torch's CPU capability here is {cpu_capability()}: without AVX512-BF16/AMX "
            "bf16 arithmetic is emulated (~15x slower), every path is engine-bound, and the "
            "large toy takes hours; figures from this host are not comparable to those of "
            "a bf16-native one (docs/capture.md, Throughput)",
            flush=True,
        )
    # The codec's rate is the toys' record (the real target's section does not report it).
    codec = encode_rates() if set(targets) - {REAL} else {}
    print(json.dumps({"codec": codec}), flush=True)
    log: list[str] = []
    results: dict[str, dict] = {}
    for name in targets:
        results[name] = run_target(name, args, log)
        print(
            json.dumps({name: {k: v for k, v in results[name].items() if k != "rounds"}}),
            flush=True,
        )
        if not args.no_write:  # after each target, so a long run keeps what it measured
            record(results, codec, args, load)


def record(results: dict, codec: dict, args, load: float) -> None:
    """Each target's figures to its own keys and section: the toys' (`regen_*`, `P1`,
    `P2`, the section `bench/regenerate.py`) and the real target's (`real_regen_*`,
    `real_P1`, the section `bench/regenerate.py real`) never replace each other's."""
    toys = {name: r for name, r in results.items() if name != REAL}
    if toys:
        record_toys(toys, codec, args, load)
    if REAL in results:
        record_real(results[REAL], args, load)
    print("wrote bench/results.json and bench/RESULTS.md", flush=True)


REAL_KEYS = ("a_tok_s", "c_tok_s", "c_captured_tok_s", "P1", "a_s", "c_s")
REAL_STARTS = ("a_engine_start_s", "c_engine_start_s")


def record_real(r: dict, args, load: float) -> None:
    """The real target's keys (`real_regen_*`, `real_P1`) and its RESULTS.md section."""
    flat: dict = {
        "real_regen_bench_load_average": round(load, 2),
        "real_regen_cpu_capability": cpu_capability(),
        "real_regen_rounds": len(r["rounds"]),
        "real_regen_conversations": r["conversations"],
        "real_regen_samples": r["samples"],
        "real_regen_a_samples": r["a_samples"],
        "real_regen_generated_tokens": r["generated_tokens"],
        "real_regen_a_generated_tokens": r["a_generated_tokens"],
        "real_regen_prompt_tokens": r["prompt_tokens"],
        "real_regen_a_prompt_tokens": r["a_prompt_tokens"],
        "real_regen_two_pass": "b_tok_s" in r,
    }
    keys = REAL_KEYS + REAL_STARTS + tuple(k for k in ("b_tok_s", "P2") if k in r)
    for key in keys:
        flat[f"real_regen_{key}"] = round(r[key]["median"], 3)
        flat[f"real_regen_{key}_range"] = [round(r[key]["min"], 3), round(r[key]["max"], 3)]
    flat["real_P1"] = flat["real_regen_P1"]
    flat["real_P1_range"] = flat["real_regen_P1_range"]
    merge_results(flat, replace=("real_regen_", "real_P1"))
    write_real_markdown(r, args, load)


def write_real_markdown(r: dict, args, load: float) -> None:
    fmt = fmt_spread
    rounds = r["rounds"]
    lines = [
        "# Regeneration on the real target (bench/regenerate.py --targets real)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores ({cpu_capability()}), load "
        f"average {load:.1f} at start. SmolLM2-135M-Instruct (bf16, converted from the "
        "packaged GGUF), vLLM CPU, its default config (pipeline/demo/configs/"
        "real-smollm2.yaml: max_model_len 2048, up to 256 new tokens, `turns: last`) with "
        f"{r['conversations']} synthetic conversations of the held-out seed {CORPUS_SEED}; "
        "natural lengths, EOS honoured, greedy; (a) and (c) answer the same prompts. "
        f"{len(rounds)} "
        + ("alternating rounds" if len(rounds) > 1 else "round")
        + "; medians with [min-max] over rounds; engine "
        "starts excluded from rates"
        + ("." if "b_tok_s" in r else "; (b), the two-pass flow, left out (`--no-two-pass`)."),
        "",
        "| samples (a / c) | prompt tokens (a / c) | generated tokens (a / c) "
        "| (a) plain tok/s | (c) run_regenerate tok/s | (c) captured tok/s | **P1 = c/a** "
        "| steady s (a / c) | engine start a / c (s) |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {r['a_samples']} / {r['samples']} | {r['a_prompt_tokens']} / {r['prompt_tokens']} | "
        f"{r['a_generated_tokens']} / "
        f"{r['generated_tokens']} | {fmt(r['a_tok_s'])} | {fmt(r['c_tok_s'])} | "
        f"{fmt(r['c_captured_tok_s'])} | **{fmt(r['P1'], 3)}** | {r['a_s']['median']:.0f} / "
        f"{r['c_s']['median']:.0f} | {fmt(r['a_engine_start_s'])} / "
        f"{fmt(r['c_engine_start_s'])} |",
    ]
    if "b_tok_s" in r:
        lines += ["", f"(b) two-pass {fmt(r['b_tok_s'])} tok/s, P2 = c/b {fmt(r['P2'], 3)}."]
    if "a_host_tok_s" in r:
        lines += [
            "",
            f"(a) with vLLM's engine core on the host CPU(s) {fmt(r['a_host_tok_s'])} tok/s, "
            f"on the model worker's {fmt(r['a_workers_tok_s'])} tok/s ((c)'s is on the "
            f"worker's); (a) is the placement with the higher median ({r['a_placement'][0]}); "
            f"with the faster of the two in each round instead, P1 "
            f"{fmt(r['P1_round_best'], 3)}.",
        ]
    if "a_admit_s" in r:
        lines += [
            "",
            f"The engine loop's seconds, (a) / (c): admitting {fmt(r['a_admit_s'], 2)} / "
            f"{fmt(r['c_admit_s'], 2)}, in engine steps {fmt(r['a_step_s'], 2)} / "
            f"{fmt(r['c_step_s'], 2)}, handling results {fmt(r['a_handle_s'], 2)} / "
            f"{fmt(r['c_handle_s'], 2)} ((c)'s steps include the capture in the step and "
            "taking its rows).",
        ]
    lines += ["", cpu_line(r), "", "Per round:", ""]
    for i, rnd in enumerate(rounds):
        keep = {k: v for k, v in rnd.items() if not k.endswith("tokens") or k.startswith("c_")}
        lines.append(f"* round {i}: " + ", ".join(f"{k} {v}" for k, v in keep.items()))
    if "profile_c_percent" in r:
        lines += ["", "Profile of (c), an extra run after the rounds (py-spy, % of samples):", ""]
        lines += [f"* {k}: {v}%" for k, v in r["profile_c_percent"].items()]
    write_section("bench/regenerate.py real", "\n".join(lines))


def record_toys(results: dict, codec: dict, args, load: float) -> None:
    flat: dict = {
        "regen_bench_load_average": round(load, 2),
        "regen_cpu_capability": cpu_capability(),
    }
    flat.update({f"regen_codec_{k}": round(v, 1) for k, v in codec.items()})
    last = args.turns == "last"
    if last:  # the machine's figures stay those of the all-turns run they describe
        flat = {}
    prefixes = []
    for name, r in results.items():
        if last:  # one family for every toy's last-turn keys: regen_last_<toy>_*
            prefix = f"{LAST_TURNS_KEYS}{name}_"
        else:
            prefix = "regen_" if name == "large" else f"regen_{name}_"
        prefixes.append(prefix)
        keys = ("a_tok_s", "b_tok_s", "c_tok_s", "c_captured_tok_s", "P1", "P2")
        for key in (k for k in keys if k in r):  # (b)'s only with the two-pass flow
            flat[f"{prefix}{key}"] = round(r[key]["median"], 3)
            flat[f"{prefix}{key}_range"] = [round(r[key]["min"], 3), round(r[key]["max"], 3)]
        if name == "large" and not last:
            flat["P1"] = flat["regen_P1"]
            if "regen_P2" in flat:
                flat["P2"] = flat["regen_P2"]
    if last:  # a last-turns run replaces its own keys only
        merge_results(flat, replace=tuple(prefixes))
    else:
        # Replaces every earlier regen_/P1/P2 key (the single-batch benchmark's described
        # another workload) but the last-turns runs'; the real target's (real_regen_*,
        # real_P1) are not among them.
        merge_results(flat, replace=("regen_", "P1", "P2"), keep=(LAST_TURNS_KEYS,))
    write_markdown(results, codec, args, load)


if __name__ == "__main__":
    main()
