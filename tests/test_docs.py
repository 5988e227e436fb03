"""The documentation is complete inside the repository: every relative link resolves.

Links in README.md, docs/ and schemas/README.md must name a file (or folder) of this
repository, and an anchor must name a heading of the page it points to; so must
every `docs/<page>.md#anchor` pointer in code, configs and manifests. No tracked file
(docs, code, benches, tests, README, Makefile) cites a page or folder outside the
repository, and every docs/ page stays under MAX_DOC_LINES lines: it describes how the
system works now, and measurement history goes to bench/RESULTS.md; nor does any
tracked file but bench/RESULTS.md date a statement by the work step that made it.
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


def tracked_files() -> list[str]:
    return subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()


def test_design_pointers_in_code_and_configs_name_real_headings():
    seen = 0
    for name in tracked_files():
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


# Names of pages and folders that live outside the repository (written in pieces, so
# this file does not name them itself): no tracked file may cite them.
OUTSIDE_NAMES = ["STYLE" + ".md", "DESIGN" + ".md", "farm" + "-", "../" + "shared", "." + "library"]
MAX_DOC_LINES = 400


def tracked_text(name: str) -> str:
    """A tracked file's text; "" for a folder entry or a binary file (a NUL early on)."""
    path = ROOT / name
    data = path.read_bytes() if path.is_file() else b""
    return "" if b"\0" in data[:8192] else data.decode(errors="ignore")


def test_nothing_points_outside_the_repository_for_its_design():
    texts = {name: tracked_text(name) for name in tracked_files()}
    assert "tests/test_docs.py" in texts and "docs/design.md" in texts
    outside = [
        f"{name}: {needle}"
        for name, text in texts.items()
        for needle in OUTSIDE_NAMES
        if needle in text
    ]
    assert outside == []


def test_every_doc_page_is_under_the_line_limit():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) >= 5
    long = [
        f"{p.name}: {n} lines"
        for p in pages
        if (n := len(p.read_text().splitlines())) >= MAX_DOC_LINES
    ]
    assert long == [], f"split or trim these pages (history goes to bench/RESULTS.md): {long}"


# A work step's number ("stop" and a number) says when something changed, not what the system does.
WORK_STEP = re.compile(r"\b[Ss]tops? [0-9]")


def test_no_tracked_file_dates_its_statements_by_work_step():
    # bench/RESULTS.md is exempt: its sections are rewritten by the benches and its
    # History part records figures as measured at the time.
    dated = [
        f"{name}: {m.group(0)!r}"
        for name in tracked_files()
        if name != "bench/RESULTS.md"
        for m in WORK_STEP.finditer(tracked_text(name))
    ]
    assert dated == []
