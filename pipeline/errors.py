"""The project's named failure, and how the thin entrypoints report failures (light: no torch).

`KNOWN_ERRORS` are failures a user can act on from the message alone (bad
config or input, a missing file, a stage that stopped short); `describe_error`
also recognises what the storage layer and the S3 client raise (an endpoint
that cannot be reached, missing credentials, access denied). The CLI prints
them as one line and exits 1, and shows the traceback only with `--verbose`.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from urllib.parse import urlparse


class PipelineError(RuntimeError):
    """A stage stopped short; the message says what finished, what did not, and what to do."""


# ConfigError and the project's data errors are ValueErrors.
KNOWN_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
    PipelineError,
)


def describe_error(err: BaseException) -> str | None:
    """The one-line message for a failure a user can act on, or None for a bug; any
    credential in it (URL user info, a secret's value) is masked."""
    from pipeline.redact import redact_text, strip_userinfo

    message = _describe(err)
    return None if message is None else redact_text(strip_userinfo(message))


def _describe(err: BaseException) -> str | None:
    botocore = sys.modules.get("botocore.exceptions")
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(err, pydantic.ValidationError):
        # Outside a config file (a value given in code or on the command line).
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in err.errors()
        )
        return f"invalid {err.title}: {problems}"
    if botocore is not None and isinstance(err, botocore.NoCredentialsError):
        return (
            "no S3 credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE), or run where an instance or pod role provides them"
        )
    if botocore is not None and isinstance(err, botocore.PartialCredentialsError):
        return f"incomplete S3 credentials: {err}"
    if _is_unreachable(err, botocore):
        tries = getattr(err, "storage_attempts", None)
        after = f" after {tries} {'try' if tries == 1 else 'tries'}" if tries else ""
        return (
            f"cannot reach the S3 endpoint {_endpoint(err)}{after} ({type(err).__name__}); "
            "check --endpoint-url / AWS_ENDPOINT_URL and the network"
        )
    if isinstance(err, KNOWN_ERRORS):
        return str(err) or type(err).__name__
    return None


def _is_unreachable(err: BaseException, botocore) -> bool:
    if botocore is not None and isinstance(
        err, (botocore.EndpointConnectionError, botocore.ConnectTimeoutError)
    ):
        return True
    return isinstance(err, (ConnectionError, TimeoutError)) and hasattr(err, "storage_attempts")


def _endpoint(err: BaseException) -> str:
    """scheme://host:port of the request that failed (no path, no credentials)."""
    url = getattr(err, "kwargs", {}).get("endpoint_url") or ""
    parsed = urlparse(url)
    if not parsed.hostname:
        return url or "(unknown)"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.hostname}{port}"
