"""`--set` keys checked against the config's own fields; a config of another kind named as such."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import ConfigError, WrongConfigKind, check_override_key
from pipeline.regenerate.config import PipelineConfig, load_config
from pipeline.train.config import load_train_config

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "pipeline/demo/configs/toy.yaml"


@pytest.mark.parametrize(
    "key,message",
    [
        ("replicas.placement.num_bundls", "did you mean replicas.placement.num_bundles?"),
        ("replica.num_replicas", "the regeneration config has no key 'replica'"),
        ("generation.zzz", "generation has no key 'zzz'"),
    ],
)
def test_an_override_key_the_config_lacks_is_named_with_the_closest(key, message):
    with pytest.raises(ConfigError) as err:
        check_override_key(PipelineConfig, key, "regeneration")
    assert str(err.value).startswith(f"--set {key}: ") and message in str(err.value)


@pytest.mark.parametrize(
    "key", ["replicas.num_replicas", "corpus.sources.0.path", "replicas.placement.bundle.GPU"]
)
def test_keys_of_the_config_and_below_lists_or_mappings_pass(key):
    check_override_key(PipelineConfig, key, "regeneration")


def test_a_config_of_another_kind_is_named_not_listed_key_by_key():
    with pytest.raises(WrongConfigKind) as err:
        load_train_config(TOY)
    assert err.value.kind == "training" and "is not a training config" in str(err.value)
    assert "unknown key" not in str(err.value)


def test_overrides_still_apply():
    assert load_config(TOY, {"replicas.num_replicas": 3}).replicas.num_replicas == 3
