"""No code path turns data into code: the package source is scanned (AST, not grep).

Refused anywhere in `pipeline/` and `schemas/`:

* `torch.load(...)` without `weights_only=True` (a checkpoint is data; the
  full unpickler runs whatever the file says);
* pickle and its relatives: importing `pickle`, `cPickle`, `cloudpickle`,
  `dill`, `marshal` or `shelve`, `pandas.read_pickle`, `numpy.load(...,
  allow_pickle=True)`, `yaml.load` / `yaml.unsafe_load` (PyYAML's full loader);
* `trust_remote_code=` with anything but `False` or a value read from a
  config (`<config>.trust_remote_code`): remote code runs only when the user's
  config says so.

(Ray moves task arguments with cloudpickle between the project's own
processes, and multiprocessing moves the replica's messages to and from its
own write-back process the same way; that is their transport, not a load of
stored data, and the project's code never calls pickle itself.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "schemas")
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve"}


def _name(node: ast.AST) -> str:
    """Dotted name of a call target: `torch.load`, `np.load`, `yaml.load`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def findings(source: str, where: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for name in names:
                if name.split(".")[0] in PICKLE_MODULES:
                    out.append(f"{line}: imports {name}")
        if not isinstance(node, ast.Call):
            continue
        func = _name(node.func)
        if func == "torch.load" or func.endswith(".torch.load"):
            if not _true(_kw(node, "weights_only")):
                out.append(f"{line}: torch.load without weights_only=True")
        if func.split(".")[-1] == "read_pickle":
            out.append(f"{line}: {func}")
        if func in ("np.load", "numpy.load") and _true(_kw(node, "allow_pickle")):
            out.append(f"{line}: {func}(allow_pickle=True)")
        if func in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all"):
            out.append(f"{line}: {func} (use yaml.safe_load)")
        trust = _kw(node, "trust_remote_code")
        if trust is not None:
            from_config = isinstance(trust, ast.Attribute) and trust.attr == "trust_remote_code"
            if not (isinstance(trust, ast.Constant) and trust.value is False) and not from_config:
                out.append(f"{line}: trust_remote_code={ast.unparse(trust)} not from a config")
    return out


def test_the_scanner_finds_each_kind():
    bad = "\n".join(
        [
            "import pickle",
            "from cloudpickle import loads",
            "torch.load(path)",
            "torch.load(path, weights_only=False)",
            "np.load(p, allow_pickle=True)",
            "yaml.load(text)",
            "pd.read_pickle(p)",
            "AutoModel.from_pretrained(d, trust_remote_code=True)",
            "LLM(model=d, trust_remote_code=flag)",
        ]
    )
    assert len(findings(bad, "bad.py")) == 9
    good = "\n".join(
        [
            "torch.load(path, map_location='cpu', weights_only=True)",
            "np.load(p)",
            "yaml.safe_load(text)",
            "AutoModel.from_pretrained(d, trust_remote_code=config.trust_remote_code)",
            "AutoModel.from_pretrained(d, trust_remote_code=False)",
        ]
    )
    assert findings(good, "good.py") == []


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_never_unpickles_or_runs_remote_code(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no source under {package}/"
    found = [f for path in files for f in findings(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], "\n".join(found)
