"""One measurement of a served engine through vLLM's own benchmark client.

`measure` drives an OpenAI-compatible vLLM server with
`vllm.benchmarks.serve.benchmark` (`concurrency` requests in flight, streamed
completions) and `summarize_level` turns its result into one point of the
throughput-vs-interactivity curve: end-to-end and decode-only rates, TTFT, TPOT
and ITL percentiles, per-request tokens and latencies at one request in flight,
and vLLM's acceptance counters. `greedy_outputs` decodes prompts one at a time at
T=0 for the identity check. pipeline/evaluate/serving.py runs the engines.
"""

from __future__ import annotations

import json
import urllib.request
from typing import TYPE_CHECKING, Any

from pipeline.evaluate.server import SERVED_NAME

if TYPE_CHECKING:
    from pipeline.evaluate.config import ServingConfig

_PERCENTILES = (50, 90, 99)


def _percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    import numpy as np

    if not values:
        return {f"p{p}": None for p in _PERCENTILES}
    return {f"p{p}": round(float(np.percentile(values, p)) * scale, 3) for p in _PERCENTILES}


def summarize_level(result: dict, concurrency: int) -> dict[str, Any]:
    """One point of the curve from `vllm.benchmarks.serve.benchmark`'s result."""
    rates, tpots = [], []
    for out, lat, ttft in zip(
        result["output_lens"], result["latencies"], result["ttfts"], strict=True
    ):
        if out > 1 and lat > ttft:
            tpots.append((lat - ttft) / (out - 1))
            rates.append((out - 1) / (lat - ttft))
    itls = [x for request in result["itls"] for x in request]
    lats = [float(x) for x in result["latencies"]]
    level: dict[str, Any] = {
        "concurrency": concurrency,
        "num_requests": result["completed"],
        "seconds": round(result["duration"], 3),
        "output_tokens": result["total_output_tokens"],
        "aggregate_tok_s": round(result["output_throughput"], 3),
        # Decode rate each user sees (tokens after the first over the time after it).
        "per_user_tok_s": round(sum(rates) / len(rates), 3) if rates else None,
        # End to end, first token included: output tokens over request time, summed over
        # requests (at one request in flight: total tokens over total time).
        "e2e_tok_s": round(sum(result["output_lens"]) / sum(lats), 3) if sum(lats) else None,
        "ttft_ms": _percentiles(result["ttfts"]),
        "tpot_ms": _percentiles(tpots),
        # vLLM's ITL: the gaps between streamed chunks; with a draft a chunk carries every
        # token a verification round accepted, so TPOT is the per-token figure.
        "itl_ms": _percentiles(itls),
    }
    if concurrency == 1:  # per request, in prompt order: what paired intervals resample
        level["per_request"] = {
            "output_tokens": list(result["output_lens"]),
            "latency_s": [round(x, 5) for x in lats],
        }
    if "spec_decode_num_drafts" in result:
        rounds = result["spec_decode_num_drafts"]
        level["acceptance"] = {
            "tau": round(result["spec_decode_acceptance_length"], 4) if rounds else None,
            "num_rounds": rounds,
            "num_draft_tokens": result["spec_decode_draft_tokens"],
            "num_accepted_tokens": result["spec_decode_accepted_tokens"],
            # Share of rounds whose drafted position k was accepted.
            "position_rate": [
                round(r, 4) for r in result.get("spec_decode_per_position_acceptance_rates", [])
            ],
        }
    return level


def measure(
    base_url: str, prompts: list[list[int]], concurrency: int, config: ServingConfig
) -> dict[str, Any]:
    """`max(len(prompts), requests_per_slot * concurrency)` requests (prompts cycled),
    `concurrency` in flight, through vLLM's benchmark client."""
    import asyncio
    import contextlib
    import io

    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.serve import TaskType, benchmark

    num = max(len(prompts), config.requests_per_slot * concurrency)
    requests = [
        SampleRequest(
            prompt=prompts[i % len(prompts)],
            prompt_len=len(prompts[i % len(prompts)]),
            expected_output_len=config.max_tokens,
        )
        for i in range(num)
    ]
    with contextlib.redirect_stdout(io.StringIO()):  # its printed summary: we keep the dict
        result = asyncio.run(
            benchmark(
                task_type=TaskType.GENERATION,
                endpoint_type="openai",
                api_url=base_url + "/v1/completions",
                base_url=base_url,
                model_id=SERVED_NAME,
                model_name=SERVED_NAME,
                tokenizer=None,  # output lengths come from the server's usage records
                input_requests=requests,
                logprobs=None,
                request_rate=float("inf"),
                burstiness=1.0,
                disable_tqdm=True,
                num_warmups=config.num_warmups,
                profile=False,
                selected_percentile_metrics=["ttft", "tpot", "itl"],
                selected_percentiles=list(_PERCENTILES),
                ignore_eos=config.ignore_eos,
                goodput_config_dict={},
                max_concurrency=concurrency,
                lora_modules=None,
                extra_headers=None,
                extra_body={"temperature": config.temperature},
                ready_check_timeout_sec=0,
            )
        )
    errors = [e for e in result["errors"] if e]
    if errors or result["failed"]:
        raise RuntimeError(
            f"{result['failed']} of {num} requests failed at concurrency {concurrency}: "
            f"{errors[:3]}"
        )
    return summarize_level(result, concurrency)


def greedy_outputs(
    base_url: str, prompts: list[list[int]], max_tokens: int, ignore_eos: bool
) -> list[list[int]]:
    """Generated token ids at T=0, one request at a time (no batching on either side)."""
    outputs = []
    for prompt in prompts:
        body = {
            "model": SERVED_NAME,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
            "return_token_ids": True,
        }
        request = urllib.request.Request(
            base_url + "/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as r:
            outputs.append(list(json.loads(r.read())["choices"][0]["token_ids"]))
    return outputs
