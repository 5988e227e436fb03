"""The model-reference scheme registry: the built-in GGUF door, the toy wing's
entry point, and one line for a reference nothing claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.targets import schemes
from pipeline.targets.resolve import check_model_ref, resolve_model
from pipeline.targets.schemes import ModelScheme, register, registered, scheme_of, unregister

ROOT = Path(__file__).resolve().parents[2]


def test_the_toy_scheme_comes_from_its_entry_point_and_gguf_is_built_in():
    names = {s.name for s in registered()}
    assert {"gguf", "toy"} <= names
    assert scheme_of("toy:random").name == "toy"
    assert scheme_of("model.gguf").name == "gguf"
    assert scheme_of("Qwen/Qwen3-8B") is None  # a hub name passes through
    assert resolve_model("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"


def test_an_unknown_scheme_or_toy_name_is_one_line():
    with pytest.raises(ValueError, match=r"unknown model scheme in 'foo:bar' \(prefixes: toy:\)"):
        check_model_ref("foo:bar")
    with pytest.raises(ValueError, match="unknown toy target 'toy:nope'; choose one of"):
        check_model_ref("toy:nope")
    check_model_ref("toy:random")  # a known one passes


def test_a_fresh_process_resolves_toy_references_without_importing_the_toy_first():
    """As a Ray actor does: nothing of pipeline.toy is imported until a scheme needs it."""
    code = (
        "import sys\n"
        "from pipeline.targets.schemes import scheme_of\n"
        "assert not [m for m in sys.modules if m.startswith('pipeline.toy')]\n"
        "print(scheme_of('toy:random').name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "toy"


def _test_scheme(built: Path) -> ModelScheme:
    return ModelScheme(
        "test-only",
        claims=lambda m: m.startswith("testonly:"),
        check=lambda m: None,
        build=lambda m, cache: built,
        prefix="testonly:",
    )


def test_a_registered_scheme_claims_its_references(tmp_path):
    register(_test_scheme(tmp_path / "model"))
    try:
        assert resolve_model("testonly:x") == str(tmp_path / "model")
        assert "testonly:" in str(pytest.raises(ValueError, check_model_ref, "foo:bar").value)
    finally:
        unregister("test-only")
    assert scheme_of("toy:random").name == "toy"  # the installed ones stay


def test_a_registration_before_the_first_look_up_hides_no_installed_scheme():
    """A program that registers its own scheme first still resolves `toy:` and GGUF."""
    code = (
        "from pathlib import Path\n"
        "from pipeline.targets.schemes import ModelScheme, register, registered\n"
        "register(ModelScheme('mine', lambda m: m.startswith('mine:'), print, "
        "lambda m, c: Path(m), 'mine:'))\n"
        "print(' '.join(s.name for s in registered()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["gguf", "toy", "mine"]


def test_without_installed_metadata_a_toy_reference_says_to_install(monkeypatch):
    """A checkout that was never installed has no entry points: `toy:` is refused in one
    line that says why, in the driver, rather than resolving there and failing in actors."""
    monkeypatch.setattr(schemes, "entry_points", lambda group: [])
    monkeypatch.setattr(schemes, "_installed", {})
    with pytest.raises(
        ValueError,
        match=r"^unknown model scheme in 'toy:tiny' \(no prefix "
        r"installed: install the package",
    ) as raised:
        check_model_ref("toy:tiny")
    assert "\n" not in str(raised.value)
    assert scheme_of("model.gguf").name == "gguf"  # the built-in door needs no metadata
