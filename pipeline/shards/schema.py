"""Binding between the versioned sample schemas (schemas/) and shard files.

A shard carries its schema version and the provenance of its data in Parquet
key-value metadata, so a file found on its own still says what produced it.
`Provenance` is the typed record callers pass to the writer; `read_shard_meta`
validates a file's metadata and columns against the schema version it claims.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pyarrow as pa

import schemas

# Parquet key-value metadata keys (bytes, as pyarrow stores them).
KEY_SCHEMA_VERSION = b"dspark.schema_version"
KEY_PROVENANCE = b"dspark.provenance"
KEY_UNIT_ID = b"dspark.unit_id"
KEY_CODEC = b"dspark.codec"

# The layer convention (docs/design.md#the-layer-convention): aux id k = residual stream after k decoder layers.
VLLM_AUX_CONVENTION = "vllm_aux: aux id k = residual stream after k decoder layers (0 = embeddings)"

# Provenance fields that define what a training target *is*: shards that differ
# in any of these cannot be mixed in one dataset version.
IDENTITY_FIELDS = (
    "target_name",
    "target_revision",
    "tokenizer_hash",
    "aux_layer_ids",
    "layer_convention",
    "hidden_size",
)
# What a dataset lineage fixes: the target identity plus everything else that
# changes the stored tensors or answers (codec, generation parameters). A
# version holds shards of one lineage; a refresh that changes any of these
# starts a new lineage and regenerates everything. Corpus and code versions
# are left out: a grown corpus or a new commit of this code continues a lineage.
LINEAGE_FIELDS = (*IDENTITY_FIELDS, "codec", "generation", "last_hidden_state")


@dataclass(frozen=True)
class Provenance:
    """What produced a shard's data; stored in every shard and every manifest."""

    target_name: str  # e.g. "Qwen/Qwen3-8B" or "toy:trained"
    target_revision: str  # weights hash or hub commit
    tokenizer_hash: str  # hash of tokenizer files + chat template
    aux_layer_ids: tuple[int, ...]  # captured aux ids, in hidden_states column order
    hidden_size: int  # H; hidden_states has k*H columns, last_hidden_state H
    codec: str  # tensor codec name (pipeline/shards/codecs.py)
    corpus_version: str  # which corpus snapshot the samples came from
    code_version: str  # dspark-targets version / git commit that wrote the shard
    # Sampling parameters of the regeneration (temperature, top_p, max_new_tokens, seed, ...).
    generation: dict[str, Any] = field(default_factory=dict)
    layer_convention: str = VLLM_AUX_CONVENTION
    last_hidden_state: str = "after final norm"
    # Corpus source name -> the licence its config states (the `source` column names a
    # sample's source); like corpus_version, outside the lineage: a grown corpus continues it.
    corpus_sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("target_name", "target_revision", "tokenizer_hash", "codec"):
            if not getattr(self, name):
                raise ValueError(f"Provenance.{name} is empty; it is required to trace the data")
        if self.hidden_size <= 0:
            raise ValueError(f"Provenance.hidden_size must be positive, got {self.hidden_size}")
        ids = tuple(int(i) for i in self.aux_layer_ids)
        if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
            raise ValueError(
                f"Provenance.aux_layer_ids must be distinct non-negative ints, got {self.aux_layer_ids!r}"
            )
        object.__setattr__(self, "aux_layer_ids", ids)
        try:
            json.dumps(self.generation, sort_keys=True)
        except TypeError as err:
            raise ValueError(f"Provenance.generation must be JSON-serialisable: {err}") from None

    @property
    def hidden_states_width(self) -> int:
        return len(self.aux_layer_ids) * self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["aux_layer_ids"] = list(self.aux_layer_ids)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "provenance") -> Provenance:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown provenance keys {unknown}")
        try:
            return cls(**{**data, "aux_layer_ids": tuple(data.get("aux_layer_ids", ()))})
        except TypeError as err:
            raise ValueError(f"{where}: {err}") from None

    def identity_key(self) -> str:
        """Short hash of IDENTITY_FIELDS: the target a shard's tensors come from."""
        return _fields_key(self, IDENTITY_FIELDS)

    def lineage_key(self) -> str:
        """Short hash of LINEAGE_FIELDS: equal for shards that may share a dataset lineage."""
        return _fields_key(self, LINEAGE_FIELDS)

    def lineage_differences(self, other: Provenance) -> list[str]:
        """`field: ours -> theirs` for every LINEAGE_FIELDS entry that differs."""
        a, b = self.to_dict(), other.to_dict()
        out = []
        for name in LINEAGE_FIELDS:
            if a[name] == b[name]:
                continue
            if isinstance(a[name], dict) and isinstance(b[name], dict):
                keys = sorted(
                    k for k in set(a[name]) | set(b[name]) if a[name].get(k) != b[name].get(k)
                )
                out += [f"{name}.{k}: {a[name].get(k)!r} -> {b[name].get(k)!r}" for k in keys]
            else:
                out.append(f"{name}: {a[name]!r} -> {b[name]!r}")
        return out


def _fields_key(prov: Provenance, names: tuple[str, ...]) -> str:
    data = prov.to_dict()
    blob = json.dumps({n: data[n] for n in names}, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class ShardMeta:
    """The metadata a shard file carries about itself."""

    schema_version: int
    unit_id: str
    codec: str
    provenance: Provenance


def shard_arrow_schema(provenance: Provenance, unit_id: str) -> pa.Schema:
    """The latest sample schema with this shard's metadata attached."""
    module = schemas.schema_module(schemas.LATEST)
    return module.SCHEMA.with_metadata(
        {
            KEY_SCHEMA_VERSION: str(module.VERSION).encode(),
            KEY_PROVENANCE: provenance.to_json().encode(),
            KEY_UNIT_ID: unit_id.encode(),
            KEY_CODEC: provenance.codec.encode(),
        }
    )


def read_shard_meta(schema: pa.Schema, where: str) -> ShardMeta:
    """Validate a shard's Arrow schema + metadata; `where` names the file in errors."""
    meta = schema.metadata or {}
    if KEY_SCHEMA_VERSION not in meta:
        raise ValueError(
            f"{where}: not a dspark-targets shard (no {KEY_SCHEMA_VERSION.decode()} metadata)"
        )
    try:
        version = int(meta[KEY_SCHEMA_VERSION])
    except ValueError:
        raise ValueError(f"{where}: bad schema version {meta[KEY_SCHEMA_VERSION]!r}") from None
    try:
        module = schemas.schema_module(version)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    check_columns(schema, module.SCHEMA, where)
    try:
        prov = Provenance.from_dict(json.loads(meta[KEY_PROVENANCE]), f"{where} provenance")
    except (KeyError, json.JSONDecodeError) as err:
        raise ValueError(f"{where}: missing or unreadable provenance metadata ({err})") from None
    return ShardMeta(
        schema_version=version,
        unit_id=meta.get(KEY_UNIT_ID, b"").decode(),
        codec=meta.get(KEY_CODEC, prov.codec.encode()).decode(),
        provenance=prov,
    )


def check_columns(actual: pa.Schema, expected: pa.Schema, where: str) -> None:
    """Every expected column present with the expected type (extra columns are allowed)."""
    for fld in expected:
        idx = actual.get_field_index(fld.name)
        if idx < 0:
            raise ValueError(f"{where}: column {fld.name!r} is missing")
        got = actual.field(idx).type
        if not got.equals(fld.type, check_metadata=False) and not _same_list(got, fld.type):
            raise ValueError(f"{where}: column {fld.name!r} has type {got}, expected {fld.type}")


def _same_list(a: pa.DataType, b: pa.DataType) -> bool:
    # Parquet round trips rename list items ("item" -> "element"); compare values only.
    return pa.types.is_list(a) and pa.types.is_list(b) and a.value_type.equals(b.value_type)
