"""Export a dataset version to the layouts other trainers read: Hugging Face datasets, speculators.

Both exports hold the live rows of one version (tombstoned rows left out),
decoded from the codec frames, plus `dspark_export.json` (source URI,
version, lineage, provenance, row count).

* `hf-datasets`: a `datasets.save_to_disk` directory (`datasets.load_from_disk(out)`),
  one row per sample:
  `sample_id`, `source`, `domain`, `input_ids` (int32), `loss_mask` (uint8),
  `hidden_states` [T][k*H] and `last_hidden_state` [T][H] as the int16 bit
  patterns of the bf16 values (datasets has no bf16 and upcasts in its
  formatters, so read them back with
  `torch.as_tensor(row["hidden_states"]).to(torch.int16).view(torch.bfloat16)`),
  `finish_reason`, `num_prompt_tokens`, `num_generated_tokens`.
* `speculators`: the offline-training layout of vllm-project/speculators
  (`speculators.train.data.ArrowDataset`): a `save_to_disk` token dataset
  in torch format with `input_ids`, `loss_mask` (int64) and `seq_len` (plus
  `sample_id`, `source`, `domain`), and `hidden_states/hs_{i}.safetensors` for
  row i with `hidden_states` [T, k+1, H] bf16 (the k captured aux layers in
  provenance order, then the final state) and `token_ids` [T] int64. Note:
  the final state here is *after* the target's final norm (what this project
  stores); speculators' EAGLE-3 trainer applies the verifier's norm to that
  slot itself, so for EAGLE-3 training there, capture the pre-norm stream
  as an aux layer (aux id = number of layers) or train with this project.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.table.dataset import Dataset

FORMATS = ("hf-datasets", "speculators")


@dataclass(frozen=True)
class ExportReport:
    out: Path
    format: str
    version: int
    rows: int

    def to_text(self) -> str:
        return (
            f"exported version {self.version} ({self.rows} samples) as {self.format} to {self.out}"
        )


def _bits(t) -> list:
    import torch

    return t.view(torch.int16).tolist()


def export_dataset(
    uri: str,
    out: str | Path,
    *,
    format: str,
    version: int | None = None,
    endpoint_url: str | None = None,
    verify: bool = False,
) -> ExportReport:
    """Write version `version` (default: the latest) of `uri` to `out` in `format`.

    `verify`: re-hash every shard against the manifest before reading it.
    """
    from pipeline.table.reader import ShardReader

    if format not in FORMATS:
        raise ValueError(f"export format {format!r} is not one of {list(FORMATS)}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty: export into a new directory")
    dataset = Dataset.open(uri, endpoint_url=endpoint_url)
    version = dataset.manifest(version).version  # the latest, if None
    with dataset.pinned(version, "export"):  # gc keeps it while it is read
        reader = ShardReader(dataset, version=version, prefetch=2, verify=verify)
        manifest = reader.manifest
        out.mkdir(parents=True, exist_ok=True)
        if format == "hf-datasets":
            rows = _export_hf(reader, out)
        else:
            rows = _export_speculators(reader, out)
    meta = {
        "source": dataset.uri,
        "version": manifest.version,
        "lineage": manifest.lineage.to_dict() if manifest.lineage else None,
        "format": format,
        "rows": rows,
        "provenance": manifest.provenance.to_dict(),
    }
    (out / "dspark_export.json").write_text(json.dumps(meta, indent=2) + "\n")
    return ExportReport(out, format, manifest.version, rows)


def _export_hf(reader, out: Path) -> int:
    import datasets
    import torch

    prov = reader.manifest.provenance
    value = datasets.Value
    features = datasets.Features(
        {
            "sample_id": value("string"),
            "source": value("string"),
            "domain": value("string"),
            "input_ids": datasets.List(value("int32")),
            "loss_mask": datasets.List(value("uint8")),
            "hidden_states": datasets.List(
                datasets.List(value("int16"), length=prov.hidden_states_width)
            ),
            "last_hidden_state": datasets.List(
                datasets.List(value("int16"), length=prov.hidden_size)
            ),
            "finish_reason": value("string"),
            "num_prompt_tokens": value("int32"),
            "num_generated_tokens": value("int32"),
        }
    )

    def rows():
        for s in reader:
            yield {
                "sample_id": s.sample_id,
                "source": s.source,
                "domain": s.domain,
                "input_ids": s.input_ids.tolist(),
                "loss_mask": s.loss_mask.to(torch.uint8).tolist(),
                "hidden_states": _bits(s.hidden_states),
                "last_hidden_state": _bits(s.last_hidden_state),
                "finish_reason": s.finish_reason,
                "num_prompt_tokens": s.num_prompt_tokens,
                "num_generated_tokens": s.num_generated_tokens,
            }

    with tempfile.TemporaryDirectory(prefix="dspark-export-") as cache:
        dset = datasets.Dataset.from_generator(
            rows, features=features, cache_dir=cache, writer_batch_size=16
        )
        dset.save_to_disk(str(out))
    return dset.num_rows


def _export_speculators(reader, out: Path) -> int:
    import datasets
    import torch
    from safetensors.torch import save_file

    hidden = out / "hidden_states"
    hidden.mkdir()
    k = len(reader.manifest.provenance.aux_layer_ids)
    columns: dict[str, list] = {
        "input_ids": [],
        "loss_mask": [],
        "seq_len": [],
        "sample_id": [],
        "source": [],
        "domain": [],
    }
    for i, s in enumerate(reader):
        T, H = s.last_hidden_state.shape
        layers = s.hidden_states.reshape(T, k, H)
        stacked = torch.cat([layers, s.last_hidden_state[:, None, :]], dim=1).contiguous()
        save_file(
            {"hidden_states": stacked, "token_ids": s.input_ids.to(torch.int64).contiguous()},
            str(hidden / f"hs_{i}.safetensors"),
        )
        columns["input_ids"].append(s.input_ids.to(torch.int64).tolist())
        columns["loss_mask"].append(s.loss_mask.to(torch.int64).tolist())
        columns["seq_len"].append(T)
        columns["sample_id"].append(s.sample_id)
        columns["source"].append(s.source)
        columns["domain"].append(s.domain)
    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int64")),
            "loss_mask": datasets.List(datasets.Value("int64")),
            "seq_len": datasets.Value("int64"),
            "sample_id": datasets.Value("string"),
            "source": datasets.Value("string"),
            "domain": datasets.Value("string"),
        }
    )
    dset = datasets.Dataset.from_dict(columns, features=features)
    dset.set_format(type="torch")  # as speculators' own preprocessing saves it
    dset.save_to_disk(str(out))
    return dset.num_rows
