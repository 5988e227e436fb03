"""Quiet, structured logging: `key=value` pairs on one line per event.

Third-party loggers (vLLM, Ray, transformers) are turned down to WARNING unless
`--verbose` is given, so a long job's log shows the pipeline's own events.
"""

from __future__ import annotations

import logging
import os

_NOISY = ("vllm", "ray", "transformers", "datasets", "urllib3", "botocore", "s3fs", "filelock")


def setup_logging(verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    if not verbose:
        import warnings

        for name in _NOISY:
            logging.getLogger(name).setLevel(logging.WARNING)
        # vLLM's CPU build warns at every start (Triton, oneDNN, deprecated torch APIs).
        logging.getLogger("vllm").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", category=FutureWarning)
        # vLLM's CPU build warns at every start about Triton and oneDNN fallbacks.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def kv(**fields: object) -> str:
    """Format fields as `k=v` pairs; strings with spaces are quoted."""
    parts = []
    for key, value in fields.items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        if " " in text:
            text = repr(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)
