"""No credential reaches logs or `plan` output: sentinel keys through the environment and runtime_env."""

# ruff: noqa: F811  (fixtures imported from s3_server are redefined as arguments)

from __future__ import annotations

import logging

from click.testing import CliRunner
from s3_server import moto_endpoint, s3_uri  # noqa: F401  (fixtures)

from pipeline.redact import MASK, redact, redact_text, strip_userinfo

ACCESS = "AKIASENTINEL00000042"
SECRET = "sentinel-secret-do-not-print-0042"
TOKEN = "sentinel-session-token-0042"


def test_redact_masks_secret_keys_env_values_and_url_userinfo(monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    data = {
        "ray": {"runtime_env": {"env_vars": {"AWS_SECRET_ACCESS_KEY": SECRET, "HF_HOME": "/x"}}},
        "output": {"endpoint_url": "https://user:pw@minio.local:9000", "uri": "s3://b/p"},
        "note": f"token={TOKEN}",
    }
    out = redact(data)
    assert out["ray"]["runtime_env"]["env_vars"] == {"AWS_SECRET_ACCESS_KEY": MASK, "HF_HOME": "/x"}
    assert out["output"] == {"endpoint_url": f"https://{MASK}@minio.local:9000", "uri": "s3://b/p"}
    assert TOKEN not in out["note"]
    assert strip_userinfo("ray://a:b@head:10001") == f"ray://{MASK}@head:10001"
    assert redact_text("plain text") == "plain text"


def test_plan_prints_no_credential(monkeypatch, trained_target_dir):
    from pipeline.cli import cli
    from pipeline.demo import CONFIG_DIR

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            "--config",
            str(CONFIG_DIR / "toy.yaml"),
            "--set",
            f"ray.runtime_env={{env_vars: {{AWS_SECRET_ACCESS_KEY: {SECRET}, AWS_ACCESS_KEY_ID: {ACCESS}}}}}",
            "--set",
            "output.endpoint_url=https://admin:hunter2hunter2@minio.local:9000",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "runtime_env" in result.output and MASK in result.output
    for value in (SECRET, ACCESS, "hunter2hunter2"):
        assert value not in result.output


def test_verbose_s3_work_logs_no_credential(monkeypatch, moto_endpoint, s3_uri, caplog):
    from pipeline.logs import setup_logging
    from pipeline.storage import open_storage

    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    setup_logging(verbose=True)
    try:
        handler = logging.getLogger().handlers[0]
        records: list[str] = []
        handler.emit = lambda record: records.append(handler.format(record))  # type: ignore[method-assign]
        storage = open_storage(s3_uri, endpoint_url=moto_endpoint)
        with storage.open_write("a/b.bin") as fh:
            fh.write(b"x" * 1024)
        storage.put_if_absent("manifests/v000001.json", b"{}")
        assert storage.read_bytes("a/b.bin") == b"x" * 1024
        logging.getLogger("pipeline.test").info("a log line naming %s", TOKEN)
        text = "\n".join(records) + repr(storage)
        assert records, "verbose logging wrote nothing"
        assert logging.getLogger("botocore").getEffectiveLevel() >= logging.INFO
        for value in (TOKEN, "AKIAFAKEFORTESTS0001", "fake-secret-3f9a1c-never-print-me"):
            assert value not in text
        assert MASK in text  # the line naming the token was masked, not dropped
    finally:
        setup_logging(verbose=False)
