"""The documentation is complete inside the repository: every relative link resolves.

Links in README.md, docs/ and schemas/README.md must name a file (or folder) of this
repository, and an anchor must name a heading of the page it points to; so must
every `docs/<page>.md#anchor` pointer in code, configs and manifests.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "schemas/README.md", ROOT / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
POINTER = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings (outside code blocks)."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title)
            out.add(title.replace(" ", "-"))
    return out


def problems_of(page: Path) -> list[str]:
    problems = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not a link
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page):
    assert problems_of(page) == []


def test_the_link_check_catches_a_broken_link(tmp_path):
    page = ROOT / "docs" / "design.md"
    bad = tmp_path / "x.md"
    bad.write_text(f"[a]({page}#no-such-heading) [b](../../elsewhere/NOTES.md)\n")
    problems = problems_of(bad)
    assert any("no heading #no-such-heading" in p for p in problems)
    assert any("NOTES.md" in p for p in problems)


def test_design_pointers_in_code_and_configs_name_real_headings():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    seen = 0
    for name in files:
        path = ROOT / name
        if path.suffix not in (".py", ".md", ".yaml", ".yml", ".json", "") or not path.is_file():
            continue
        for page, anchor in POINTER.findall(path.read_text(errors="ignore")):
            seen += 1
            assert anchor in anchors(ROOT / "docs" / page), f"{name}: docs/{page}#{anchor}"
    assert seen >= 10  # the pointers that replaced references to a file outside the project


def tree_map_paths(readme: Path) -> list[str]:
    """The paths the README's map of the tree names (its "Where things live" block):
    a line's first column, names separated by one space; names indented by two sit in
    the folder of the last unindented line; deeper lines continue a description."""
    text = readme.read_text()
    block = text.split("## Where things live", 1)[1].split("```", 2)[1]
    paths, parent = [], ""
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent > 2:  # a description running on
            continue
        names = re.split(r"\s{2,}", line.strip())[0].split(" ")
        if indent:
            paths += [parent + n for n in names]
        else:
            paths += names
            parent = names[-1] if names[-1].endswith("/") else ""
    return paths


def test_every_path_the_readme_tree_map_names_exists():
    paths = tree_map_paths(ROOT / "README.md")
    assert len(paths) >= 20 and "pipeline/drafts/" in paths
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_nothing_points_outside_the_repository_for_its_design():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    outside = [
        name
        for name in files
        if not name.startswith("tests/")
        and (ROOT / name).is_file()
        and re.search(r"\.\./shared|DESIGN\.md", (ROOT / name).read_text(errors="ignore"))
    ]
    assert outside == []
