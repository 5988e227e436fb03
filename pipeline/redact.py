"""Keeping credentials out of everything the project prints, logs or writes.

Object-store keys and tokens reach a run through the environment, Ray's
`runtime_env` (`env_vars`), or endpoint URLs with user info. None of them may
appear in logs, `plan` output, manifests, error records, checkpoints or reprs:

* `redact(data)` copies a config mapping with the values of secret-looking
  keys replaced and user info stripped from URLs (what `plan` prints);
* `redact_text(text)` replaces every secret value found in the environment;
* `SecretFilter` applies it to every log record (installed by
  `logs.setup_logging`), and the HTTP/S3 client loggers whose debug output
  carries signed headers stay at INFO even with `--verbose`.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

MASK = "<redacted>"
# Names of settings that hold secrets (not counts: `max_new_tokens` is no secret).
SECRET_NAME = re.compile(
    r"(secret|password|passwd|credential|access_key|api_key|private_key|(^|_)token$|"
    r"(^|_)auth(orization)?$)",
    re.IGNORECASE,
)
_URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@", re.I)
# Loggers whose DEBUG records carry request headers (Authorization, X-Amz-Security-Token).
CREDENTIAL_LOGGERS = ("botocore", "boto3", "aiobotocore", "s3fs", "urllib3", "fsspec", "httpx")


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def strip_userinfo(text: str) -> str:
    """`https://user:pass@host/...` -> `https://<redacted>@host/...`."""
    return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)


def redact(data: Any) -> Any:
    """A copy of `data` (mappings, lists, strings) with secrets masked."""
    if isinstance(data, dict):
        return {
            k: (
                MASK
                if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v
                else redact(v)
            )
            for k, v in data.items()
        }
    if isinstance(data, (list, tuple)):
        return type(data)(redact(v) for v in data)
    if isinstance(data, str):
        return redact_text(strip_userinfo(data))
    return data


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of secret-looking environment variables (long enough to be worth masking)."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= 8}
    # AWS_ACCESS_KEY_ID's name says "key", not "secret", but it identifies the account.
    if len(env.get("AWS_ACCESS_KEY_ID", "")) >= 8:
        values.add(env["AWS_ACCESS_KEY_ID"])
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, values: list[str] | None = None) -> str:
    for value in secret_values() if values is None else values:
        if value in text:
            text = text.replace(value, MASK)
    return text


class SecretFilter(logging.Filter):
    """Masks secret values and URL user info in every record passing a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(strip_userinfo(message))
        if clean != message:
            record.msg, record.args = clean, None
        return True
