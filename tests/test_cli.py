import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from pipeline.cli import cli

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (
    "regenerate",
    "train",
    "evaluate",
    "refresh",
    "inspect",
    "verify",
    "gc",
    "export",
    "plan",
    "demo",
)


def test_help_lists_every_command():
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "--help"], capture_output=True, text=True, check=True
    )
    for name in COMMANDS:
        assert f"  {name} " in result.stdout


def test_plan_prints_resolved_config_and_resources():
    result = CliRunner().invoke(
        cli, ["plan", "--config", str(ROOT / "jobs/configs/moe-2p8t-gb300.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert "tensor_parallel_size: 72" in result.output
    assert "4 x placement group of 72 bundles" in result.output
    assert "total GPUs requested: 288" in result.output


def test_stage_commands_name_the_bad_key(tmp_path):
    # train and evaluate read their own config formats; a pipeline config is not one.
    for name in ("train", "evaluate"):
        result = CliRunner().invoke(
            cli, [name, "--config", str(ROOT / "pipeline/demo/configs/toy.yaml")]
        )
        assert result.exit_code == 1, (name, result.output)
        assert "toy.yaml: invalid config" in result.output and "unknown key" in result.output


def test_bad_config_is_one_line_error_exit_1(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: {model: toy:random}\n")
    result = CliRunner().invoke(cli, ["plan", "--config", str(bad)])
    assert result.exit_code == 1
    assert str(bad) in result.output and "corpus: required key is missing" in result.output


def test_corpus_command_writes_files(tmp_path):
    result = CliRunner().invoke(
        cli, ["corpus", "--out", str(tmp_path), "--num-conversations", "12"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "corpus.jsonl").read_text().count("\n") == 12
