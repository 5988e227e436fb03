"""The project's measured figures the planner uses, read from bench/results.json at run time.

The benchmarks rewrite bench/results.json; the planner reads the keys below
each time it runs, and falls back to the value last measured (stated with its
date) when a key is missing, e.g. in an installed package without bench/.
Each figure says which key or fallback it came from.

* codec ratio: stored / raw bf16 bytes of whole shards (`bench/storage.py`):
  the trained toy's own activations for toy targets, else the synthetic
  activation stream (hidden 4096);
* encode MB/s per core: the bf16 codec at the 2.8T example's width (hidden
  7168 x 6 states, `bench/regenerate.py`), else on the synthetic stream;
* replica throughput: the shipped stage's steady generated tok/s on the CPU
  toys (`bench/regenerate.py`, path c), for those setups only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results.json"
MEASURED_ON = "2026-12-01"


@dataclass(frozen=True)
class Figure:
    value: float
    source: str


# (keys tried in order, fallback value)
CODEC_RATIO = {
    ("bf16", True): (("P3_toy_bf16",), 0.6738),
    ("fp8", True): (("P3_toy_fp8",), 0.4264),
    ("bf16", False): (("P3_bf16_shard", "P3_bf16"), 0.6805),
    ("fp8", False): (("P3_fp8_shard", "P3_fp8"), 0.4149),
}
ENCODE_MBPS = {
    "bf16": (
        ("regen_codec_encode_1t_MBps_per_cpu_s", "regen_codec_encode_1t_MBps", "P3_bf16_MBps"),
        378.2,
    ),
    "fp8": (("P3_fp8_encode_MBps",), 192.8),
}
# Known setups: (target model, backend) -> keys of the shipped stage's generated tok/s.
REPLICA_TOK_S = {
    ("toy:trained", "vllm"): (("regen_trained_c_tok_s", "regen_trained_capture_tok_s"), 673.7),
    ("toy:large", "vllm"): (("regen_c_tok_s", "regen_large_capture_tok_s"), 105.9),
}


def load_results(path: str | Path | None = None) -> dict:
    path = Path(path) if path else RESULTS
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _pick(results: dict, keys: tuple[str, ...], fallback: float, what: str) -> Figure:
    for key in keys:
        value = results.get(key)
        if isinstance(value, int | float) and value > 0:
            return Figure(float(value), f"bench/results.json {key}")
    return Figure(fallback, f"{what} measured {MEASURED_ON} (bench/results.json lacks {keys[0]})")


def codec_ratio(codec: str, toy: bool, results: dict) -> Figure:
    keys, fallback = CODEC_RATIO[(codec, toy)]
    return _pick(results, keys, fallback, f"{codec} shard ratio")


def encode_mbps_per_core(codec: str, results: dict) -> Figure:
    keys, fallback = ENCODE_MBPS[codec]
    return _pick(results, keys, fallback, f"{codec} encode MB/s per core")


def replica_tok_s(model: str, backend: str, results: dict) -> Figure | None:
    """The measured figure of a known setup, or None (the user gives one)."""
    known = REPLICA_TOK_S.get((model, backend))
    if known is None:
        return None
    keys, fallback = known
    return _pick(results, keys, fallback, f"{model} replica tok/s")
