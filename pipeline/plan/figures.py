"""The planner's default figures: what the project measured, and GPUs' published specs.

The planner never reads bench/ at run time: each default below is a constant
that names the benchmark that measured it, its key in bench/results.json and
the date. A user's own figure (`--assume`, `--inputs`, `--replica-tok-s`)
replaces it; `tests/plan/test_capacity.py` checks that the defaults still
agree with bench/results.json when a benchmark is rerun.

* codec ratio: stored / raw bf16 bytes of whole shards (`bench/storage.py`):
  the trained toy's own activations for toy targets, else the synthetic
  activation stream (hidden 4096);
* encode MB/s per core: the codec on one core at the 2.8T example's width
  (hidden 7168 x 6 states, `bench/regenerate.py`) for bf16, on the synthetic
  stream for fp8 (`bench/storage.py`);
* replica throughput: the shipped stage's steady generated tok/s on the CPU
  toys (`bench/regenerate.py`, path c), for those setups only;
* GPUs: memory and dense BF16 TFLOPS per GPU from NVIDIA's datasheets.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """A number the plan uses and where it came from; `assumed`: a choice, not a measurement."""

    value: float
    source: str
    assumed: bool = False


@dataclass(frozen=True)
class Measured:
    """A default figure and the measurement behind it."""

    value: float
    bench: str  # the benchmark that measured it
    key: str  # its key in bench/results.json
    date: str

    def figure(self) -> Figure:
        return Figure(self.value, f"measured by {self.bench}, {self.date}: {self.key}")


CODEC_RATIO = {
    ("bf16", True): Measured(0.6738, "bench/storage.py", "P3_toy_bf16", "2026-11-30"),
    ("fp8", True): Measured(0.4264, "bench/storage.py", "P3_toy_fp8", "2026-11-30"),
    ("bf16", False): Measured(0.6805, "bench/storage.py", "P3_bf16_shard", "2026-11-30"),
    ("fp8", False): Measured(0.4149, "bench/storage.py", "P3_fp8_shard", "2026-11-30"),
}
ENCODE_MBPS = {
    "bf16": Measured(
        504.2, "bench/regenerate.py", "regen_codec_encode_1t_MBps_per_cpu_s", "2026-12-04"
    ),
    "fp8": Measured(192.8, "bench/storage.py", "P3_fp8_encode_MBps", "2026-11-30"),
}
# Known setups: (target model, backend) -> the shipped stage's generated tok/s.
REPLICA_TOK_S = {
    ("toy:trained", "vllm"): Measured(
        6723.2, "bench/regenerate.py", "regen_trained_c_tok_s", "2026-12-04"
    ),
    ("toy:large", "vllm"): Measured(1007.8, "bench/regenerate.py", "regen_c_tok_s", "2026-12-04"),
}


@dataclass(frozen=True)
class GPU:
    memory_gb: float  # HBM per GPU
    bf16_tflops: float  # dense (without sparsity)


# NVIDIA datasheets, per GPU.
GPUS = {
    "H100": GPU(80, 989),  # H100 SXM
    "H200": GPU(141, 989),  # H200 SXM
    "B200": GPU(180, 2250),  # HGX B200
    "GB200": GPU(186, 2500),  # GB200 NVL72: 13.4 TB HBM3e over 72 GPUs
    "GB300": GPU(288, 2500),  # GB300 NVL72 (Blackwell Ultra): 288 GB HBM3e
}
# What a plan's training estimate assumes when neither a GPU nor its TFLOPS is given.
DEFAULT_TRAIN_GPU = "H100"


def gpu(name: str, where: str) -> GPU:
    """The spec of a GPU named in the inputs; an unknown name is an error naming the known ones."""
    spec = GPUS.get(name.upper())
    if spec is None:
        from pipeline.config import ConfigError

        raise ConfigError(
            f"{where}: unknown GPU {name!r} (known: {', '.join(GPUS)}); give its memory and "
            "TFLOPS instead (gpu_memory_gb, train_gpu_tflops)"
        )
    return spec


def codec_ratio(codec: str, toy: bool) -> Figure:
    return CODEC_RATIO[(codec, toy)].figure()


def encode_mbps_per_core(codec: str) -> Figure:
    return ENCODE_MBPS[codec].figure()


def replica_tok_s(model: str, backend: str) -> Figure | None:
    """The measured figure of a known setup, or None (the user gives one)."""
    known = REPLICA_TOK_S.get((model, backend))
    return None if known is None else known.figure()


# Where a measured figure comes from, for each assumption the plan can take.
HOW_TO_MEASURE = {
    "replica_tok_s": "run `regenerate` on one replica of this setup: its summary prints the "
    "steady generated tok/s (bench/regenerate.py does so on the toys)",
    "codec_ratio": "`inspect` a dataset committed from this target (bytes per token), or "
    "bench/storage.py on its activations",
    "encode_mbps_per_core": "bench/regenerate.py's codec figures on the replica's host CPUs",
    "weight_bytes_per_param": "the checkpoint's dtype (its safetensors headers)",
    "gpu_memory_gb": "the GPU's datasheet (or name the GPU: assume gpu=GB300)",
    "train_gpu_tflops": "name the training GPU (--assume train_gpu=GB300), or its datasheet's "
    "dense BF16 TFLOPS",
    "train_mfu": "a short training run on the training GPUs: tokens/s x FLOPs per token / peak",
    "train_epochs": "the training config (num_steps x global batch / samples)",
}
