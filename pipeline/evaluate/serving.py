"""Serving speed with and without each draft: what a user buys (the `serving:` section).

`run_serving` serves the target in vLLM without a draft and with each exported
draft, each as vLLM's own OpenAI-compatible server in a child process, and
drives it with vLLM's own benchmark client, `vllm.benchmarks.serve.benchmark`:
streamed completions whose chunk arrival times give time to first token and
inter-token latency, `max_concurrency` requests in flight on one engine, and
the server's speculative-decoding counters read from `/metrics` before and
after each run (they are cumulative). Every engine is started
`server_starts` times, the engines alternated (start i serves them in an
order rotated by i), so a drift of the host falls on every engine alike.
Per engine:

* single stream (one request at a time), on every start: each request's
  tokens and latency, averaged over the starts prompt by prompt; the
  headline is end to end, first token included (total tokens over total
  time), with each start's figure beside it; the decode-only rate per user,
  TTFT, ITL and TPOT percentiles are labelled as such;
* a concurrency sweep on the first start: aggregate output tokens/s against
  tokens/s per user;
* vLLM's acceptance counters, summed over the starts: tau (1 + accepted /
  rounds) and the share of rounds that accepted position k;
* T=0 identity on every served prompt, one request at a time: each draft's
  greedy outputs against the plain engine's first start, and the plain
  engine's second start against its first (the control: what the engine
  varies by itself), with the target's fp32 logit gap at each divergence
  (pipeline/evaluate/identity.py).

Speedups over the target alone (pipeline/evaluate/speedups.py): end to end
with a paired bootstrap interval over the prompts; aggregate throughput at
equal requests in flight, and at equal tokens/s per user only where both
curves span it. docs/evaluate.md says how to read them and why this tooling.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.drafts.registry import served_method, serving_kind
from pipeline.drafts.vllm_check import export_tokens
from pipeline.evaluate.server import BASELINE, Engine, VllmServer
from pipeline.evaluate.serving_measure import greedy_outputs, measure
from pipeline.evaluate.speedups import add_speedups
from pipeline.logs import kv
from pipeline.targets.resolve import eos_token_ids

if TYPE_CHECKING:
    from pipeline.evaluate.config import ServingConfig

log = logging.getLogger(__name__)


def engines_for(config: ServingConfig, exports: dict[str, Path | None]) -> list[Engine | dict]:
    """The baseline then one Engine per served draft; a draft this host cannot serve is a
    dict {"name", "reason"} instead (vLLM's dspark method needs a GPU)."""
    import torch

    served = config.drafts or [
        {"name": n, "method": None, "num_speculative_tokens": None}
        for n, d in exports.items()
        if d is not None
    ]
    out: list[Engine | dict] = [Engine(BASELINE)]
    for entry in served:
        entry = entry if isinstance(entry, dict) else entry.model_dump()
        name = entry["name"]
        draft_dir = exports.get(name)
        if draft_dir is None:
            raise ValueError(f"serving.drafts: {name!r} has no export directory to serve")
        exported = json.loads((Path(draft_dir) / "config.json").read_text())
        served = served_method(exported, str(draft_dir))
        method = entry["method"] or served
        if method != served:
            raise ValueError(
                f"serving.drafts: method {method!r} cannot serve {draft_dir}, a "
                f"{exported['speculators_model_type']} export: leave its method unset"
            )
        needs_gpu = serving_kind(method).vllm_needs_gpu
        if needs_gpu and not torch.cuda.is_available():
            out.append({"name": name, "reason": needs_gpu})
            continue
        n = entry["num_speculative_tokens"] or export_tokens(draft_dir)
        out.append(Engine(name, Path(draft_dir), method, n))
    return out


# -------------------------------------------------------------------- measurement


# ------------------------------------------------------------------------- the run


def run_serving(
    config: ServingConfig,
    *,
    target_dir: str,
    exports: dict[str, Path | None],
    prompts: list[list[int]],
    out_dir: Path,
    offline_tau: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Serve and measure (module docstring); returns the report's `serving` section.

    `exports`: draft name -> speculators export directory (None: not exported);
    `prompts`: held-out prompt token ids; `offline_tau`: the offline T=0 tau of a
    draft on the same prompts, set beside vLLM's. Server logs go to `out_dir/serving/`.
    Every engine is started `config.server_starts` times, the engines alternated.
    Raises `IdentityMismatch` (section attached as `.section`) when a draft changed the
    target's greedy output beyond a near-tie flip.
    """
    from pipeline.evaluate.identity import IdentityMismatch

    if not prompts:
        raise ValueError("serving: no held-out prompts to serve")
    section = _section(config, target_dir, prompts)
    identity = _Identity(config, target_dir, prompts)
    engines = []
    for engine in engines_for(config, exports):
        if isinstance(engine, dict):
            section["engines"][engine["name"]] = {"served": False, "reason": engine["reason"]}
        else:
            engines.append(engine)
    starts: dict[str, list[dict]] = {e.name: [] for e in engines}
    for start in range(config.server_starts):
        shift = start % len(engines)
        for engine in engines[shift:] + engines[:shift]:
            starts[engine.name].append(
                _serve_once(engine, config, target_dir, prompts, identity, out_dir, start)
            )
    for engine in engines:  # the plain engine first: the drafts' identity compares with it
        entry = _combine(engine, starts[engine.name], config)
        if engine.draft_dir is not None:
            entry["acceptance"] = {
                **(entry["single_stream"].get("acceptance") or {}),
                "offline_tau": (offline_tau or {}).get(engine.name),
            }
        identity.check(engine, entry, [r["outputs"] for r in starts[engine.name]])
        section["engines"][engine.name] = entry
    add_speedups(section)
    if identity.failures:
        error = IdentityMismatch("\n".join(identity.failures))
        error.section = section  # type: ignore[attr-defined]
        raise error
    return section


def _section(config: ServingConfig, target_dir: str, prompts: list) -> dict[str, Any]:
    """The section's header: what was served, how; engines are added as they run."""
    return {
        "target": str(target_dir),
        "num_prompts": len(prompts),
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "ignore_eos": config.ignore_eos,
        "dtype": config.dtype,
        "concurrency": sorted(config.concurrency),
        "server_starts": config.server_starts,
        "tooling": "vllm.entrypoints.openai.api_server + vllm.benchmarks.serve.benchmark",
        "engines": {},
    }


def _serve_once(
    engine: Engine,
    config: ServingConfig,
    target_dir: str,
    prompts: list[list[int]],
    identity: _Identity,
    out_dir: Path,
    start: int,
) -> dict[str, Any]:
    """One start of one engine: its single stream (every start), its sweep (the first
    start) and its greedy outputs (the first start; the plain engine's second too)."""
    levels = sorted(c for c in config.concurrency if c != 1) if start == 0 else []
    log.info("serving %s", kv(engine=engine.name, start=start, method=engine.method or "none"))
    name = engine.name.replace(" ", "_").replace("/", "_")
    log_path = out_dir / "serving" / f"{name}-start{start}.log"
    with VllmServer(str(target_dir), engine, config, log_path) as server:
        single = measure(server.base_url, prompts, 1, config)
        curve = [measure(server.base_url, prompts, c, config) for c in levels]
        wanted = start == 0 or (start == 1 and engine.draft_dir is None)
        outputs = identity.outputs(server.base_url) if wanted else None
    log.info(
        "served %s",
        kv(engine=engine.name, start=start, e2e_tok_s=single["e2e_tok_s"]),
    )
    return {
        "single": single,
        "curve": curve,
        "outputs": outputs,
        "start_s": round(server.start_seconds, 1),
    }


def _combine(engine: Engine, starts: list[dict], config: ServingConfig) -> dict[str, Any]:
    """An engine's entry from its starts: the single stream's per-request tokens and
    latencies averaged over the starts prompt by prompt (what the paired intervals
    resample), each start's end-to-end rate beside, the first start's sweep."""
    import numpy as np

    singles = [r["single"] for r in starts]
    single = dict(singles[0])
    tokens = np.mean([s["per_request"]["output_tokens"] for s in singles], axis=0)
    latency = np.mean([s["per_request"]["latency_s"] for s in singles], axis=0)
    single["per_request"] = {
        "output_tokens": [round(float(x), 3) for x in tokens],
        "latency_s": [round(float(x), 5) for x in latency],
    }
    single["e2e_tok_s"] = round(float(tokens.sum() / latency.sum()), 3)
    single["e2e_tok_s_per_start"] = [s["e2e_tok_s"] for s in singles]
    rates = [s["per_user_tok_s"] for s in singles if s["per_user_tok_s"]]
    single["per_user_tok_s"] = round(sum(rates) / len(rates), 3) if rates else None
    if singles[0].get("acceptance"):
        single["acceptance"] = _pooled_acceptance([s["acceptance"] for s in singles])
    curve = ([singles[0]] if 1 in config.concurrency else []) + starts[0]["curve"]
    return {
        "served": True,
        "method": engine.method,
        "draft_dir": str(engine.draft_dir) if engine.draft_dir else None,
        "num_speculative_tokens": engine.num_speculative_tokens,
        "engine_start_s": [r["start_s"] for r in starts],
        "single_stream": single,
        "curve": curve,
    }


def _pooled_acceptance(rows: list[dict]) -> dict[str, Any]:
    """vLLM's acceptance counters of several starts, summed."""
    rounds = sum(r["num_rounds"] for r in rows)
    accepted = sum(r["num_accepted_tokens"] for r in rows)
    k = max(len(r["position_rate"]) for r in rows)
    rate = [
        sum(r["position_rate"][i] * r["num_rounds"] for r in rows if i < len(r["position_rate"]))
        / rounds
        if rounds
        else 0.0
        for i in range(k)
    ]
    return {
        "tau": round(1 + accepted / rounds, 4) if rounds else None,
        "num_rounds": rounds,
        "num_draft_tokens": sum(r["num_draft_tokens"] for r in rows),
        "num_accepted_tokens": accepted,
        "position_rate": [round(x, 4) for x in rate],
    }


class _Identity:
    """The T=0 identity check: each draft's greedy outputs against the plain engine's."""

    def __init__(self, config: ServingConfig, target_dir: str, prompts: list[list[int]]):
        from pipeline.evaluate.identity import TargetLogits

        self.config, self.target_dir = config, target_dir
        self.prompts = prompts[: config.identity.num_prompts or len(prompts)]
        self.logits = TargetLogits(target_dir)
        self.plain: list[list[int]] | None = None
        self.failures: list[str] = []

    def outputs(self, base_url: str) -> list[list[int]] | None:
        if not self.config.identity.enabled:
            return None
        return greedy_outputs(
            base_url, self.prompts, self.config.max_tokens, self.config.ignore_eos
        )

    def check(self, engine: Engine, entry: dict, outputs: list[list[list[int]] | None]) -> None:
        """The plain engine's first start kept, its second compared with it (the control:
        what the engine itself varies); a draft's first start compared with it."""
        plain = self.plain
        if engine.draft_dir is None:
            self.plain = outputs[0]
            if len(outputs) > 1 and outputs[0] is not None and outputs[1] is not None:
                entry["identity_control"] = self._report(outputs[0], outputs[1]).to_dict()
            return
        if outputs[0] is None or plain is None:
            return
        report = self._report(plain, outputs[0])
        entry["identity"] = report.to_dict()
        if not report.ok:
            self.failures.append(report.message(engine.name))

    def _report(self, plain: list[list[int]], other: list[list[int]]):
        from pipeline.evaluate.identity import check_identity

        return check_identity(
            prompts=self.prompts,
            plain=plain,
            drafted=other,
            logits=self.logits,
            tolerance=self.config.identity.near_tie_tolerance,
            eos_token_ids=eos_token_ids(self.target_dir),
        )
