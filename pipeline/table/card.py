"""The dataset card: `README.md` at the dataset root, rewritten at every commit.

What a person browsing the bucket needs: what produced the data (provenance),
how much there is per domain and per source, bytes per token against raw
bf16, the lineage and the recent versions, and how to read a version. It is
built from the version's root alone (totals and a short history are carried
from root to root), so writing it costs the same at any dataset size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.table.manifest import DatasetLike, Manifest

CARD_KEY = "README.md"


def card_text(uri: str, m: Manifest) -> str:
    prov, totals, lineage = m.provenance, m.totals, m.lineage
    assert totals is not None and lineage is not None
    raw = 2 * (prov.hidden_states_width + prov.hidden_size)
    bpt = totals.bytes / totals.tokens if totals.tokens else 0.0
    lines = [
        f"# Training targets: {prov.target_name}",
        "",
        f"Dataset `{uri}`, written by dspark-targets. Version **{m.version}** "
        f"(committed {m.created_at}); lineage `{lineage.id}` since version "
        f"{lineage.first_version}; latest complete version: {m.last_complete_version}.",
        "",
        "| | |",
        "|---|---|",
        f"| samples | {totals.rows:,} |",
        f"| shards | {totals.shards:,} |",
        f"| tokens | {totals.tokens:,} |",
        f"| bytes | {totals.bytes:,} |",
        f"| bytes per token | {bpt:,.1f} (raw bf16: {raw:,}; ratio {bpt / raw:.3f}) |",
        f"| tombstoned rows (still in files) | {totals.stored_rows - totals.rows:,} |",
        "",
        "## Provenance",
        "",
        "| field | value |",
        "|---|---|",
    ]
    for name, value in prov.to_dict().items():
        lines.append(f"| {name} | `{value}` |")
    for title, counts in (("domain", totals.by_domain), ("source", totals.by_source)):
        lines += ["", f"## Samples per {title}", "", f"| {title} | samples |", "|---|---|"]
        lines += [f"| {k} | {v:,} |" for k, v in sorted(counts.items())]
    lines += [
        "",
        "## Recent versions",
        "",
        "| version | committed | shards | samples | added shards | dropped samples |",
        "|---|---|---|---|---|---|",
    ]
    for h in reversed(m.history):
        lines.append(
            f"| {h['version']} | {h['created_at']} | {h['shards']:,} | {h['rows']:,} | "
            f"{h['added_shards']} | {h['dropped_samples']} |"
        )
    lines += [
        "",
        "## Reading it",
        "",
        "`_latest` names the newest version; `manifests/v<N>.json` is a version's root and",
        "its `segments` list the shards (`shards/*.parquet`) and the rows each version",
        "tombstones. With the project installed:",
        "",
        "```python",
        "from pipeline.table.reader import ShardReader",
        f'reader = ShardReader("{uri}", version={m.version})  # or follow=True',
        "files = reader.parquet_files()  # for datasets / pyarrow / DuckDB",
        "```",
        "",
        "Without it, frames decode with numpy + zstandard: see `schemas/README.md`",
        "of dspark-targets. Pin a version you train on (`ShardReader(..., pin='name')`), so",
        "`gc` keeps its files.",
        "",
    ]
    return "\n".join(lines)


def write_card(dataset: DatasetLike, manifest: Manifest) -> None:
    with dataset.storage.open_write(CARD_KEY) as fh:
        fh.write(card_text(dataset.uri, manifest).encode())
