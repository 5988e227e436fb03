"""Serve an exported draft with vLLM as a speculative decoder and read its counters.

`speculative_check` decodes the same prompts twice at temperature 0, without
and with the draft, each in a fresh engine (a separate process: vLLM holds
its engine and RAM until the process ends), with the same prompts submitted
together so batching is the same (bf16 batch variance, docs/design.md#serving-drafts-in-vllm). It
returns both outputs and vLLM's acceptance counters, read before and after
generation (they are cumulative) from `LLM.get_metrics()`.

Run as a module it is the child process: JSON request on stdin, JSON result
written to the path given as its argument.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.drafts.adaptive import adaptive_requests, adaptive_schedule
from pipeline.drafts.registry import served_method, vllm_env
from pipeline.drafts.vllm_plugin import ROUND_TIMES_ENV
from pipeline.targets.engine_env import launch_env

_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass
class DecodeRun:
    outputs: list[list[int]]  # generated token ids per prompt
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    seconds: float = 0.0
    request_ids: list[str] = field(default_factory=list)  # vLLM's, in prompt order
    round_ms: list[float] = field(default_factory=list)  # each drafting round (round_times)
    rounds_skipped: int = 0  # of those, rounds adaptive drafting skipped the drafter in

    @property
    def tau(self) -> float:
        """Mean tokens per verification round: 1 + accepted / drafts."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")


@dataclass
class SpecCheck:
    plain: DecodeRun
    speculative: DecodeRun

    @property
    def identical(self) -> bool:
        return self.plain.outputs == self.speculative.outputs

    def summary(self) -> dict:
        s = self.speculative
        return {
            "identical_to_plain": self.identical,
            "num_drafts": s.num_drafts,
            "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted_tokens,
            "accepted_per_pos": s.accepted_per_pos,
            "tau": round(s.tau, 3),
            "generated_tokens": sum(len(o) for o in s.outputs),
        }


def export_method(draft_dir: str | Path) -> str:
    """The vLLM speculative method that serves the export in `draft_dir` (its format's)."""
    config = json.loads((Path(draft_dir) / "config.json").read_text())
    return served_method(config, str(draft_dir))


def export_tokens(draft_dir: str | Path) -> int:
    """The tokens a round drafts, as the export's config.json says."""
    config = json.loads((Path(draft_dir) / "config.json").read_text())
    return config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]


def decode(
    target_dir: str | Path,
    prompts: list[list[int]],
    *,
    max_tokens: int,
    draft_dir: str | Path | None = None,
    method: str | None = None,
    num_speculative_tokens: int | None = None,
    dtype: str = "float32",
    max_model_len: int = 1024,
    gpu_memory_utilization: float = 0.2,
    timeout_s: float = 600,
    single_stream: bool = False,
    round_times: bool = False,
) -> DecodeRun:
    """One engine in a child process; greedy decoding of `prompts` (with the draft in
    `draft_dir`, served as `method` drafting `num_speculative_tokens`; None: its
    export's), all submitted together or, `single_stream`, one after another;
    `round_times` records the wall time of every drafting round (the plugin's
    ROUND_TIMES_ENV)."""
    if draft_dir and method is None:
        method = export_method(draft_dir)
    if draft_dir and num_speculative_tokens is None:
        num_speculative_tokens = export_tokens(draft_dir)
    saturation = adaptive_requests() if draft_dir else None
    request = {
        "target_dir": str(target_dir),
        "prompts": prompts,
        "max_tokens": max_tokens,
        "draft_dir": str(draft_dir) if draft_dir else None,
        "method": method,
        "num_speculative_tokens": num_speculative_tokens,
        "dtype": dtype,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "single_stream": single_stream,
        # The plugin's adaptive drafting (ADAPTIVE_ENV) with vLLM's schedule for it.
        "schedule": (
            None if saturation is None else adaptive_schedule(saturation, num_speculative_tokens)
        ),
    }
    env = launch_env()
    if draft_dir:
        env.update(vllm_env(method))
    with tempfile.TemporaryDirectory(prefix="vllm-check-") as tmp:
        out = Path(tmp) / "result.json"
        times = Path(tmp) / "round_times.jsonl"
        if round_times:
            env[ROUND_TIMES_ENV] = str(times)
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.drafts.vllm_check", str(out)],
            input=json.dumps(request),
            text=True,
            capture_output=True,
            timeout=timeout_s,
            env=env,
        )
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise RuntimeError(
                f"vLLM {'with draft ' + str(draft_dir) if draft_dir else 'plain'} decoding failed "
                f"(exit {proc.returncode}):\n{tail}"
            )
        run = DecodeRun(**json.loads(out.read_text()))
        if times.exists():
            rounds = [json.loads(line) for line in times.read_text().splitlines()]
            run.round_ms = [r["ms"] for r in rounds]
            run.rounds_skipped = sum(r["skipped"] for r in rounds)
        return run


def speculative_check(
    target_dir: str | Path,
    draft_dir: str | Path,
    prompts: list[list[int]],
    *,
    max_tokens: int = 64,
    method: str | None = None,
    num_speculative_tokens: int | None = None,
    **engine: object,
) -> SpecCheck:
    """Plain vs speculative greedy decoding of the same prompts (see module docstring)."""
    method = method or export_method(draft_dir)
    n = num_speculative_tokens or export_tokens(draft_dir)
    plain = decode(target_dir, prompts, max_tokens=max_tokens, **engine)
    spec = decode(
        target_dir,
        prompts,
        max_tokens=max_tokens,
        draft_dir=draft_dir,
        method=method,
        num_speculative_tokens=n,
        **engine,
    )
    return SpecCheck(plain, spec)


def _counters(llm) -> dict:
    values: dict = {name: 0 for name in _COUNTERS.values()}
    values["accepted_per_pos"] = []
    for metric in llm.get_metrics():
        if metric.name in _COUNTERS:
            values[_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == _PER_POS:
            values["accepted_per_pos"] = [int(v) for v in metric.values]
    return values


def _child(out_path: str) -> None:
    import time

    from vllm import LLM, SamplingParams

    req = json.loads(sys.stdin.read())
    kwargs = dict(
        model=req["target_dir"],
        dtype=req["dtype"],
        max_model_len=req["max_model_len"],
        gpu_memory_utilization=req["gpu_memory_utilization"],
        disable_log_stats=False,
        enforce_eager=True,
        seed=0,
    )
    if req["draft_dir"]:
        kwargs["speculative_config"] = {
            "model": req["draft_dir"],
            "method": req["method"],
            "num_speculative_tokens": req["num_speculative_tokens"],
        }
        if req.get("schedule"):
            kwargs["speculative_config"]["num_speculative_tokens_per_batch_size"] = req["schedule"]
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"])
    before = _counters(llm)
    started = time.perf_counter()
    prompts = [{"prompt_token_ids": p} for p in req["prompts"]]
    if req.get("single_stream"):
        results = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    else:
        results = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    after = _counters(llm)
    per_pos_before = before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"])
    out = {
        "outputs": [list(r.outputs[0].token_ids) for r in results],
        "request_ids": [r.request_id for r in results],
        **{k: after[k] - before[k] for k in _COUNTERS.values()},
        "accepted_per_pos": [
            a - b for a, b in zip(after["accepted_per_pos"], per_pos_before, strict=True)
        ],
        "seconds": seconds,
    }
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    _child(sys.argv[1])
