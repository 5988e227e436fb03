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


# Regeneration's two sides (pipeline/regenerate/__init__.py): a replica imports of the
# stage only the shared config and messages; the driver, of the replica, only the actor
# class its pool starts; the shared modules, nothing of the driver.
REGENERATE_SHARED = ("pipeline.regenerate.config", "pipeline.regenerate.units")


def _regenerate_offending(package: str, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    out = {}
    for module, names in _imports(package).items():
        stage = {n for n in names if n.startswith("pipeline.regenerate.")}
        bad = sorted(n for n in stage if not n.startswith(allowed))
        if bad:
            out[module] = bad
    return out


def test_the_replica_side_imports_only_the_shared_modules_of_the_stage():
    assert "regenerate/replica/actor.py" in _imports("regenerate/replica")
    allowed = ("pipeline.regenerate.replica.", *REGENERATE_SHARED)
    assert _regenerate_offending("regenerate/replica", allowed) == {}


def test_the_driver_side_imports_only_the_actor_of_the_replica_side():
    assert "regenerate/driver/pool.py" in _imports("regenerate/driver")
    allowed = (
        "pipeline.regenerate.driver.",
        "pipeline.regenerate.replica.actor",
        *REGENERATE_SHARED,
    )
    assert _regenerate_offending("regenerate/driver", allowed) == {}


def test_the_shared_modules_of_regeneration_import_nothing_of_the_driver():
    for name in REGENERATE_SHARED:
        path = name.removeprefix("pipeline.").replace(".", "/") + ".py"
        imports = _imports("regenerate")[path]
        assert not [n for n in imports if n.startswith("pipeline.regenerate.driver")], path


def test_the_file_format_imports_nothing_of_the_versioned_table():
    assert _imports("shards")
    assert _offending("shards", ("pipeline.table",)) == {}


def test_every_folder_of_modules_is_a_package_the_build_finds():
    """A folder without __init__.py imports (a namespace package) but is left out of a wheel."""
    from setuptools import find_packages

    found = set(find_packages(str(PIPELINE.parent), include=["pipeline*"]))
    folders = {
        ".".join(p.parent.relative_to(PIPELINE.parent).parts) for p in PIPELINE.rglob("*.py")
    }
    assert {"pipeline.shards", "pipeline.table"} <= folders
    assert sorted(folders - found) == []


def test_nothing_below_the_demo_imports_the_toy():
    """The toy wing sits on top: only the demo, the CLI and the toy itself import it."""
    above = ("demo/", "toy/", "cli/", "__main__.py")
    offenders = {
        module: sorted(n for n in names if n.startswith("pipeline.toy"))
        for module, names in _imports("").items()
        if not module.startswith(above) and any(n.startswith("pipeline.toy") for n in names)
    }
    assert offenders == {}


# The whole house, bottom floor first: a package imports only packages on lower
# floors (the ground floor's modules may import each other, without a circle).
FLOORS = [
    {"redact", "cache", "errors", "config", "logs", "torch_threads", "prefetch", "storage"},
    {"render", "corpus"},
    {"targets"},
    {"toy"},  # plugs its `toy:` scheme into targets/ through an entry point
    {"shards"},  # the file format
    {"table"},  # the versioned table of those files
    {"drafts"},
    {"regenerate"},
    {"train"},
    {"evaluate"},
    {"plan"},
    {"demo"},
    {"cli"},
    {"__main__"},
]


def _module_graph(root: Path = PIPELINE) -> dict[str, set[str]]:
    """pipeline module -> the pipeline modules it imports (lazy ones included)."""
    modules = {
        ".".join(("pipeline", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for p in root.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, names in _imports("", root).items():
        module = "pipeline." + name.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        targets = set()
        for n in names:
            while n and n not in modules:  # `pipeline.a.b.Name` -> `pipeline.a.b`
                n = n.rpartition(".")[0]
            if n and n != module and n != "pipeline":
                targets.add(n)
        graph[module] = targets
    return graph


def test_every_arrow_points_to_a_lower_floor():
    floor = {pkg: i for i, pkgs in enumerate(FLOORS) for pkg in pkgs}
    up = []
    for module, targets in _module_graph().items():
        src = module.split(".")[1]
        for target in targets:
            dst = target.split(".")[1]
            assert src in floor and dst in floor, f"{module} -> {target}: add it to FLOORS"
            if dst != src and (floor[dst] > floor[src] or (floor[dst] == floor[src] != 0)):
                up.append(f"{module} -> {target}")
    assert up == []


def test_no_circle_between_modules():
    graph = _module_graph()
    circles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(path[path.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert len(graph) > 100 and circles == []
