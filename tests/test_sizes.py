"""No function in pipeline/ over 80 lines and no module over 400: an orchestrator reads
as a list of named steps, and a module holds one concept. Read from the source with
ast, so nested functions and methods count too."""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 400


def _function_lengths(path: Path) -> dict[str, int]:
    """`name` (dotted through classes and enclosing functions) -> lines, def to end."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return lengths


def _modules(root: Path = PIPELINE) -> list[Path]:
    return sorted(root.rglob("*.py"))


def long_functions(root: Path = PIPELINE) -> dict[str, int]:
    return {
        f"{path.relative_to(root)}:{name}": lines
        for path in _modules(root)
        for name, lines in _function_lengths(path).items()
        if lines > MAX_FUNCTION_LINES
    }


def long_files(root: Path = PIPELINE) -> dict[str, int]:
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in _modules(root)}
    return {name: lines for name, lines in sizes.items() if lines > MAX_FILE_LINES}


def test_no_function_over_80_lines():
    assert _modules()  # the walk found the package
    assert long_functions() == {}, (
        f"split these into named steps (at most {MAX_FUNCTION_LINES} lines)"
    )


def test_no_module_over_400_lines():
    assert long_files() == {}, f"split these along their concepts (at most {MAX_FILE_LINES} lines)"


def test_the_walk_counts_methods_and_nested_functions(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(
        f"class C:\n    def method(self):\n    {body.replace(chr(10) + '    ', chr(10) + '        ')}"
        f"def outer():\n    def inner():\n    {body.replace(chr(10) + '    ', chr(10) + '        ')}"
        "    return inner\n"
    )
    found = long_functions(tmp_path)
    assert set(found) == {"m.py:C.method", "m.py:outer", "m.py:outer.inner"}
    assert long_files(tmp_path) == {}
