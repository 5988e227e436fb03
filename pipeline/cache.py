"""Where built artefacts (toy targets, converted GGUF targets) are cached on this machine.

Ground floor: the toy builder and the target resolver both read it, so neither
imports the other for it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$DSPARK_TARGETS_CACHE`, else `$XDG_CACHE_HOME/dspark-targets`, else ~/.cache/dspark-targets."""
    if env := os.environ.get("DSPARK_TARGETS_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dspark-targets"
