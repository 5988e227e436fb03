"""What reading a subset of the captured layers costs: one frame per sample (schema v1)
against a column per layer (what a schema v2 would store), beside a training step.

    .venv/bin/python bench/layer_subset.py [--uri runs/real/dataset] [--layers 2,15,27]
        [--num-samples 160] [--rounds 3] [--step-s 3.7 | --measure-steps 4]

Schema v1 stores a sample's captured layers as one (T, k*H) frame: a draft
that reads 3 of 6 layers still reads and decodes all 6, then keeps its columns
(table/split.py `select_layers`). A column per layer would read and decode
only the 3. Both are timed here on the same samples, single-threaded, the
files in the page cache (a local disk; an object store adds the bytes'
transfer time, which scales the same way):

* v1: the shard's `hidden_states` column read (page checksums verified, as the
  reader does), every frame decoded, the draft's columns selected;
* v2 (emulated): the same frames cut into one bf16-codec frame per layer,
  written to a variant Parquet file beside the bench (one binary column per
  layer, same row groups, the writer's options), then only the draft's
  columns read and decoded; and all k columns, for the cost of more frames.

`last_hidden_state` (needed by every draft) and the small columns are the same
in both layouts and left out. The figure that decides: the seconds v2 would
save per training step (batch `--batch` samples) against the step's time, a
measured one (`--measure-steps N`: a 1-layer DSpark at batch 8 on a copy of the
dataset, the steps after the first) or `--step-s` (default 3.7 s, the real
target's 1-layer DSpark at batch 8 x 32 anchors on this kind of machine).
Decoding runs in the trainer's prefetch thread, so on a host with a core to
spare it overlaps the step entirely; the ratio is what it costs when it does not.

Results merge into bench/results.json (`real_subset_*`) and bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import merge_results, write_section  # noqa: E402  (bench/ is sys.path[0])

# Where --step-s's default comes from.
STEP_GIVEN = (
    "given: a 1-layer DSpark at batch 8 x 32 anchors on the real target, 20 steps in 74 s "
    "on a 2-core host of this kind"
)


def _layer_column(layer: int) -> str:
    return f"hidden_states_{layer}"


def write_per_layer_variant(pf, captured: tuple[int, ...], path: Path) -> None:
    """The shard's hidden_states frames cut into one bf16 frame per layer, one column each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.shards import codecs

    k = len(captured)
    schema = pa.schema([(_layer_column(i), pa.binary()) for i in captured])
    with pq.ParquetWriter(
        path, schema, compression="none", write_statistics=False, write_page_checksum=True
    ) as writer:
        for g in range(pf.metadata.num_row_groups):
            frames = pf.read_row_group(g, columns=["hidden_states"]).column("hidden_states")
            cols: list[list[bytes]] = [[] for _ in range(k)]
            for frame in frames:
                x = codecs.decode(memoryview(frame.as_buffer()))  # (T, k*H)
                for j, part in enumerate(x.chunk(k, dim=1)):  # (T, H) each
                    cols[j].append(codecs.encode(part.contiguous(), "bf16"))
            table = pa.table(dict(zip(schema.names, cols, strict=True)), schema=schema)
            writer.write_table(table, row_group_size=table.num_rows)


def time_v1(path: Path, captured, layers) -> tuple[float, int, int]:
    """(seconds, samples, bytes read): read hidden_states, decode, select `layers`."""
    import pyarrow.parquet as pq

    from pipeline.shards import codecs

    pos = [captured.index(i) for i in layers]
    started = time.perf_counter()
    n = nbytes = 0
    with pq.ParquetFile(path, page_checksum_verification=True) as pf:
        for g in range(pf.metadata.num_row_groups):
            col = pf.read_row_group(g, columns=["hidden_states"]).column("hidden_states")
            nbytes += col.nbytes
            for frame in col:
                x = codecs.decode(memoryview(frame.as_buffer()))  # (T, k*H)
                t = x.shape[0]
                x.view(t, len(captured), -1)[:, pos].reshape(t, -1)  # (T, len*H)
                n += 1
    return time.perf_counter() - started, n, nbytes


def time_v2(path: Path, layers) -> tuple[float, int, int]:
    """(seconds, samples, bytes read): read only `layers`' columns, decode, concatenate."""
    import pyarrow.parquet as pq
    import torch

    from pipeline.shards import codecs

    names = [_layer_column(i) for i in layers]
    started = time.perf_counter()
    n = nbytes = 0
    with pq.ParquetFile(path, page_checksum_verification=True) as pf:
        for g in range(pf.metadata.num_row_groups):
            table = pf.read_row_group(g, columns=names)
            nbytes += table.nbytes
            for frames in zip(*(table.column(c) for c in names), strict=True):
                parts = [codecs.decode(memoryview(f.as_buffer())) for f in frames]
                torch.cat(parts, dim=1)  # (T, len*H)
                n += 1
    return time.perf_counter() - started, n, nbytes


def time_reader(uri: str, paths: set[str], layers) -> tuple[float, int]:
    """(seconds, samples) of the training reader itself (DatasetSplit.decode: every
    column, the frame cut to `layers`) over the rows of the shards at `paths`."""
    from pipeline.table.split import DatasetSplit

    split = DatasetSplit(uri)
    split.read_layers(layers)
    refs = [r for r in split.train_rows if split.entries[r.shard].path in paths]
    started = time.perf_counter()
    split.decode(refs)
    return time.perf_counter() - started, len(refs)


def measure_step(uri: str, layers: list[int], steps: int, tmp: Path) -> float:
    """Median seconds of training steps 2..N of a 1-layer DSpark at batch 8 reading
    `layers`, on a copy of the dataset (a run pins the version it reads: never the original)."""
    from pipeline.train.config import parse_train_config
    from pipeline.train.trainer import train

    copy = tmp / "dataset"
    shutil.copytree(uri, copy, ignore=shutil.ignore_patterns("_pins", "_sessions", "_lease*"))
    config = parse_train_config(
        dict(
            target=_target_of(uri),
            data=dict(uri=str(copy), num_anchors=32, heldout_fraction=0.05, prefetch=1),
            out_dir=str(tmp / "run"),
            num_steps=steps,
            global_batch_size=8,
            draft=dict(kind="dspark", num_layers=1, aux_layer_ids=layers, mask_token_id=0),
            checkpoint_every=10_000,
            log_every=1,
            num_threads=1,
        )
    )
    result = train(config, export=False)
    times = [m["seconds"] for m in result.metrics[1:]]
    if not times:
        raise SystemExit("--measure-steps needs at least 2 steps")
    return statistics.median(times)


def _target_of(uri: str) -> str:
    from pipeline.table.dataset import Dataset

    return Dataset.open(uri).manifest().provenance.target_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", default="runs/real/dataset")
    parser.add_argument("--layers", default="2,15,27", help="the subset a draft reads")
    parser.add_argument("--num-samples", type=int, default=160, help="about; whole shards")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=3.7)
    parser.add_argument("--measure-steps", type=int, default=0)
    parser.add_argument("--out", default=None, help="write no results; print only (if set)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from pipeline.table.dataset import Dataset
    from pipeline.table.reader import open_shard

    dataset = Dataset.open(args.uri)
    manifest = dataset.manifest()
    prov = manifest.provenance
    captured = tuple(prov.aux_layer_ids)
    layers = [int(i) for i in args.layers.split(",")]
    if not set(layers) <= set(captured):
        raise SystemExit(f"--layers {layers} not all captured in {args.uri} ({list(captured)})")
    shards = sorted(manifest.shards, key=lambda e: e.rows)  # smaller shards first
    picked, rows = [], 0
    for entry in shards:
        if rows >= args.num_samples:
            break
        picked.append(entry)
        rows += entry.rows
    tmp = Path(tempfile.mkdtemp(prefix="layer-subset-"))
    try:
        pairs = []
        for s, entry in enumerate(picked):
            v1 = tmp / f"v1-{s}.parquet"
            pf, _ = open_shard(dataset, entry)  # the manifest's checks, once
            with pf:
                write_per_layer_variant(pf, captured, tmp / f"v2-{s}.parquet")
            with dataset.storage.open_read(entry.path) as src, open(v1, "wb") as dst:
                shutil.copyfileobj(src, dst)  # a local copy: both layouts read from one disk
            pairs.append((v1, tmp / f"v2-{s}.parquet"))
        tokens = 0
        for v1, _ in pairs:
            import pyarrow.parquet as pq

            with pq.ParquetFile(v1) as pf:
                for g in range(pf.metadata.num_row_groups):
                    tokens += sum(
                        len(x) for x in pf.read_row_group(g, columns=["input_ids"]).column(0)
                    )
        runs: dict[str, list[float]] = {"v1": [], "v2_subset": [], "v2_all": [], "reader": []}
        sizes: dict[str, int] = {}
        for _ in range(args.rounds + 1):  # the first round warms the page cache; dropped
            got = {"v1": [0.0, 0, 0], "v2_subset": [0.0, 0, 0], "v2_all": [0.0, 0, 0]}
            for v1, v2 in pairs:
                for key, (sec, n, nbytes) in (
                    ("v1", time_v1(v1, captured, layers)),
                    ("v2_subset", time_v2(v2, layers)),
                    ("v2_all", time_v2(v2, captured)),
                ):
                    got[key][0] += sec
                    got[key][1] += n
                    got[key][2] += nbytes
            for key, (sec, n, nbytes) in got.items():
                runs[key].append(sec / n)
                sizes[key] = nbytes // n
            sec, n = time_reader(args.uri, {e.path for e in picked}, layers)
            runs["reader"].append(sec / n)
        samples = got["v1"][1]
        step_s, step_how = args.step_s, STEP_GIVEN
        if args.measure_steps:
            step_s = measure_step(args.uri, layers, args.measure_steps, tmp)
            step_how = f"measured, median of steps 2-{args.measure_steps}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ms = {k: 1000 * statistics.median(v) for k, v in runs.items()}
    saved_per_step = (ms["v1"] - ms["v2_subset"]) * args.batch / 1000
    figures = {
        "real_subset_dataset": args.uri,
        "real_subset_version": manifest.version,
        "real_subset_target": prov.target_name,
        "real_subset_captured": list(captured),
        "real_subset_layers": layers,
        "real_subset_samples": samples,
        "real_subset_tokens_per_sample": round(tokens / samples, 1),
        "real_subset_v1_ms_per_sample": round(ms["v1"], 3),
        "real_subset_v2_subset_ms_per_sample": round(ms["v2_subset"], 3),
        "real_subset_v2_all_ms_per_sample": round(ms["v2_all"], 3),
        "real_subset_reader_ms_per_sample": round(ms["reader"], 3),
        "real_subset_v1_bytes_per_sample": sizes["v1"],
        "real_subset_v2_subset_bytes_per_sample": sizes["v2_subset"],
        "real_subset_v2_all_bytes_per_sample": sizes["v2_all"],
        "real_subset_batch": args.batch,
        "real_subset_step_s": round(step_s, 3),
        "real_subset_step_how": step_how,
        "real_subset_v1_decode_share_of_step": round(ms["v1"] * args.batch / 1000 / step_s, 5),
        "real_subset_v2_saving_share_of_step": round(saved_per_step / step_s, 5),
        "real_subset_host": f"{platform.machine()}, {os.cpu_count()} cores, one thread",
    }
    verdict = "pays" if figures["real_subset_v2_saving_share_of_step"] >= 0.05 else "does not pay"
    figures["real_subset_verdict"] = verdict
    lines = [
        "## Reading a subset of the captured layers (bench/layer_subset.py, keys real_subset_*)",
        "",
        f"{prov.target_name}, dataset version {manifest.version} captured {list(captured)} "
        f"(hidden {prov.hidden_size}, "
        f"codec {prov.codec}); a draft reading {layers}. {samples} samples "
        f"({figures['real_subset_tokens_per_sample']} tokens each), median of {args.rounds} "
        f"rounds, page cache warm, {figures['real_subset_host']}.",
        "",
        "| layout | ms per sample | bytes read per sample |",
        "|---|---|---|",
        f"| v1 one frame (today): read + decode {len(captured)} layers, keep {len(layers)} | "
        f"{ms['v1']:.2f} | {sizes['v1']:,} |",
        f"| v2 a column per layer: read + decode {len(layers)} | {ms['v2_subset']:.2f} | "
        f"{sizes['v2_subset']:,} |",
        f"| v2 a column per layer: all {len(captured)} | {ms['v2_all']:.2f} | "
        f"{sizes['v2_all']:,} |",
        f"| the training reader today (DatasetSplit.decode: every column, frame cut to "
        f"{len(layers)} layers) | {ms['reader']:.2f} | |",
        "",
        f"Per training step of {args.batch} samples: v1 decodes for "
        f"{ms['v1'] * args.batch:.0f} ms, v2 would save {1000 * saved_per_step:.0f} ms, "
        f"against a step of {step_s:.2f} s ({step_how}): "
        f"{100 * figures['real_subset_v2_saving_share_of_step']:.2f}% of the step. "
        f"A column per layer {verdict} (threshold 5% of a step); decoding runs in the "
        "prefetch thread, so with a core to spare even v1's whole cost is hidden.",
    ]
    print("\n".join(lines))
    if args.out is None:
        merge_results(figures, replace=("real_subset_",))
        write_section("bench/layer_subset.py", "\n".join(lines))


if __name__ == "__main__":
    main()
