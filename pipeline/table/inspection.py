"""Library side of `dspark-targets inspect` and `verify`: reports on a dataset's versions and files.

* `inspect_dataset`: versions (which gc retired), lineage, shards, rows, tokens,
  bytes per token, codec, provenance.
* `verify_dataset`: every file a version names: re-hash every shard against
  its manifest and decode every tensor, check its provenance against the
  lineage, its sidecar against its id column, and every segment against the
  root; the report names each corrupt file and what is wrong.

Each returns a frozen report with `to_text()`; the CLI only prints it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.layout import manifest_key
from pipeline.table.manifest import Manifest, ShardEntry, parse_root

_HASH_CHUNK = 8 << 20


def _mb(n: int | float) -> str:
    return f"{n / 1e6:,.1f} MB"


def raw_bf16_bytes_per_token(manifest: Manifest) -> int:
    """Bytes per token of the two tensors stored as raw bf16 (the anchors' format)."""
    prov = manifest.provenance
    return 2 * (prov.hidden_states_width + prov.hidden_size)


# --------------------------------------------------------------------------- inspect


@dataclass(frozen=True)
class VersionSummary:
    version: int
    created_at: str
    num_shards: int
    num_rows: int
    num_tokens: int
    num_bytes: int
    lineage: str = "-"  # lineage id
    complete: bool = False
    retired: bool = False  # gc retired it: its root stays, its files may be gone


@dataclass(frozen=True)
class SourceSummary:
    """One corpus source in a version: live rows and mean tokens per row."""

    rows: int
    prompt_tokens: float
    answer_tokens: float


@dataclass(frozen=True)
class InspectReport:
    uri: str
    latest: int | None
    versions: tuple[VersionSummary, ...]
    manifest: Manifest | None  # of the version inspected in detail
    # Per source, read from the shards' small columns (None: not asked for).
    sources: dict[str, SourceSummary] | None = None

    def to_text(self) -> str:
        if self.manifest is None:
            return f"{self.uri}: no committed version"
        m = self.manifest
        lines = [f"dataset {self.uri}", f"latest version: {self.latest}", "", "versions:"]
        for v in self.versions:
            lines.append(
                f"  v{v.version:06d}  {v.created_at}  shards={v.num_shards} rows={v.num_rows} "
                f"tokens={v.num_tokens} bytes={_mb(v.num_bytes)} lineage={v.lineage}"
                + (" complete" if v.complete else "")
                + (" retired" if v.retired else "")
            )
        raw = raw_bf16_bytes_per_token(m)
        lines += [
            "",
            f"version {m.version} (parent {m.parent_version}), schema v{m.schema_version}, "
            f"manifest format {m.manifest_version}:",
        ]
        if m.lineage is not None:
            lines.append(
                f"  lineage {m.lineage.id} since version {m.lineage.first_version}, "
                f"{m.lineage.num_buckets} buckets; {len(m.segments)} segments; latest complete "
                f"version {m.last_complete_version}"
            )
        if m.totals is not None:
            lines.append(
                "  samples by domain: "
                + ", ".join(f"{k}={n}" for k, n in sorted(m.totals.by_domain.items()))
            )
            licences = m.provenance.corpus_sources
            lines.append(
                "  samples by source: "
                + ", ".join(
                    f"{k}={n}" + (f" ({licences[k]})" if k in licences else "")
                    for k, n in sorted(m.totals.by_source.items())
                )
            )
            dropped = m.totals.stored_rows - m.totals.rows
            if dropped:
                lines.append(
                    f"  tombstoned rows (kept in their files, skipped by readers): {dropped}"
                )
        if self.sources:
            width = max(len(k) for k in self.sources) + 2
            lines.append(f"  {'source':<{width}}{'rows':>8}{'prompt tok':>12}{'answer tok':>12}")
            for name, src in sorted(self.sources.items()):
                lines.append(
                    f"  {name:<{width}}{src.rows:>8}{src.prompt_tokens:>12.1f}{src.answer_tokens:>12.1f}"
                )
        lines.append(
            f"  {'shard':<40} {'rows':>7} {'tokens':>10} {'bytes':>12} {'B/token':>9} codec"
        )
        for e in m.shards:
            bpt = e.bytes / e.tokens if e.tokens else 0.0
            live = f"{e.live_rows}/{e.rows}" if e.dropped_rows else str(e.rows)
            lines.append(
                f"  {e.path:<40} {live:>7} {e.tokens:>10} {e.bytes:>12} {bpt:>9.1f} {e.codec}"
            )
        bpt = m.num_bytes / m.num_tokens if m.num_tokens else 0.0
        lines.append(
            f"  total: shards={len(m.shards)} rows={m.num_rows} tokens={m.num_tokens} "
            f"bytes={_mb(m.num_bytes)} bytes/token={bpt:.1f} "
            f"(raw bf16 {raw} B/token, ratio {bpt / raw:.3f})"
        )
        lines += ["", "provenance:"]
        lines += ["  " + line for line in json.dumps(m.provenance.to_dict(), indent=2).splitlines()]
        return "\n".join(lines)


def source_summaries(dataset: Dataset, manifest: Manifest) -> dict[str, SourceSummary]:
    """Live rows and mean prompt/answer tokens per source: only the small columns are read."""
    from pipeline.shards.reader import read_row_group
    from pipeline.table.reader import open_shard

    tally: dict[str, list[int]] = {}
    columns = ["sample_id", "source", "num_prompt_tokens", "num_generated_tokens"]
    for entry in manifest.shards:
        dropped = frozenset(entry.dropped)
        pf, _ = open_shard(dataset, entry)
        with pf:
            for g in range(pf.metadata.num_row_groups):
                table = read_row_group(pf, g, dataset.shard_url(entry), columns).to_pydict()
                for sid, src, p, a in zip(*(table[c] for c in columns), strict=True):
                    if sid in dropped:
                        continue
                    t = tally.setdefault(src, [0, 0, 0])
                    t[0], t[1], t[2] = t[0] + 1, t[1] + p, t[2] + a
    return {k: SourceSummary(n, p / n, a / n) for k, (n, p, a) in tally.items() if n}


def inspect_dataset(
    uri: str,
    *,
    version: int | None = None,
    endpoint_url: str | None = None,
    sources: bool = False,
) -> InspectReport:
    dataset = Dataset.open(uri, endpoint_url=endpoint_url)
    latest = dataset.latest_version()
    if latest is None:
        return InspectReport(dataset.uri, None, (), None)
    summaries = []
    retired = dataset.retired_versions()
    for v in dataset.versions():  # from the roots alone: no segment is read
        key = manifest_key(v)
        body = parse_root(dataset.storage.read_bytes(key), dataset.storage.url(key)).body
        t = body.get("totals", {})
        lineage = body.get("lineage") or {}
        summaries.append(
            VersionSummary(
                v,
                body["created_at"],
                t.get("shards", 0),
                t.get("rows", 0),
                t.get("tokens", 0),
                t.get("bytes", 0),
                lineage.get("id", "-"),
                bool(body.get("commit", {}).get("complete")),
                v in retired,
            )
        )
    manifest = dataset.manifest(version or latest)
    per_source = source_summaries(dataset, manifest) if sources else None
    return InspectReport(dataset.uri, latest, tuple(summaries), manifest, per_source)


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class ShardProblem:
    path: str  # full URL of the shard
    problems: tuple[str, ...]


@dataclass(frozen=True)
class VerifyReport:
    uri: str
    version: int
    num_shards: int
    num_rows: int
    corrupt: tuple[ShardProblem, ...]
    problems: tuple[str, ...] = ()  # the version's own files (root, segments)

    @property
    def ok(self) -> bool:
        return not self.corrupt and not self.problems

    def to_text(self) -> str:
        head = f"{self.uri} version {self.version}: {self.num_shards} shards, {self.num_rows} rows checked"
        if self.ok:
            return (
                f"{head}: OK (root, segments, every shard and sample index match; "
                "every tensor decodes)"
            )
        lines = [f"{head}: {len(self.corrupt)} corrupt shard(s), {len(self.problems)} problem(s)"]
        lines += [f"  - {p}" for p in self.problems]
        for shard in self.corrupt:
            lines.append(f"  CORRUPT {shard.path}")
            lines += [f"    - {p}" for p in shard.problems]
        return "\n".join(lines)


def _hash_shard(dataset: Dataset, entry: ShardEntry) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with dataset.storage.open_read(entry.path) as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def verify_shard(
    dataset: Dataset, entry: ShardEntry, manifest: Manifest, ids_out: list[str] | None = None
) -> list[str]:
    """Problems with one shard; empty if its bytes and every tensor are as committed.

    `ids_out` receives the sample ids of the file's rows, in order.
    """
    from pipeline.shards.reader import decode_rows  # torch only when verifying
    from pipeline.table.reader import open_shard

    problems = []
    try:
        sha, size = _hash_shard(dataset, entry)
    except FileNotFoundError:
        return ["file is missing"]
    if size != entry.bytes:
        problems.append(f"size {size} bytes, manifest says {entry.bytes}")
    if sha != entry.sha256:
        problems.append(
            f"sha256 {sha[:16]}... does not match the manifest's {entry.sha256[:16]}..."
        )
    prov = manifest.provenance
    widths = {"hidden_states": prov.hidden_states_width, "last_hidden_state": prov.hidden_size}
    url = dataset.shard_url(entry)
    ids: list[str] = []
    try:
        pf, meta = open_shard(dataset, entry)
        lineage = manifest.lineage
        if lineage is not None and meta.provenance.lineage_key() != lineage.key:
            problems.append(
                "provenance in the file differs from the lineage's: "
                + "; ".join(manifest.provenance.lineage_differences(meta.provenance)[:4])
            )
        rows = tokens = 0
        with pf:
            for group in range(pf.metadata.num_row_groups):
                for sample in decode_rows(pf.read_row_group(group), url):
                    rows += 1
                    ids.append(sample.sample_id)
                    tokens += len(sample.input_ids)
                    for name, width in widths.items():
                        got = getattr(sample, name).shape[1]
                        if got != width:
                            problems.append(
                                f"sample {sample.sample_id!r}: {name} width {got}, expected {width}"
                            )
        if rows != entry.rows or tokens != entry.tokens:
            problems.append(
                f"{rows} rows / {tokens} tokens, manifest says {entry.rows} / {entry.tokens}"
            )
    except Exception as err:  # any failure to parse or decode is a finding, not a crash
        problems.append(f"cannot decode: {type(err).__name__}: {err}")
    if entry.sidecar is not None:
        try:
            index = dataset.sample_index(entry)
            if [r.sample_id for r in index.rows] != ids and not problems:
                problems.append(f"sample index {entry.sidecar} lists other rows than the file")
        except Exception as err:
            problems.append(f"sample index: {err}")
    if ids_out is not None:
        ids_out.extend(ids)
    return problems


def verify_dataset(
    uri: str, *, version: int | None = None, endpoint_url: str | None = None
) -> VerifyReport:
    dataset = Dataset.open(uri, endpoint_url=endpoint_url)
    version = version if version is not None else dataset.latest_version()
    if version is None:
        dataset.manifest()  # raises: no committed version
    try:
        manifest = dataset.manifest(version)
    except DatasetError as err:  # a missing or corrupt segment is a finding
        root = manifest_key(version)
        if not dataset.storage.exists(root):
            raise
        parse_root(dataset.storage.read_bytes(root), dataset.storage.url(root))
        return VerifyReport(dataset.uri, version, 0, 0, (), (str(err),))
    corrupt = []
    seen: dict[str, str] = {}
    twice: list[str] = []
    for entry in manifest.shards:
        ids: list[str] = []
        problems = verify_shard(dataset, entry, manifest, ids)
        if problems:
            corrupt.append(ShardProblem(dataset.shard_url(entry), tuple(problems)))
        dropped = set(entry.dropped)
        for sid in ids:
            if sid in dropped:
                continue
            if sid in seen:
                twice.append(f"sample {sid!r} is live in both {seen[sid]} and {entry.path}")
            seen[sid] = entry.path
    version_problems = tuple(twice[:20])
    if len(twice) > 20:
        version_problems += (f"... {len(twice) - 20} more samples listed twice",)
    return VerifyReport(
        dataset.uri,
        manifest.version,
        len(manifest.shards),
        manifest.num_rows,
        tuple(corrupt),
        version_problems,
    )


__all__ = ["InspectReport", "VerifyReport", "inspect_dataset", "verify_dataset"]
