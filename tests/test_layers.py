"""The stages' import arrows point down: evaluate/ imports nothing of train/, and
drafts/ (below both) imports neither. Read from the source with ast, so lazy imports
inside functions and TYPE_CHECKING blocks count too."""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"


def _imports(package: str, root: Path = PIPELINE) -> dict[str, set[str]]:
    """module file (relative to `root`) -> the pipeline modules it imports."""
    found: dict[str, set[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[str(path.relative_to(root))] = {n for n in names if n.startswith("pipeline.")}
    return found


def _offending(
    package: str, forbidden: tuple[str, ...], root: Path = PIPELINE
) -> dict[str, list[str]]:
    return {
        module: sorted(n for n in names if n.startswith(forbidden))
        for module, names in _imports(package, root).items()
        if any(n.startswith(forbidden) for n in names)
    }


def test_evaluate_imports_nothing_of_train():
    assert _imports("evaluate")  # the walk found the package
    assert _offending("evaluate", ("pipeline.train",)) == {}


def test_drafts_imports_neither_train_nor_evaluate():
    assert "drafts/registry.py" in _imports("drafts")
    assert _offending("drafts", ("pipeline.train", "pipeline.evaluate")) == {}


def test_the_walk_sees_lazy_and_type_checking_imports(tmp_path):
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "m.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import pipeline.train.config\n"
        "def f():\n    from pipeline.train.data import TrainingData\n"
    )
    assert _offending("evaluate", ("pipeline.train",), tmp_path) == {
        "evaluate/m.py": [
            "pipeline.train.config",
            "pipeline.train.data",
            "pipeline.train.data.TrainingData",
        ]
    }
