"""Schema versions are frozen; shard metadata and provenance are validated."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import schemas
from pipeline.shards.schema import (
    KEY_PROVENANCE,
    KEY_SCHEMA_VERSION,
    Provenance,
    read_shard_meta,
    shard_arrow_schema,
)

from .helpers import provenance

# Frozen field lists, one per version. Changing a released version breaks every
# reader of existing data: add schemas/v2.py instead and a new entry here.
FROZEN = {
    1: [
        ("sample_id", "string"),
        ("source", "string"),
        ("domain", "string"),
        ("input_ids", "list<item: int32>"),
        ("loss_mask", "list<item: uint8>"),
        ("hidden_states", "large_binary"),
        ("last_hidden_state", "large_binary"),
        ("finish_reason", "string"),
        ("num_prompt_tokens", "int32"),
        ("num_generated_tokens", "int32"),
    ],
}


@pytest.mark.parametrize("version", sorted(schemas.SCHEMAS))
def test_field_list_is_frozen(version):
    module = schemas.schema_module(version)
    assert version in FROZEN, f"schema v{version} has no frozen field list in this test"
    assert [(f.name, str(f.type)) for f in module.SCHEMA] == FROZEN[version]
    assert all(f.description.strip() for f in module.FIELDS)


def test_every_version_is_readable():
    prov = provenance()
    for version in sorted(schemas.SCHEMAS):
        module = schemas.schema_module(version)
        schema = module.SCHEMA.with_metadata(
            {KEY_SCHEMA_VERSION: str(version).encode(), KEY_PROVENANCE: prov.to_json().encode()}
        )
        assert read_shard_meta(schema, "x.parquet").schema_version == version


def test_unknown_future_version_is_refused_with_a_clear_message(tmp_path):
    schema = shard_arrow_schema(provenance(), "u").with_metadata(
        {KEY_SCHEMA_VERSION: b"99", KEY_PROVENANCE: provenance().to_json().encode()}
    )
    path = tmp_path / "future.parquet"
    pq.write_table(schema.empty_table(), path)
    with pytest.raises(ValueError, match=r"future.parquet.*unknown sample schema version 99"):
        read_shard_meta(pq.read_schema(path), str(path))


def test_missing_or_mistyped_column_is_named():
    base = shard_arrow_schema(provenance(), "u")
    missing = base.remove(base.get_field_index("loss_mask"))
    with pytest.raises(ValueError, match="'loss_mask' is missing"):
        read_shard_meta(missing, "s.parquet")
    idx = base.get_field_index("input_ids")
    wrong = base.set(idx, pa.field("input_ids", pa.list_(pa.int64())))
    with pytest.raises(ValueError, match="'input_ids' has type"):
        read_shard_meta(wrong, "s.parquet")


def test_not_a_shard():
    with pytest.raises(ValueError, match="not a dspark-targets shard"):
        read_shard_meta(pa.schema([pa.field("a", pa.int32())]), "other.parquet")


def test_provenance_round_trips_and_validates():
    prov = provenance()
    assert Provenance.from_dict(json.loads(prov.to_json())) == prov
    assert prov.hidden_states_width == 2 * 32
    with pytest.raises(ValueError, match="aux_layer_ids"):
        provenance(aux_layer_ids=())
    with pytest.raises(ValueError, match="aux_layer_ids"):
        provenance(aux_layer_ids=(3, 3))
    with pytest.raises(ValueError, match="hidden_size"):
        provenance(hidden_size=0)
    with pytest.raises(ValueError, match="target_revision"):
        provenance(target_revision="")
    with pytest.raises(ValueError, match="unknown provenance keys"):
        Provenance.from_dict({**prov.to_dict(), "colour": "red"})


def test_identity_key_tracks_what_defines_a_target():
    base = provenance()
    assert provenance(code_version="0.2").identity_key() == base.identity_key()
    assert provenance(codec="fp8").identity_key() == base.identity_key()
    assert provenance(aux_layer_ids=(1, 5)).identity_key() != base.identity_key()
    assert provenance(target_revision="other").identity_key() != base.identity_key()


def test_readme_describes_every_field_of_the_latest_version():
    readme = (schemas.MANIFEST_SCHEMA_PATH.parent / "README.md").read_text()
    for f in schemas.schema_module(schemas.LATEST).FIELDS:
        assert f"| `{f.name}` |" in readme, f"schemas/README.md lacks field {f.name}"
