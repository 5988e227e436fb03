"""The evaluation config: the shipped example parses; errors name file, dotted key, problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import ConfigError
from pipeline.demo import CONFIG_DIR
from pipeline.evaluate.config import load_eval_config, parse_eval_config

EXAMPLE = CONFIG_DIR / "eval-toy.yaml"


def test_example_config_parses_with_overrides():
    config = load_eval_config(EXAMPLE, overrides={"live.num_prompts": 3})
    assert [d.name for d in config.drafts] == ["DSpark", "DFlash", "EAGLE-3", "untrained"]
    assert config.live.num_prompts == 3 and config.vllm.tolerance == 0.03


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        ({"drafts": [{"name": "a", "path": "x"}], "out_dir": "o"}, "target", "required"),
        (
            {"target": "t", "out_dir": "o", "drafts": [{"name": "a", "path": "x", "colour": 1}]},
            "drafts.0.colour",
            "unknown key",
        ),
        (
            {"target": "t", "out_dir": "o", "drafts": [{"name": "a", "untrained": True}]},
            "drafts.0",
            "copies the architecture",
        ),
        (
            {
                "target": "t",
                "out_dir": "o",
                "drafts": [{"name": "a", "path": "x"}],
                "live": {"temperatures": [0.0]},
            },
            "live",
            "measured exactly offline",
        ),
        (
            {
                "target": "t",
                "out_dir": "o",
                "drafts": [{"name": "a", "path": "x"}],
                "vllm": {"draft": "b"},
            },
            "<top level>",
            "not one of the drafts",
        ),
        (
            {
                "target": "t",
                "out_dir": "o",
                "drafts": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}],
            },
            "<top level>",
            "unique",
        ),
    ],
)
def test_errors_name_the_key_and_the_problem(data, key, problem):
    with pytest.raises(ConfigError) as err:
        parse_eval_config(data, "eval.yaml")
    text = str(err.value)
    assert text.startswith("eval.yaml: invalid config")
    assert f"  {key}: " in text and problem in text


@pytest.mark.parametrize(
    "path",
    sorted((Path(__file__).parents[2] / "jobs" / "configs").glob("eval-*.yaml")),
    ids=lambda p: p.name,
)
def test_cluster_eval_configs_parse(path):
    config = load_eval_config(path)
    assert config.drafts, f"{path.name}: no drafts to evaluate"
