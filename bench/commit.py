"""Commit benchmark: commit time and bytes written per commit as a dataset grows to 10,000 shards.

    .venv/bin/python bench/commit.py [--shards 10000] [--per-commit 4]

A regeneration commits `--per-commit` finished shards at a time. The shards
are synthetic (tiny files with 8 sample ids each, in buckets of a
10,000-bucket lineage as planning makes them), so what is measured is the
commit itself: the sample-level exactly-once check, sidecars, the delta
segment and its merges, the root, `_latest` and the dataset card, on local
disk, in one process (the sink's: it reads its parent version once and keeps
it). At 100, 1,000 and 10,000 shards the figures are the mean (and max) over
the 25 commits before that size, merges included; bytes count every object
the commit writes.

Results merge into bench/results.json (`commit_*`) and bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import merge_results, write_section  # noqa: E402  (bench/ is sys.path[0])

from pipeline.corpus.identity import partition_key  # noqa: E402
from pipeline.shards.schema import Provenance  # noqa: E402
from pipeline.shards.writer import ShardInfo, shard_key  # noqa: E402
from pipeline.storage import LocalStorage  # noqa: E402
from pipeline.table.dataset import Dataset  # noqa: E402

SAMPLES_PER_SHARD = 8
CHECKPOINTS = (100, 1_000, 10_000)
WINDOW = 25  # commits averaged before each checkpoint


class CountingStorage(LocalStorage):
    """Local storage that counts the objects and bytes every commit writes."""

    written = 0
    puts = 0

    def put_if_absent(self, key: str, data: bytes) -> None:
        CountingStorage.written += len(data)
        CountingStorage.puts += 1
        super().put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, tag: str | None) -> None:
        CountingStorage.written += len(data)
        CountingStorage.puts += 1
        super().put_if_match(key, data, tag)

    @contextlib.contextmanager
    def open_write(self, key: str):
        CountingStorage.puts += 1
        with super().open_write(key) as fh:
            yield _Counted(fh)


class _Counted:
    def __init__(self, fh) -> None:
        self._fh = fh

    def write(self, data: bytes) -> int:
        CountingStorage.written += len(data)
        return self._fh.write(data)


def provenance() -> Provenance:
    return Provenance(
        target_name="Qwen/Qwen3-8B",
        target_revision="sha256:bench",
        tokenizer_hash="sha256:bench",
        aux_layer_ids=(2, 10, 18, 26, 34),
        hidden_size=4096,
        codec="bf16",
        corpus_version="bench",
        code_version="bench",
        generation={"temperature": 0.0, "max_new_tokens": 2048},
    )


def synthetic_shards(storage: LocalStorage, num_shards: int) -> list[ShardInfo]:
    """Shards whose members sit in one narrow key range each, like planned units."""
    groups = sorted(
        (partition_key(f"{i:032x}-000"), f"{i:032x}") for i in range(num_shards * SAMPLES_PER_SHARD)
    )
    prov = provenance()
    infos = []
    for n in range(num_shards):
        members = groups[n * SAMPLES_PER_SHARD : (n + 1) * SAMPLES_PER_SHARD]
        path = shard_key(f"u{n:05d}-{hashlib.sha256(str(n).encode()).hexdigest()[:12]}", "0badcafe")
        body = f"synthetic shard {n}".encode()
        (storage.root / path).parent.mkdir(parents=True, exist_ok=True)
        (storage.root / path).write_bytes(body)
        samples = tuple((f"{g}-000", "chat", "bench", 1000) for _, g in members)
        infos.append(
            ShardInfo(
                path=path,
                unit_id=path.split("/")[1].split(".")[0],
                rows=SAMPLES_PER_SHARD,
                tokens=SAMPLES_PER_SHARD * 1000,
                bytes=len(body),
                sha256=hashlib.sha256(body).hexdigest(),
                codec="bf16",
                schema_version=1,
                provenance=prov,
                samples=samples,
            )
        )
    return infos


def run(num_shards: int, per_commit: int, where: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-commit-", dir=where) as tmp:
        storage = CountingStorage(Path(tmp) / "ds")
        infos = synthetic_shards(storage, num_shards)
        order = sorted(range(num_shards), key=lambda i: hashlib.sha256(str(i).encode()).digest())
        ds = Dataset(storage)
        seconds, cpu, nbytes, puts, sizes = [], [], [], [], []
        for start in range(0, num_shards, per_commit):
            batch = [infos[i] for i in order[start : start + per_commit]]
            CountingStorage.written = CountingStorage.puts = 0
            t0, c0 = time.perf_counter(), time.process_time()
            manifest = ds.commit(batch, num_buckets=num_shards)
            seconds.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            nbytes.append(CountingStorage.written)
            puts.append(CountingStorage.puts)
            sizes.append(len(manifest.entries))
        out: dict = {}
        for n in CHECKPOINTS:
            if n > num_shards:
                continue
            end = next(i for i, s in enumerate(sizes) if s >= n) + 1
            window = slice(max(0, end - WINDOW), end)
            out[n] = {
                "commit_ms_mean": 1e3 * statistics.mean(seconds[window]),
                "commit_ms_median": 1e3 * statistics.median(seconds[window]),
                "commit_ms_max": 1e3 * max(seconds[window]),
                "commit_cpu_ms_mean": 1e3 * statistics.mean(cpu[window]),
                "objects_written_mean": statistics.mean(puts[window]),
                "bytes_mean": statistics.mean(nbytes[window]),
                "bytes_max": max(nbytes[window]),
                "segments_in_root": len(ds.manifest(end).segments),
            }
        assert len(ds.manifest().entries) == num_shards
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--per-commit", type=int, default=4)
    parser.add_argument(
        "--dir",
        default="/dev/shm" if Path("/dev/shm").is_dir() else None,
        help="where the dataset goes (default /dev/shm: tmpfs, so a shared disk's fsync "
        "latency does not drown the commit's own cost; pass a disk path to include it)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    figures = run(args.shards, args.per_commit, args.dir)
    first, last = figures[min(figures)], figures[max(figures)]
    ratio_ms = last["commit_ms_mean"] / first["commit_ms_mean"]
    ratio_bytes = last["bytes_mean"] / first["bytes_mean"]
    lines = [
        "## Commit cost as the dataset grows (bench/commit.py)",
        "",
        f"{args.per_commit} synthetic shards per commit ({SAMPLES_PER_SHARD} samples each), "
        f"dataset in {args.dir or 'a temp dir'}, one process; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared). "
        f"Mean (max) over the {WINDOW} commits before each size, segment merges included.",
        "",
        "| shards | commit ms: mean (max) | CPU ms | objects written | bytes written per commit: "
        "mean (max) | segments in root |",
        "|---|---|---|---|---|---|",
    ]
    for n, f in sorted(figures.items()):
        lines.append(
            f"| {n:,} | {f['commit_ms_mean']:.1f} ({f['commit_ms_max']:.1f}) | "
            f"{f['commit_cpu_ms_mean']:.1f} | {f['objects_written_mean']:.1f} | "
            f"{f['bytes_mean']:,.0f} ({f['bytes_max']:,}) | {f['segments_in_root']} |"
        )
    lines += [
        "",
        f"From {min(figures):,} to {max(figures):,} shards: commit time x{ratio_ms:.2f}, bytes per "
        f"commit x{ratio_bytes:.2f} (flat within 2x: {ratio_ms < 2 and ratio_bytes < 2}). "
        f"Run took {time.monotonic() - started:.0f} s.",
    ]
    text = "\n".join(lines)
    print(text)
    merge_results(
        {
            "commit_per_size": {str(k): v for k, v in figures.items()},
            "commit_time_ratio": round(ratio_ms, 3),
            "commit_bytes_ratio": round(ratio_bytes, 3),
        }
    )
    write_section("commit", text)


if __name__ == "__main__":
    main()
