"""Every failure a user can act on: one `error:` line, no traceback, a non-zero exit, quickly.

Each case runs the real command in a subprocess (`python -m pipeline ...`), as a
user or a Ray job would.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOY = "pipeline/demo/configs/toy.yaml"
TRAIN_TOY = "pipeline/demo/configs/train-toy.yaml"
EVAL_TOY = "pipeline/demo/configs/eval-toy.yaml"
RACK = "jobs/configs/moe-2p8t-gb300.yaml"


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """(exit code, stderr, seconds) of `python -m pipeline ARGS` in the repository root."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return done.returncode, done.stderr, time.monotonic() - start


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert stderr.rstrip().endswith(errors[0]), stderr  # the error is the last thing said
    return errors[0]


def free_loopback_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def s3_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE="/nonexistent",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
        AWS_EC2_METADATA_DISABLED="true",
        **extra,
    )
    return env


@pytest.mark.parametrize(
    "args,expected",
    [
        (("inspect", "no/such/dataset"), "no/such/dataset: no such dataset"),
        (("verify", "no/such/dataset"), "no such dataset"),
        (("inspect", "README.md"), "README.md is a file; a dataset is a directory"),
        (("gc", "README.md"), "README.md is a file"),
        (
            ("corpus", "--out", "unused", "--num-conversations", "0"),
            "Invalid value for '--num-conversations': 0 is not in the range x>=1",
        ),
        (
            ("plan", "--config", TOY, "--set", "replicas.num_replica=2"),
            "--set replicas.num_replica: replicas has no key 'num_replica'; "
            "did you mean replicas.num_replicas?",
        ),
        (
            ("plan", "--config", TOY, "--set", "replica.num_replicas=2"),
            "did you mean replicas.num_replicas?",
        ),
        (
            ("train", "--config", TRAIN_TOY, "--set", "optim.lrr=1e-3"),
            "--set optim.lrr: optim has no key 'lrr'; did you mean optim.lr?",
        ),
        (
            ("plan", "--config", RACK, "--corpus-stats", "num_conversatons=3"),
            "--corpus-stats: unknown key 'num_conversatons'; did you mean num_conversations?",
        ),
        (("plan", "--config", TRAIN_TOY), "`plan` takes a regeneration config"),
        (("plan", "--config", EVAL_TOY), "is not a regeneration config"),
        (("train", "--config", TOY), "`train` takes a training config"),
        (("evaluate", "--config", TOY), "`evaluate` takes an evaluation config"),
        (("plan", "--config", "no/such.yaml"), "no/such.yaml: cannot read config"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v)[:40],
)
def test_a_bad_input_is_one_line_and_exit_nonzero(args, expected):
    code, stderr, seconds = run(*args)
    assert code != 0
    assert expected in one_error_line(stderr)
    assert "pydantic" not in stderr and "https://" not in stderr
    assert seconds < 30


@pytest.mark.parametrize(
    "ref,expected",
    [
        ("foo:bar", "unknown model scheme in 'foo:bar' (prefixes: toy:)"),
        ("toy:nope", "unknown toy target 'toy:nope'; choose one of toy:"),
    ],
)
def test_an_unknown_model_reference_is_one_problem_of_the_config(ref, expected):
    """`target.model` is checked by the scheme that claims it (the toy wing's, installed)."""
    code, stderr, _ = run("plan", "--config", TOY, "--set", f"target.model={ref}")
    assert code != 0 and "Traceback" not in stderr
    assert stderr.startswith(f"error: {TOY}: invalid config (1 problem(s))"), stderr
    [line] = [line for line in stderr.splitlines() if expected in line]
    assert line.lstrip().startswith("target.model: ")


def test_an_unreachable_s3_endpoint_fails_within_seconds_naming_it_and_the_tries():
    port = free_loopback_port()
    env = s3_env(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
    code, stderr, seconds = run(
        "inspect", "s3://bucket/ds", "--endpoint-url", f"http://127.0.0.1:{port}", env=env
    )
    assert code == 1
    line = one_error_line(stderr)
    assert f"cannot reach the S3 endpoint http://127.0.0.1:{port} after" in line
    assert seconds < 10, seconds


def test_missing_s3_credentials_are_one_line():
    env = s3_env()
    port = free_loopback_port()
    code, stderr, seconds = run(
        "inspect", "s3://bucket/ds", "--endpoint-url", f"http://127.0.0.1:{port}", env=env
    )
    assert code == 1
    assert "no S3 credentials found" in one_error_line(stderr)
    assert seconds < 15, seconds


def test_verbose_after_the_command_is_accepted_and_keeps_the_traceback():
    for flag in ("-v", "--verbose"):
        code, stderr, _ = run("inspect", "no/such/dataset", flag)
        assert code == 1
        assert "Traceback" in stderr and "FileNotFoundError: no/such/dataset" in stderr
    code, stderr, _ = run("-v", "inspect", "no/such/dataset")  # before it, as before
    assert code == 1 and "Traceback" in stderr


PASSWORD = "hunter2hunter2"


@pytest.mark.parametrize(
    "args",
    [
        ("inspect", f"s3://admin:{PASSWORD}@bucket/ds"),
        ("gc", f"s3://admin:{PASSWORD}@bucket/ds", "--delete"),
        ("verify", f"https://admin:{PASSWORD}@minio.local/ds"),
        ("repair", f"https://admin:{PASSWORD}@minio.local/ds"),
        ("inspect", "s3://bucket/ds", "--endpoint-url", f"https://admin:{PASSWORD}@127.0.0.1:1"),
        ("inspect", "-v", f"s3://admin:{PASSWORD}@bucket/ds"),  # the traceback too
    ],
    ids=["s3 inspect", "s3 gc", "https verify", "https repair", "endpoint", "verbose"],
)
def test_credentials_in_a_uri_are_refused_and_never_echoed(args):
    code, stderr, seconds = run(
        *args, env=s3_env(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="t")
    )
    assert code == 1 and PASSWORD not in stderr and "<redacted>@" in stderr
    if "-v" not in args:
        one_error_line(stderr)
    assert seconds < 10, seconds
