"""Content identities of a target: weights revision and tokenizer/template hash.

They go into shard provenance and into work-unit ids, so data from another
target revision, tokenizer or chat template is never mistaken for current.
Hashing every weight of a multi-terabyte checkpoint is not affordable, so
large files are identified by name and size plus a hash of their first and
last MiB; files up to `FULL_HASH_LIMIT` are hashed whole. A hub revision that
is a commit hash is used as-is.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

FULL_HASH_LIMIT = 256 << 20
_EDGE = 1 << 20
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(f"{path.name}:{size}:".encode())
    with path.open("rb") as fh:
        if size <= FULL_HASH_LIMIT:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        else:
            h.update(fh.read(_EDGE))
            fh.seek(size - _EDGE)
            h.update(fh.read(_EDGE))
    return h.hexdigest()


def weights_revision(model: str, revision: str | None = None) -> str:
    """A short identity of the target's weights (hub commit, or a hash of local files)."""
    if revision and _COMMIT.match(revision):
        return revision
    path = Path(model)
    if not path.is_dir():
        # A hub name without a pinned commit: the name and ref are all we know here.
        return f"{model}@{revision or 'main'}"
    h = hashlib.sha256()
    for file in sorted(path.iterdir()):
        if (
            file.suffix in (".safetensors", ".bin", ".pt")
            or file.name in ("config.json",)
            or file.name.endswith(".index.json")
        ):
            h.update(_file_digest(file).encode())
    return h.hexdigest()[:16]


def tokenizer_hash(model: str) -> str:
    """Hash of the tokenizer files and chat template."""
    path = Path(model)
    h = hashlib.sha256()
    if not path.is_dir():
        h.update(model.encode())
        return h.hexdigest()[:16]
    for name in TOKENIZER_FILES:
        file = path / name
        if file.exists():
            h.update(name.encode())
            h.update(file.read_bytes())
    return h.hexdigest()[:16]
