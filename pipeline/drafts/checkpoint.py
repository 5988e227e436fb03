"""The layout of a training run's checkpoints, in one place: save, find, load.

    <out_dir>/checkpoints/step-00000100/{state.pt, spec.json, config.yaml}
    <out_dir>/checkpoints/latest           the name of the newest step directory

`state.pt` holds the draft's tensors (`model`, vLLM's names), the AdamW and
scheduler states, the step and the data position of every rank; `spec.json`
the DraftSpec; `config.yaml` the whole TrainConfig (so a checkpoint says what
target and data it was trained on, `data.version` included: a resumed run
reads that version). A checkpoint is written into a temporary sibling, every
file and the directory fsynced, and renamed into place, then `latest` is
replaced atomically (fsynced too): a crash or power loss leaves either the
old or the new checkpoint, never half of one. `latest` is data: a name in it
that is not a plain directory name under `checkpoints/` is refused.

The trainer saves and resumes through this module; evaluation and export
read checkpoints through it too (`find_checkpoint`, `load_checkpoint`,
`checkpoint_target`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.drafts.spec import DraftSpec
from pipeline.storage import UnsafePath, path_under, write_text_atomic
from pipeline.storage.local import fsync_dir

CHECKPOINTS = "checkpoints"
LATEST = "latest"
STATE = "state.pt"
SPEC = "spec.json"
CONFIG = "config.yaml"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint directory, its spec and the training config it was written under."""

    path: Path
    spec: DraftSpec
    train_config: dict[str, Any]

    @property
    def run_dir(self) -> Path:
        return self.path.parent.parent

    @property
    def target(self) -> str:
        """The target the draft was trained against (`target` of its TrainConfig)."""
        return self.train_config["target"]

    @property
    def export_dir(self) -> Path:
        """Where the run exports its draft: `export.dir`, else <out_dir>/export."""
        return export_dir(self.run_dir, (self.train_config.get("export") or {}).get("dir"))

    def state(self, map_location: Any = "cpu") -> dict[str, Any]:
        """The whole `state.pt` (model, optimizer, scheduler, step, position)."""
        import torch

        return torch.load(self.path / STATE, map_location=map_location, weights_only=True)

    def model_state(self) -> dict[str, Any]:
        """The draft's tensors alone, on the CPU."""
        return self.state()["model"]


def export_dir(out_dir: str | Path, configured: str | None) -> Path:
    """The export directory of a run: the configured `export.dir`, else <out_dir>/export."""
    return Path(configured) if configured else Path(out_dir) / "export"


def save_checkpoint(
    out_dir: str | Path, step: int, state: dict[str, Any], spec_json: str, config_yaml: str
) -> Path:
    """Write checkpoints/step-N/ via a temporary directory, then move `latest`."""
    import torch

    root = Path(out_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".step-{step:08d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with open(tmp / STATE, "wb") as fh:
        torch.save(state, fh)
        _sync(fh)
    for name, text in ((SPEC, spec_json), (CONFIG, config_yaml)):
        with open(tmp / name, "w") as fh:
            fh.write(text)
            _sync(fh)
    fsync_dir(tmp)
    # A directory of this step that `latest` does not name (a run that died
    # before moving it) is moved aside, not deleted first: rename is atomic.
    old = root / f".step-{step:08d}.old"
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(root)
    write_text_atomic(root / LATEST, final.name)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _sync(fh) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest checkpoint of the run in `out_dir`; None before the first one.

    A `latest` pointer naming a directory without state.pt is an error, named."""
    pointer = Path(out_dir) / CHECKPOINTS / LATEST
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    if "/" in name:  # one directory of checkpoints/, never a path elsewhere
        raise UnsafePath(f"{pointer}: {name!r} is not a checkpoint directory name")
    path = path_under(pointer.parent, name, str(pointer))
    if not (path / STATE).exists():
        raise FileNotFoundError(f"{pointer} names {path}, which has no {STATE}")
    return path


def is_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return (path / SPEC).exists() and (path / STATE).exists()


def find_checkpoint(path: str | Path) -> Path | None:
    """A checkpoint directory for `path`: itself, or a run's checkpoints/latest (else None)."""
    path = Path(path)
    return path if is_checkpoint(path) else latest_checkpoint(path)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint at `path` (a checkpoint directory or a run directory)."""
    found = find_checkpoint(path)
    if found is None:
        raise FileNotFoundError(
            f"{path}: no checkpoint ({SPEC} + {STATE}, or {CHECKPOINTS}/{LATEST})"
        )
    return Checkpoint(
        path=found,
        spec=DraftSpec.from_json((found / SPEC).read_text()),
        train_config=yaml.safe_load((found / CONFIG).read_text()),
    )
